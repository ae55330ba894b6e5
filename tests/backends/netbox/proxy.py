"""The fault proxy in front of NetBox moved to tools/netbox_proxy.py (the chaos runner uses it too); this name
stays for tests that import it from here."""

from tools.netbox_proxy import Event, Faults, NetboxProxy, Rule, self_signed

__all__ = ["Event", "Faults", "NetboxProxy", "Rule", "self_signed"]
