"""The API resources the controller reads and writes, the JSON object as it sends them, and its timestamp form."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

Object = dict[str, Any]
"""A JSON object as the API server or an external system sends it (and as we send it back)."""


def now_rfc3339() -> str:
    """Now, in the API's timestamp form (RFC 3339, seconds, UTC)."""
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Resource:
    """A REST resource: `group` is "" for the core API."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def typed(self, obj: Object) -> Object:
        """`obj`, given this resource's apiVersion and kind where it lacks them (as a list's items and a watch's do)."""
        obj.setdefault("apiVersion", self.api_version)
        obj.setdefault("kind", self.kind)
        return obj

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
            if subresource is not None:
                base += f"/{subresource}"
        return base


IPAM_GROUP = "ipam.cluster.x-k8s.io"
CLUSTER_GROUP = "cluster.x-k8s.io"

CLAIMS = Resource(IPAM_GROUP, "v1beta2", "ipaddressclaims", "IPAddressClaim", namespaced=True)
ADDRESSES = Resource(IPAM_GROUP, "v1beta2", "ipaddresses", "IPAddress", namespaced=True)
CLUSTERS = Resource(CLUSTER_GROUP, "v1beta2", "clusters", "Cluster", namespaced=True)
MACHINES = Resource(CLUSTER_GROUP, "v1beta2", "machines", "Machine", namespaced=True)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
SECRETS = Resource("", "v1", "secrets", "Secret", namespaced=True)
EVENTS = Resource("", "v1", "events", "Event", namespaced=True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
