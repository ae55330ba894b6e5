"""DNS names as NIOS keeps them, and the pseudo-view of IPAM-only host records.

Contract:

* :func:`normalise` answers a written host name or zone ``fqdn`` the way NIOS stores it: in lower case, without
  a trailing dot (NIOS lower-cases names on write; a search with ``=`` is case-sensitive, with ``:=`` it is not);
* :func:`check_dns_name` refuses a name with an empty label, a label longer than 63 characters, or more than 253
  characters in all (RFC 1035: 63 octets a label, 255 octets on the wire, which is 253 characters written out),
  with ``Invalid value for <field>: "<name>": <reason>`` (400 ``Client.Ibap.Proto``).  NIOS's own text for this
  refusal is not public; this shape is the simulator's choice;
* an IPAM-only host record (``configure_for_dns: false``) is kept in the pseudo-view :data:`IPAM_ONLY_VIEW`
  (a single space), so its reference ends in ``/%20`` and a search on ``view=default`` does not answer it; the
  DNS view given when it is written (``default`` when none is) must exist and chooses the network view of
  ``func:nextavailableip`` addresses given without one;
* :func:`missing_view` is the 404 a search or write naming a DNS view that does not exist gets
  (``View <name> not found``, the name stripped of surrounding blanks as NIOS reports it).
"""

from __future__ import annotations

from . import errors
from .store import ObjectStore, StoredObject

IPAM_ONLY_VIEW = " "
MAX_LABEL = 63
MAX_NAME = 253


def normalise(name: str) -> str:
    """A host name or zone as NIOS stores it: lower case, no trailing dot."""
    return name.rstrip(".").lower()


def check_dns_name(field_name: str, name: str) -> None:
    """Refuse a name that is not a DNS name by length (see the module contract)."""
    if not name:
        raise errors.invalid_value(field_name, name, "Must be a non-empty domain name")
    if len(name) > MAX_NAME:
        raise errors.invalid_value(field_name, name, f"A domain name must be at most {MAX_NAME} characters")
    if any(not 0 < len(label) <= MAX_LABEL for label in name.split(".")):
        raise errors.invalid_value(field_name, name, f"Each DNS label must be 1 to {MAX_LABEL} characters")


def missing_view(view: str) -> errors.WapiError:
    """404 for a DNS view that does not exist."""
    return errors.not_found(f"View {view.strip()} not found")


def is_ipam_only(host: StoredObject) -> bool:
    """Whether a stored host record is IPAM-only (kept in the blank pseudo-view)."""
    return bool(host.get("view") == IPAM_ONLY_VIEW)


def host_network_view(store: ObjectStore, host: StoredObject) -> str | None:
    """The network view of a host record: its DNS view's, or, for an IPAM-only record, its addresses'."""
    if not is_ipam_only(host):
        return store.dns_view_network_view(host.get("view"))
    for list_name in ("ipv4addrs", "ipv6addrs"):
        for entry in host.get(list_name) or []:
            return str(entry["network_view"])
    return None
