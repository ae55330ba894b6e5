"""Building blocks of the CRD generators (hack/gen_*crds.py): the schema of a spec model, the CRD envelope, the
writer. A spec model is the one source of its schema: its fields, and their OpenAPI metadata (backends/validation.py).

The generators are run as scripts (`python hack/gen_crds.py`), so this module is imported by its bare name.
Every CRD of the project is in Cluster API's IPAM group, in the `cluster-api` category, with one served and stored
version, and carries the labels clusterctl relies on (see LABELS and MOVE_LABELS below, and docs/clusterctl.md).
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from backends.validation import OpenAPI

GROUP = "ipam.cluster.x-k8s.io"
OUT = Path(__file__).resolve().parents[1] / "crds"
# crds/ is also a kustomization (config/crd builds it), under the one name `kubectl apply -f crds/` skips: it reads
# only .yaml, .yml and .json files.
KUSTOMIZATION = "Kustomization"

# The provider is `py` to clusterctl (`clusterctl init --ipam py:v0.2.0`), and clusterctl labels the components of
# an IPAM provider named `py` with `cluster.x-k8s.io/provider: ipam-py`. config/default gives every other object the
# same label. `clusterctl move` discovers only kinds whose CRD carries `clusterctl.cluster.x-k8s.io` (any value).
PROVIDER_LABEL = "cluster.x-k8s.io/provider"
PROVIDER = "ipam-py"
CLUSTERCTL_LABEL = "clusterctl.cluster.x-k8s.io"
LABELS = {PROVIDER_LABEL: PROVIDER, CLUSTERCTL_LABEL: ""}

# What `clusterctl move` does with a kind's objects, by the label on its CRD:
# - "hierarchy" (`clusterctl.cluster.x-k8s.io/move-hierarchy`): each object moves, with every object it owns;
# - "object" (`clusterctl.cluster.x-k8s.io/move`): each object moves, and only it;
# - "never" (no move label): an object moves only if it is in the owner chain of something that moves.
# A cluster-scoped object is copied to the target and left at the source, and clusterctl treats everything it owns
# the same way: that is why the cluster-scoped pools are "object", so that their IPAddresses move (and leave the
# source) with their claims.
Move = Literal["hierarchy", "object", "never"]
MOVE_LABELS: dict[Move, dict[str, str]] = {
    "hierarchy": {"clusterctl.cluster.x-k8s.io/move-hierarchy": ""},
    "object": {"clusterctl.cluster.x-k8s.io/move": ""},
    "never": {},
}
READY = '.status.conditions[?(@.type=="Ready")]'
Schema = dict[str, Any]


SCALARS = {str: "string", int: "integer", bool: "boolean"}
LENGTHS = {"string": "Length", "array": "Items", "object": "Properties"}


def model_schema(model: type[BaseModel]) -> Schema:
    """The OpenAPI schema of a pydantic model, as kubebuilder derives one from Go types: a property per field (by
    alias), typed by its annotation and given the keywords of its OpenAPI metadata and pydantic bounds; required
    are the fields pydantic requires and those marked `required`."""
    schema: Schema = {"type": "object", "properties": {}}
    required = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        schema["properties"][key] = field_schema(field)
        marks = [mark for mark in field.metadata if isinstance(mark, OpenAPI)]
        if field.is_required() or any(mark.required for mark in marks):
            required.append(key)
    if required:
        schema["required"] = required
    return merged(schema, getattr(model, "openapi", {}))


def field_schema(field: FieldInfo) -> Schema:
    schema = type_schema(field.annotation)
    for mark in field.metadata:
        if isinstance(mark, OpenAPI):
            schema = merged(schema, mark)
            if mark.defaulted:
                default = field.get_default(call_default_factory=True)
                schema["default"] = default.value if isinstance(default, Enum) else default
        elif isinstance(mark, annotated_types.Ge | annotated_types.Le):
            schema["minimum" if isinstance(mark, annotated_types.Ge) else "maximum"] = vars_of(mark)
        elif isinstance(mark, annotated_types.MinLen | annotated_types.MaxLen):
            prefix = "min" if isinstance(mark, annotated_types.MinLen) else "max"
            schema[prefix + LENGTHS[schema["type"]]] = vars_of(mark)
    return schema


def vars_of(mark: Any) -> Any:
    """The one value of a pydantic bound (annotated_types.Ge and its kin)."""
    (value,) = (getattr(mark, slot) for slot in mark.__slots__)
    return value


def type_schema(annotation: Any) -> Schema:
    """The OpenAPI schema of a field's type (None of an optional type dropped; Any: no type)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return merged(type_schema(args[0]), *(mark for mark in args[1:] if isinstance(mark, OpenAPI)))
    if origin in (Union, types.UnionType):
        (inner,) = (arg for arg in args if arg is not type(None))
        return type_schema(inner)
    if origin is list:
        return {"type": "array", "items": type_schema(args[0])}
    if origin is dict:
        values = type_schema(args[1])
        return {"type": "object", **({"additionalProperties": values} if values else {})}
    if origin is Literal:
        return {"type": "string", "enum": list(args)}
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return {"type": "string", "enum": [member.value for member in annotation]}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return model_schema(annotation)
    return {"type": SCALARS[annotation]} if annotation in SCALARS else {}


