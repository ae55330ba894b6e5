"""A REST resource and the core Kubernetes ones the controller reads and writes (the Cluster API ones:
`ipam_provider/api/capi.py`), the JSON object as it sends them, and its timestamp form."""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Any

from ipam_provider.runtime.kube.errors import ApiError

Object = dict[str, Any]
"""A JSON object as the API server or an external system sends it (and as we send it back)."""


def now_rfc3339() -> str:
    """Now, in the API's timestamp form (RFC 3339, seconds, UTC)."""
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""An RFC 1123 DNS subdomain (at most SUBDOMAIN_LENGTH characters): the names of most objects, as the CRD schemas
and client-go's validation write it."""
SUBDOMAIN_LENGTH = 253
LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""An RFC 1123 DNS label (at most LABEL_LENGTH characters): a namespace's name."""
LABEL_LENGTH = 63
_SUBDOMAIN = re.compile(SUBDOMAIN_PATTERN)
_LABEL = re.compile(LABEL_PATTERN)


class InvalidName(ApiError):
    """A name that may not go into a request path, refused before any request is sent (as client-go refuses it):
    an ApiError of status 400, reason Invalid, so that every caller handles it as the API server's own refusal."""

    def __init__(self, message: str) -> None:
        super().__init__(400, "Invalid", message)


def subdomain_problem(name: str) -> str | None:
    """Why `name` is not a DNS subdomain, or None."""
    if not name or len(name) > SUBDOMAIN_LENGTH or not _SUBDOMAIN.match(name):
        return f"{name[:80]!r} is not a DNS subdomain (lower-case letters, digits, '-' and '.', at most 253)"
    return None


def label_problem(name: str) -> str | None:
    """Why `name` is not a DNS label (a namespace's name), or None."""
    if not name or len(name) > LABEL_LENGTH or not _LABEL.match(name):
        return f"{name[:80]!r} is not a DNS label (lower-case letters, digits and '-', at most 63)"
    return None


def segment_problem(name: str) -> str | None:
    """Why `name` cannot be one segment of a request path, as client-go refuses it, or None."""
    if not name or name in (".", "..") or "/" in name or "%" in name:
        return f"{name[:80]!r} cannot be a path segment (empty, '.', '..', or holding '/' or '%')"
    return None


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
        """The request path; the one place a path is built. Raises InvalidName for a namespace that is not a DNS
        label, or a group, version, plural, name or subresource that is not a path segment."""
        segments = ["apis", self.group, self.version] if self.group else ["api", self.version]
        if self.namespaced and namespace is not None:
            if problem := label_problem(namespace):
                raise InvalidName(f"namespace {problem}")
            segments += ["namespaces", namespace]
        segments.append(self.plural)
        if name is not None:
            segments.append(name)
            if subresource is not None:
                segments.append(subresource)
        for segment in segments:
            if problem := segment_problem(segment):
                raise InvalidName(f"{self.kind}: {problem}")
        return "/" + "/".join(segments)


NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
SECRETS = Resource("", "v1", "secrets", "Secret", namespaced=True)
EVENTS = Resource("", "v1", "events", "Event", namespaced=True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
