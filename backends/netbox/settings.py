"""Tunables of the NetBox backend. The defaults suit production; tests shorten the timers."""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.netbox.client import ClientSettings


@dataclass(frozen=True)
class NetboxSettings:
    client: ClientSettings = field(default_factory=ClientSettings)
    secret_seconds: float = 30.0  # how long a Secret, once read, is trusted
    ownership_seconds: float = 300.0  # how long the owner tag and UID field, once checked, are trusted
    full_skip_seconds: float = 30.0  # a source that answered 409 is asked last for this long
    unknown_retry_seconds: float = 2.0  # a claim whose POST had an unknown outcome is looked at again this soon
    uncertain_seconds: float = 120.0  # without a Unique UID field: no second POST this soon after an unknown outcome
    repair_page_size: int = 1000  # IP addresses per page of a repair listing (NetBox caps it at MAX_PAGE_SIZE)