def merged(schema: Schema, *overlays: Mapping[str, Any]) -> Schema:
    """`schema` with each overlay's keywords, nested objects merged key by key."""
    result = dict(schema)
    for overlay in overlays:
        for key, value in overlay.items():
            if isinstance(value, Mapping):  # as a plain dict, merged into the schema's own when it has one
                value = merged(result.get(key) if isinstance(result.get(key), Mapping) else {}, value)
            result[key] = value
    return result


def string(description: str, max_length: int = 253, **extra: Any) -> Schema:
    return {"type": "string", "description": description, "maxLength": max_length, **extra}


def document(description: str, spec: Schema, status: Schema) -> Schema:
    """The openAPIV3Schema of a kind: `spec` (required) and `status` beside the envelope's fields."""
    return {
        "description": description,
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object."},
            "kind": {"type": "string", "description": "Kind of this object."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def conditions(description: str) -> Schema:
    """A list of metav1.Conditions keyed by type, as `status.conditions`."""
    return {
        "description": description,
        "type": "array",
        "maxItems": 32,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "description": "Condition is a metav1.Condition.",
            "required": ["type", "status", "reason", "lastTransitionTime"],
            "properties": {
                "type": string("type of the condition, in CamelCase.", 316),
                "status": {"type": "string", "enum": ["True", "False", "Unknown"], "description": "status."},
                "reason": string("reason for the last transition, in CamelCase.", 1024),
                "message": string("message for people: what is wrong and what to do.", 32768),
                "lastTransitionTime": {
                    "type": "string",
                    "format": "date-time",
                    "description": "lastTransitionTime is when the status last changed.",
                },
                "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
            },
        },
    }


def column(name: str, type: str, json_path: str, description: str | None = None) -> Schema:
    """One kubebuilder-style printer column."""
    entry: Schema = {"name": name, "type": type, "jsonPath": json_path}
    if description is not None:
        entry["description"] = description
    return entry


def ready_columns() -> list[Schema]:
    """The Ready and Reason columns of objects with a Ready condition."""
    return [
        column("Ready", "string", f"{READY}.status", "Whether the object can be used"),
        column("Reason", "string", f"{READY}.reason", "Why it is (not) ready"),
    ]


def age_column() -> Schema:
    return column("Age", "date", ".metadata.creationTimestamp")


def crd(
    *,
    kind: str,
    plural: str,
    scope: str,
    version: str,
    schema: Schema,
    columns: Sequence[Schema],
    move: Move,
    status_subresource: bool = True,
) -> Schema:
    """A CustomResourceDefinition of `kind` in GROUP with one served and stored version, labelled for clusterctl;
    `move` says what `clusterctl move` does with its objects (see MOVE_LABELS)."""
    metadata: Schema = {"name": f"{plural}.{GROUP}", "labels": {**LABELS, **MOVE_LABELS[move]}}
    served: Schema = {"name": version, "served": True, "storage": True}
    if status_subresource:
        served["subresources"] = {"status": {}}
    served["additionalPrinterColumns"] = list(columns)
    served["schema"] = {"openAPIV3Schema": schema}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": metadata,
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "categories": ["cluster-api"],
            },
            "scope": scope,
            "versions": [served],
        },
    }


class _NoAliasDumper(yaml.SafeDumper):
    """Writes shared sub-schemas out in full instead of as YAML anchors and aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def write(documents: Mapping[str, Schema], generator: str) -> None:
    """Write each document as `crds/<file name>`, headed by a do-not-edit line naming its generator, then
    crds/Kustomization listing every CRD file there (the generators share the directory)."""
    OUT.mkdir(exist_ok=True)
    for name, document in documents.items():
        body = yaml.dump(document, Dumper=_NoAliasDumper, sort_keys=False, width=120)
        (OUT / name).write_text(f"# Generated by {generator}; do not edit.\n---\n" + body)
    files = sorted(path.name for path in OUT.glob("*.yaml"))
    (OUT / KUSTOMIZATION).write_text(
        "# Generated by the CRD generators (hack/gen_*crds.py, `make generate`); do not edit.\n"
        "# crds/ as a kustomization, so that config/crd (and with it config/default) can build it: a\n"
        "# kustomization may name another kustomization's directory anywhere, but files only under its own.\n"
        "# Named `Kustomization` so that `kubectl apply -f crds/` (which reads .yaml, .yml and .json files only)\n"
        "# does not take it for an object.\n" + yaml.dump({"resources": files}, sort_keys=False)
    )
