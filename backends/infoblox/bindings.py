"""Two things the pool check verifies beyond existence, because a grid refuses the pool's objects otherwise.

Contract:
- `restricted_attribute(pool, client)`: one paged search of the extensible-attribute definitions with their
  `allowed_object_types`. A definition with a non-empty list restricts its attribute to those object types (NIOS
  names them `FixedAddress`, `IPv6FixedAddress`, `HostRecord`; compared without regard to case), and the grid
  refuses any other object carrying it ("Extensible attribute 'X' is not allowed for this operation"). Every
  attribute this backend writes is checked for every object type it writes it on (`written_attributes`): the
  ownership attributes (CAPI-Cluster-Identity too, when defined) and the pool's own on the pool's object type,
  and CAPI-Pool also on the fixed address that reserves a gateway the grid hands out. The first refusal found
  gives `ExtensibleAttributeNotAllowed`, naming the attribute, the types it is restricted to, the types the pool
  writes it on, and what to change.
- `view_binding(...)`: a DNS view belongs to one network view, and a host record takes its addresses from the
  network view of its DNS view; a hostRecord pool whose DNS view belongs to another network view than the pool's
  gives `DNSViewNotInNetworkView`. An answer without the view's network view is not judged.
"""

from __future__ import annotations

from backends.infoblox.client import WapiClient
from backends.infoblox.payloads import FIXED_V4, FIXED_V6, HOST, object_type
from backends.infoblox.spec import EA_POOL, OPTIONAL_EAS, OWNERSHIP_EAS, Pool

NIOS_TYPE_NAMES = {FIXED_V4: "FixedAddress", FIXED_V6: "IPv6FixedAddress", HOST: "HostRecord"}
Verdict = tuple[bool, str, str]


def written_attributes(pool: Pool) -> dict[str, set[str]]:
    """Each extensible attribute the backend may write for this pool, with the WAPI object types it writes it on."""
    obj_type = object_type(pool)
    written = {name: {obj_type} for name in (*OWNERSHIP_EAS, *OPTIONAL_EAS, *pool.spec.extensible_attributes)}
    if any(target.gateway is not None for target in pool.targets):
        written[EA_POOL].add(FIXED_V4 if pool.version == 4 else FIXED_V6)
    return written


async def restricted_attribute(pool: Pool, client: WapiClient) -> Verdict | None:
    """`ExtensibleAttributeNotAllowed` for the first attribute the grid would refuse on one of the pool's objects."""
    definitions = await client.search("extensibleattributedef", ["name", "allowed_object_types"], paging=True)
    restricted = {
        str(definition.get("name")): [str(kind) for kind in allowed]
        for definition in definitions
        if isinstance(allowed := definition.get("allowed_object_types"), list) and allowed
    }
    for name, types in sorted(written_attributes(pool).items()):
        allowed = restricted.get(name)
        if not allowed:
            continue
        lowered = {kind.lower() for kind in allowed}
        refused = sorted(NIOS_TYPE_NAMES[t] for t in types if NIOS_TYPE_NAMES[t].lower() not in lowered)
        if not refused:
            continue
        own = " or remove it from spec.extensibleAttributes," if name in pool.spec.extensible_attributes else ""
        return (
            False,
            "ExtensibleAttributeNotAllowed",
            (
                f"the grid's definition of extensible attribute {name} allows it only on {', '.join(allowed)} "
                f"(allowed_object_types), but this pool writes it on {', '.join(refused)} objects, which the grid "
                f"refuses; add {' and '.join(refused)} to the definition's allowed object types in Grid Manager "
                f"(Administration > Extensible Attributes),{own} or clear the restriction"
            ),
        )
    return None


def view_binding(view: str, bound: object, network_view: str, field: str) -> Verdict | None:
    """`DNSViewNotInNetworkView` when DNS view `view`, which belongs to network view `bound`, is not in the pool's
    network view."""
    if not isinstance(bound, str) or not bound or bound == network_view:
        return None
    own_view = "default" if network_view == "default" else f"default.{network_view}"
    return (
        False,
        "DNSViewNotInNetworkView",
        (
            f"DNS view {view!r} belongs to network view {bound!r}, not to the pool's network view {network_view!r}, "
            f"and a host record takes its addresses from its DNS view's network view; set {field} to a DNS view "
            f"of network view {network_view!r} (such as {own_view!r}, which NIOS creates with it), or fix "
            "spec.networkView"
        ),
    )
