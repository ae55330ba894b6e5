"""The management cluster's identity: what the NetBox and Infoblox backends stamp on the objects they make, so that
several management clusters can share one NetBox or grid without one's repair loop releasing another's addresses.

Contract:
- The identity is the uid of the `kube-system` Namespace of the cluster the controller runs against (it never
  changes for the life of that cluster), read once at start, or the `--cluster-identity` flag's value when given
  (for a controller that cannot read kube-system, or to keep the identity of a cluster that was rebuilt).
- It is not a secret: it appears in logs, Events and on the external objects.
- A kube-system Namespace that cannot be read (forbidden, or absent) stops the start with a message naming the
  flag: a controller without an identity could not tell its objects from another cluster's.
"""

from __future__ import annotations

import structlog

from ipam_provider.kube.client import KubeClient
from ipam_provider.kube.errors import ApiError
from ipam_provider.kube.resources import NAMESPACES

log = structlog.get_logger(__name__)

IDENTITY_NAMESPACE = "kube-system"


class ClusterIdentityError(Exception):
    """The management cluster's identity could not be found; the message says what to do."""


async def cluster_identity(kube: KubeClient, override: str = "") -> str:
    """`override` when not blank, else the uid of the kube-system Namespace (one GET). Raises ClusterIdentityError
    when that Namespace cannot be read or has no uid; other API failures propagate."""
    if override.strip():
        log.info("management cluster identity from --cluster-identity", cluster_identity=override.strip())
        return override.strip()
    try:
        namespace = await kube.get(NAMESPACES, IDENTITY_NAMESPACE)
    except ApiError as error:
        if error.status not in (401, 403):
            raise
        raise ClusterIdentityError(
            f"cannot read Namespace {IDENTITY_NAMESPACE} (HTTP {error.status}), whose uid names this management "
            "cluster on the objects NetBox and Infoblox pools make; grant get on it (config/rbac) or set "
            "--cluster-identity"
        ) from error
    uid = str(((namespace or {}).get("metadata") or {}).get("uid") or "")
    if not uid:
        raise ClusterIdentityError(
            f"Namespace {IDENTITY_NAMESPACE} does not exist, and its uid names this management cluster on the "
            "objects NetBox and Infoblox pools make; set --cluster-identity"
        )
    log.info("management cluster identity", cluster_identity=uid, source=f"Namespace {IDENTITY_NAMESPACE}")
    return uid
