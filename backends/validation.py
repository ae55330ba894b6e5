"""How the backends refuse a pool's spec (`PoolSpecError`, the message of a spec their pydantic models refuse), and
how their spec models carry their CRD schemas (`OpenAPI`)."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ipam_provider.api.capi import Model
from ipam_provider.common import Object
from ipam_provider.runtime.kube.resources import LABEL_LENGTH, LABEL_PATTERN, SUBDOMAIN_LENGTH, SUBDOMAIN_PATTERN

M = TypeVar("M", bound=BaseModel)


class PoolSpecError(ValueError):
    """A pool spec its backend refuses: `messages`, every problem found, each saying what to fix and naming the
    field, joined by `; ` in `str(error)`."""

    def __init__(self, *messages: str) -> None:
        if not messages:
            raise ValueError("PoolSpecError needs at least one message")
        self.messages = messages
        super().__init__("; ".join(messages))


def spec_error(error: ValidationError) -> str:
    """The first problem pydantic found in a spec, as `spec.<field path>: <message>` (the path in the model's
    field names or aliases, as pydantic reports them)."""
    first = error.errors()[0]
    return f"spec.{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"


def parse_spec(model: type[M], pool: Object) -> M:
    """The pool's `spec` as `model`; PoolSpecError names the first problem (see `spec_error`)."""
    try:
        return model.model_validate(pool.get("spec") or {})
    except ValidationError as error:
        raise PoolSpecError(spec_error(error)) from error


class Spec(Model):
    """Base of the spec models: a field's docstring is its description in the CRD."""

    model_config = ConfigDict(use_attribute_docstrings=True)


class OpenAPI(dict[str, Any]):
    """OpenAPI keywords of a spec field in its CRD (kubebuilder markers, as `Annotated` metadata or a model's
    `openapi` class variable): its `description`, CEL rules (`validations`, as `x-kubernetes-validations`;
    `list_type` likewise), bounds, patterns. Never checked by the model: parsing stays as lenient as
    the model's types. `required` marks a field the CRD requires though the model defaults it; `defaulted` gives the
    CRD the model's default. hack/gen_crds.py reads them."""

    def __init__(
        self,
        description: str | None = None,
        *,
        validations: list[dict[str, str]] | None = None,
        list_type: str | None = None,
        required: bool = False,
        defaulted: bool = False,
        **keywords: Any,
    ) -> None:
        super().__init__({"description": description} if description is not None else {})
        self.update(keywords)
        named = {"validations": validations, "list-type": list_type}
        self.update({f"x-kubernetes-{key}": value for key, value in named.items() if value is not None})
        self.required = required
        self.defaulted = defaulted


def rules(*entries: tuple[str, str] | tuple[str, str, str]) -> list[dict[str, str]]:
    """CEL rules as `x-kubernetes-validations` entries, from (rule, message) or (rule, message, fieldPath) tuples; a
    `fieldPath` (relative to the object the rule is on, e.g. `.addresses`) is the field a refusal names."""
    return [dict(zip(("rule", "message", "fieldPath"), entry, strict=False)) for entry in entries]


# A field naming an object: a DNS subdomain, as the controller checks every name before it puts it into a request
# path (ipam_provider/runtime/kube/resources.py), so that a bad name is refused at admission; a namespace: a label.
OBJECT_NAME = OpenAPI(maxLength=SUBDOMAIN_LENGTH, pattern=SUBDOMAIN_PATTERN)
NAMESPACE_NAME = OpenAPI(maxLength=LABEL_LENGTH, pattern=LABEL_PATTERN)
ObjectName = Annotated[str, OBJECT_NAME]
NamespaceName = Annotated[str, NAMESPACE_NAME]


class NamedSecret(Spec):
    """A Secret by name; the kinds add its namespace."""

    name: ObjectName
    """name of the Secret."""
