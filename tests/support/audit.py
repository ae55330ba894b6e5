"""The requests one user made, read from kube-apiserver's audit log (tools/controlplane: `LocalControlPlane(...,
audit=True)` or `dedicated_control_plane(audit=True)`; Metadata level, JSON lines).

`AuditLog(path).requests(user, since)` returns that user's finished requests received at or after `since` (take it
with `AuditLog.now()` before the test acts), each an `AuditedRequest`: verb, URI, the object it named (namespace,
group, resource, subresource, name), status and user agent. In blocking mode (tools/controlplane's choice) a request
waits until its event is written, so a request that has finished is in the log.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class AuditedRequest:
    """One request as the audit log records it (ResponseComplete stage, Metadata level)."""

    verb: str
    uri: str
    user: str
    user_agent: str
    namespace: str
    api_group: str
    resource: str
    subresource: str
    name: str
    code: int
    received: datetime

    def __str__(self) -> str:
        return f"{self.verb} {self.uri} -> {self.code}"

    def in_namespace(self, namespace: str) -> bool:
        """Whether the request named `namespace`: as its object's namespace, the Namespace itself, or in its path."""
        named = self.resource == "namespaces" and self.name == namespace
        return self.namespace == namespace or named or f"/namespaces/{namespace}/" in f"{self.uri.split('?')[0]}/"


class AuditLog:
    """kube-apiserver's audit log file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @staticmethod
    def now() -> datetime:
        return datetime.now(UTC)

    def requests(self, user: str, since: datetime, until: datetime | None = None) -> list[AuditedRequest]:
        """`user`'s finished requests received in [since, until] (until: now), in the log's order."""
        if not self.path.is_file():
            raise AssertionError(f"no audit log at {self.path}: start the control plane with audit=True")
        found = []
        for event in _events(self.path.read_text().splitlines()):
            if event.get("stage") not in ("ResponseComplete", "Panic"):
                continue
            if (event.get("user") or {}).get("username") != user:
                continue
            request = _request(event)
            if request.received >= since and (until is None or request.received <= until):
                found.append(request)
        return found


def _events(lines: Iterable[str]) -> Iterable[dict[str, Any]]:
    for line in lines:
        if line.strip():
            try:
                yield json.loads(line)
            except json.JSONDecodeError:  # the last line, being written
                continue


def _request(event: dict[str, Any]) -> AuditedRequest:
    ref = event.get("objectRef") or {}
    return AuditedRequest(
        verb=str(event.get("verb", "")),
        uri=str(event.get("requestURI", "")),
        user=str((event.get("user") or {}).get("username", "")),
        user_agent=str(event.get("userAgent", "")),
        namespace=str(ref.get("namespace", "")),
        api_group=str(ref.get("apiGroup", "")),
        resource=str(ref.get("resource", "")),
        subresource=str(ref.get("subresource", "")),
        name=str(ref.get("name", "")),
        code=int((event.get("responseStatus") or {}).get("code") or 0),
        received=datetime.fromisoformat(str(event["requestReceivedTimestamp"]).replace("Z", "+00:00")),
    )
