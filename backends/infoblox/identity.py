"""Which management cluster made a grid object: the optional CAPI-Cluster-Identity extensible attribute.

Contract:
- `ClusterStamp.marks(connection)` is what every object this backend creates or re-keys carries besides its other
  attributes: `{CAPI-Cluster-Identity: <identity>}` when the backend knows its management cluster's identity and
  the grid defines the attribute (as the connection's last grid check found), else nothing (writing an undefined
  attribute would make NIOS refuse the object).
- `ClusterStamp.judge(obj)` says how the repair loop may treat one of our objects: OURS (stamped with our identity:
  a holding that may be released), UNSTAMPED (no identity: made before identities were stamped, or while the grid
  did not define the attribute; listed, never released), or OTHER (another management cluster's: not listed at
  all). A backend without an identity (tests of a single cluster) judges every object OURS.
- `advisory` is the pool's `ClusterIdentityStamped` condition: False (`ExtensibleAttributeMissing`, the pool stays
  Ready) while the grid does not define the attribute, saying that leaks are then only reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from backends.infoblox.connections import Connection
from backends.infoblox.payloads import GridObject
from backends.infoblox.spec import EA_CLUSTER_IDENTITY
from ipam_provider.backend.contract import ReportCondition


class Made(Enum):
    OURS = "ours"
    UNSTAMPED = "unstamped"
    OTHER = "other"


WHY_UNSTAMPED = (
    f"it carries no {EA_CLUSTER_IDENTITY} extensible attribute, so it may belong to another management cluster "
    "sharing this grid (objects made before identities were stamped, or while the grid did not define the attribute)"
)


def identity_defined(connection: Connection) -> bool:
    """Whether the connection's last grid check found the CAPI-Cluster-Identity definition."""
    health = connection.health
    return health is not None and EA_CLUSTER_IDENTITY in health.ea_names


@dataclass(frozen=True)
class ClusterStamp:
    identity: str  # "" when unknown

    def marks(self, connection: Connection) -> Mapping[str, str]:
        if self.identity and identity_defined(connection):
            return {EA_CLUSTER_IDENTITY: self.identity}
        return {}

    def judge(self, obj: GridObject) -> Made:
        if not self.identity:
            return Made.OURS
        stamped = obj.extattrs.get(EA_CLUSTER_IDENTITY) or ""
        if stamped == self.identity:
            return Made.OURS
        return Made.UNSTAMPED if not stamped else Made.OTHER


CONDITION = "ClusterIdentityStamped"


def advisory(stamp: ClusterStamp, connection: Connection) -> ReportCondition | None:
    """The pool's ClusterIdentityStamped condition (None when the backend knows no identity): True when new objects
    carry this management cluster's identity; False (advisory: the pool still works) when the grid does not define
    CAPI-Cluster-Identity, and the repair loop then only reports leaks."""
    if not stamp.identity:
        return None
    if identity_defined(connection):
        message = f"new grid objects carry {EA_CLUSTER_IDENTITY}={stamp.identity} (this management cluster)"
        return ReportCondition(CONDITION, True, "Stamped", message)
    message = (
        f"the grid has no {EA_CLUSTER_IDENTITY} extensible attribute definition: grid objects are not stamped with "
        f"this management cluster's identity ({stamp.identity}), so the repair loop only reports their leaks and "
        "never releases them; define it (STRING) in Grid Manager, or let the provider's API user create extensible "
        "attribute definitions"
    )
    return ReportCondition(CONDITION, False, "ExtensibleAttributeMissing", message)
