"""The InfobloxInstances' `Ready` condition.

Contract:
- `remember(name, instance)` keeps the InfobloxInstance as last read; `publish` writes its `Ready` condition
  (status subresource) only when the condition changes, and keeps the object the API server answers.
- An instance never read cannot be written to: `publish` does nothing for it. A failed write is logged, never
  raised: the condition is written again with the next change.
"""

from __future__ import annotations

import structlog
from pydantic import ValidationError

from backends.infoblox.spec import INSTANCES
from ipam_provider.api.meta import Condition, set_condition
from ipam_provider.common import Object
from ipam_provider.kube.client import KubeClient
from ipam_provider.kube.errors import ApiError

log = structlog.get_logger(__name__)


class InstanceStatus:
    """The status of every InfobloxInstance this process talks to."""

    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube
        self._instances: dict[str, Object] = {}

    def remember(self, name: str, instance: Object) -> None:
        """The InfobloxInstance `name` as just read."""
        self._instances[name] = instance

    async def publish(self, name: str, ready: bool, reason: str, message: str) -> None:
        """Write the instance's Ready condition if it changed."""
        instance = self._instances.get(name)
        if instance is None:
            return
        status = instance.get("status") or {}
        try:
            current = [Condition.model_validate(c) for c in status.get("conditions") or []]
        except ValidationError:
            current = []
        generation = instance["metadata"].get("generation")
        conditions, changed = set_condition(
            current, type="Ready", status=ready, reason=reason, message=message, generation=generation
        )
        if not changed:
            return
        patch = {"status": {"conditions": [c.wire() for c in conditions]}}
        try:
            self._instances[name] = await self._kube.patch(INSTANCES, name, patch, subresource="status")
        except ApiError as error:
            log.warning("cannot write the InfobloxInstance status", instance=name, error=error.message)
            return
        log.info("instance condition changed", instance=name, ready=ready, reason=reason, message=message)
