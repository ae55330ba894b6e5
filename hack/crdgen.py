"""Building blocks of the CRD generators (hack/gen_*crds.py): schema helpers, the CRD envelope and the writer.

The generators are run as scripts (`python hack/gen_crds.py`), so this module is imported by its bare name.
Every CRD of the project is in Cluster API's IPAM group, in the `cluster-api` category, with one served and stored
version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

GROUP = "ipam.cluster.x-k8s.io"
OUT = Path(__file__).resolve().parents[1] / "crds"
READY = '.status.conditions[?(@.type=="Ready")]'
Schema = dict[str, Any]


def string(description: str, max_length: int = 253, **extra: Any) -> Schema:
    return {"type": "string", "description": description, "maxLength": max_length, **extra}


def integer(description: str, minimum: int, maximum: int | None = None) -> Schema:
    schema: Schema = {"type": "integer", "format": "int64", "description": description, "minimum": minimum}
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def rules(*pairs: tuple[str, str]) -> list[Schema]:
    """CEL rules as `x-kubernetes-validations` entries, from (rule, message) pairs."""
    return [{"rule": rule, "message": message} for rule, message in pairs]


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
                "observedGeneration": integer("observedGeneration is the generation the condition is about.", 0),
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
    labels: Mapping[str, str] | None = None,
    status_subresource: bool = True,
) -> Schema:
    """A CustomResourceDefinition of `kind` in GROUP with one served and stored version."""
    metadata: Schema = {"name": f"{plural}.{GROUP}"}
    if labels:
        metadata["labels"] = dict(labels)
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
    """Write each document as `crds/<file name>`, headed by a do-not-edit line naming its generator."""
    OUT.mkdir(exist_ok=True)
    for name, document in documents.items():
        body = yaml.dump(document, Dumper=_NoAliasDumper, sort_keys=False, width=120)
        (OUT / name).write_text(f"# Generated by {generator}; do not edit.\n---\n" + body)
