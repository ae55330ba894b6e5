"""Kubernetes Events for the objects the controller acts on (core/v1 Events, shown by `kubectl describe`)."""

from __future__ import annotations

import secrets
from typing import Any

import structlog

from ipam_provider.api.meta import now_rfc3339
from ipam_provider.kube.client import KubeClient
from ipam_provider.kube.errors import ApiError
from ipam_provider.kube.resources import EVENTS

log = structlog.get_logger(__name__)
NORMAL = "Normal"
WARNING = "Warning"


class EventRecorder:
    """Records Events; a failure to record is logged, never raised."""

    def __init__(self, kube: KubeClient, component: str) -> None:
        self.kube = kube
        self.component = component

    async def record(self, obj: dict[str, Any], type: str, reason: str, message: str) -> None:
        meta = obj.get("metadata", {})
        namespace = meta.get("namespace") or "default"
        now = now_rfc3339()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta.get('name', 'object')}.{secrets.token_hex(8)}",
                "namespace": namespace,
            },
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.kube.create(EVENTS, event, namespace)
        except ApiError as error:
            log.warning("event not recorded", reason=reason, error=error.message)
