"""Object metadata and standard conditions (metav1.Condition), as pydantic models."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ipam_provider.runtime.kube.resources import now_rfc3339


class Model(BaseModel):
    """Base for API shapes: camelCase on the wire, unknown fields kept."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class OwnerReference(Model):
    api_version: str = Field(alias="apiVersion")
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = Field(default=None, alias="blockOwnerDeletion")


class ObjectMeta(Model):
    name: str
    namespace: str | None = None
    uid: str = ""
    resource_version: str = Field(default="", alias="resourceVersion")
    generation: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)
    owner_references: list[OwnerReference] = Field(default_factory=list, alias="ownerReferences")
    deletion_timestamp: str | None = Field(default=None, alias="deletionTimestamp")

    @property
    def deleting(self) -> bool:
        return self.deletion_timestamp is not None


class Condition(Model):
    type: str
    status: str
    reason: str
    message: str = ""
    last_transition_time: str = Field(alias="lastTransitionTime")
    observed_generation: int | None = Field(default=None, alias="observedGeneration")


def set_condition(
    conditions: Sequence[Condition], type: str, status: bool, reason: str, message: str, generation: int | None
) -> tuple[list[Condition], bool]:
    """The conditions with `type` set (its transition time moves when its status flips), and whether they changed."""
    wanted = "True" if status else "False"
    previous = find_condition(conditions, type)
    transition = previous.last_transition_time if previous is not None and previous.status == wanted else now_rfc3339()
    updated = Condition(
        type=type,
        status=wanted,
        reason=reason,
        message=message,
        last_transition_time=transition,
        observed_generation=generation,
    )
    if previous is None:
        return [*conditions, updated], True
    return [updated if c.type == type else c for c in conditions], updated.wire() != previous.wire()


def find_condition(conditions: Sequence[Condition], type: str) -> Condition | None:
    return next((c for c in conditions if c.type == type), None)
