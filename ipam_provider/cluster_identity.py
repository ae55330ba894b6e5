"""The management cluster's identity (not a secret), stamped by the NetBox and Infoblox backends on what they make,
so that management clusters sharing one IPAM never release each other's addresses: `--cluster-identity` when given,
else the uid of the `kube-system` Namespace. The controller does not serve without it.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import NAMESPACES

log = structlog.get_logger(__name__)

IDENTITY_NAMESPACE = "kube-system"
FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 30.0


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
        how = "refused" if error.status == 401 else "forbidden"
        raise ClusterIdentityError(
            f"cannot read Namespace {IDENTITY_NAMESPACE} ({how}: HTTP {error.status}), whose uid names this management "
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


async def wait_for_identity(kube: KubeClient, override: str, stopping: asyncio.Event) -> str | None:
    """The identity (see `cluster_identity`), asked for again after each failure; None once `stopping` is set."""
    delay = FIRST_RETRY_SECONDS
    while not stopping.is_set():
        try:
            return await cluster_identity(kube, override)
        except ClusterIdentityError as error:
            log.error(str(error), retry_in=delay)
        except Exception as error:  # the API server cannot be used now: as the informers, try again later
            log.warning("cannot read the management cluster identity; trying again", error=str(error), retry_in=delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), delay)
        delay = min(delay * 2, MAX_RETRY_SECONDS)
    return None
