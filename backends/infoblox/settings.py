"""Tunables of the Infoblox backend. The defaults suit production; tests shorten the timers."""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.infoblox.client import RetryPolicy
from backends.infoblox.hostname import OwnerBounds


@dataclass(frozen=True)
class InfobloxSettings:
    # How long an InfobloxInstance, its Secrets and a pool's Namespace labels, once read, are trusted (a 401 forces a
    # fresh read at once).
    instance_cache_seconds: float = 5.0
    # A connection no pool asked for this long is closed and its files removed (its instance or pools went).
    idle_connection_seconds: float = 600.0
    # How long a grid check (reachability, TLS, credentials, views, networks) is trusted, when it passed / failed.
    healthy_recheck_seconds: float = 300.0
    unhealthy_recheck_seconds: float = 10.0
    # Refused credentials (HTTP 401) are asked again after unhealthy_recheck_seconds, doubling up to this.
    auth_failed_max_recheck_seconds: float = 300.0
    # How often the per-pool index of owned grid objects is rebuilt by an extensible-attribute search.
    index_resync_seconds: float = 600.0
    # A full subnet is asked last for this long, unless this controller released an address of the pool meanwhile.
    exhausted_skip_seconds: float = 30.0
    # Backoff for 503 answers and lost or timed-out requests.
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # POST attempts per allocation when the grid answers 503 or the outcome is unknown.
    create_attempts: int = 5
    # When a claim that failed with PoolNotReady is looked at again (None: the reconciler's default).
    not_ready_retry_seconds: float | None = None
    # Objects per page of the repair loop's paged listing of a pool's holdings (WAPI `_max_results`).
    repair_page_size: int = 1000
    # How deep, in how many reads and for how long the Machine that owns a claim is looked for.
    owners: OwnerBounds = field(default_factory=OwnerBounds)
