"""Building blocks of the CRD generators (hack/gen_*crds.py): schema helpers, the CRD envelope and the writer.

The generators are run as scripts (`python hack/gen_crds.py`), so this module is imported by its bare name.
Every CRD of the project is in Cluster API's IPAM group, in the `cluster-api` category, with one served and stored
version, and carries the labels clusterctl relies on (see LABELS and MOVE_LABELS below, and docs/clusterctl.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from ipam_provider.runtime.kube.resources import LABEL_LENGTH, LABEL_PATTERN, SUBDOMAIN_LENGTH, SUBDOMAIN_PATTERN

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


def string(description: str, max_length: int = 253, **extra: Any) -> Schema:
    return {"type": "string", "description": description, "maxLength": max_length, **extra}


def object_name(description: str) -> Schema:
    """A field naming an object: a DNS subdomain, as the controller checks every name before it puts it into a
    request path (ipam_provider/runtime/kube/resources.py), so that a bad name is refused at admission."""
    return string(description, SUBDOMAIN_LENGTH, pattern=SUBDOMAIN_PATTERN)


def namespace_name(description: str) -> Schema:
    """A field naming a namespace: a DNS label (see `object_name`)."""
    return string(description, LABEL_LENGTH, pattern=LABEL_PATTERN)


def integer(description: str, minimum: int, maximum: int | None = None) -> Schema:
    schema: Schema = {"type": "integer", "format": "int64", "description": description, "minimum": minimum}
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def rules(*entries: tuple[str, str] | tuple[str, str, str]) -> list[Schema]:
    """CEL rules as `x-kubernetes-validations` entries, from (rule, message) or (rule, message, fieldPath) tuples.
    A `fieldPath` (relative to the object the rule is on, e.g. `.addresses`) is the field the API server's refusal
    names instead of that object."""
    return [rule(*entry) for entry in entries]


def rule(text: str, message: str, field_path: str | None = None) -> Schema:
    """One CEL rule (see `rules`)."""
    entry: Schema = {"rule": text, "message": message}
    if field_path is not None:
        entry["fieldPath"] = field_path
    return entry


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
