"""Generate every CRD of the project under crds/ (`make generate`; the output is committed).

A spec schema is its pydantic model's (backends/*/spec.py, backends/incluster/prefix_spec.py, with the OpenAPI
metadata of backends/validation.py), derived as kubebuilder derives one from Go types. Every CRD is in Cluster API's
IPAM group, in the `cluster-api` category, with one served and stored version, and carries the labels clusterctl
relies on (docs/clusterctl.md). The in-cluster kinds are wire-compatible with the Go in-cluster provider's v1alpha2
API; the NetBox and Infoblox kinds (v1alpha1) are this project's own.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from backends.incluster.prefix_spec import PrefixPoolSpec
from backends.incluster.spec import InClusterPoolSpec
from backends.infoblox import spec as infoblox
from backends.netbox import spec as netbox
from backends.validation import OpenAPI

GROUP = "ipam.cluster.x-k8s.io"
OUT = Path(__file__).resolve().parents[1] / "crds"
# crds/ is also a kustomization (config/crd builds it), under the one name `kubectl apply -f crds/` skips: it reads
# only .yaml, .yml and .json files.
KUSTOMIZATION = "Kustomization"

# clusterctl labels the components of the IPAM provider `py` with `cluster.x-k8s.io/provider: ipam-py`, and
# `clusterctl move` discovers only kinds whose CRD carries `clusterctl.cluster.x-k8s.io` (any value).
LABELS = {"cluster.x-k8s.io/provider": "ipam-py", "clusterctl.cluster.x-k8s.io": ""}

# What `clusterctl move` does with a kind's objects, by the label on its CRD:
# - "hierarchy": each object moves, with every object it owns;
# - "object": each object moves, and only it;
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
INT64 = {"type": "integer", "format": "int64"}


def model_schema(model: type[BaseModel]) -> Schema:
    """The OpenAPI schema of a pydantic model: a property per field (by alias), typed by its annotation and given the
    keywords of its OpenAPI metadata and pydantic bounds; required are the fields pydantic requires and those marked
    `required`."""
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
    if field.description:
        schema["description"] = " ".join(field.description.split())
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
                own = result.get(key)
                value = merged(own if isinstance(own, dict) else {}, value)
            result[key] = value
    return result


def string(description: str, max_length: int = 253) -> Schema:
    return {"type": "string", "description": description, "maxLength": max_length}


def counts(description: str, count: Schema = INT64, required: Sequence[str] = (), **fields: str) -> Schema:
    """`status.ipAddresses`: an object of counts, each field's description given by keyword."""
    schema: Schema = {"description": description, "type": "object"}
    if required:
        schema["required"] = list(required)
    schema["properties"] = {name: {**count, "description": text} for name, text in fields.items()}
    return schema


def status(description: str, conditions_description: str, **properties: Schema) -> Schema:
    """A status object: `properties`, then the Ready condition list."""
    return {
        "description": description,
        "type": "object",
        "properties": {**properties, "conditions": conditions(conditions_description)},
    }


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


def count_columns(total: str, free: str, used: str) -> list[Schema]:
    """The Total, Free and Used columns of `status.ipAddresses`, with these descriptions."""
    texts = {"Total": total, "Free": free, "Used": used}
    return [column(name, "integer", f".status.ipAddresses.{name.lower()}", text) for name, text in texts.items()]


READY_COLUMNS = [
    column("Ready", "string", f"{READY}.status", "Whether the object can be used"),
    column("Reason", "string", f"{READY}.reason", "Why it is (not) ready"),
]
AGE_COLUMN = column("Age", "date", ".metadata.creationTimestamp")


def crd(
    kind: str,
    scope: str,
    version: str,
    schema: Schema,
    columns: Sequence[Schema],
    *,
    move: Move | None = None,
) -> Schema:
    """A CustomResourceDefinition of `kind` in GROUP with one served and stored version, labelled for clusterctl, with
    the status subresource when `schema` has a status; `move` (see MOVE_LABELS) defaults to "hierarchy" for a
    namespaced kind and "object" for a cluster-scoped one."""
    plural = kind.lower() + "s"
    move = move or ("hierarchy" if scope == "Namespaced" else "object")
    served: Schema = {"name": version, "served": True, "storage": True}
    if "status" in schema.get("properties", {}):
        served["subresources"] = {"status": {}}
    served["additionalPrinterColumns"] = list(columns)
    served["schema"] = {"openAPIV3Schema": schema}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": {**LABELS, **MOVE_LABELS[move]}},
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


def scope(namespaced: bool) -> str:
    return "Namespaced" if namespaced else "Cluster"


# The Go provider's v1alpha1, listed but neither served nor stored: applying these CRDs over an install whose
# status.storedVersions still names v1alpha1 is then accepted (the API server refuses to drop a stored version).
# Objects still stored as v1alpha1 are read as v1alpha2 without conversion; migrate them with the Go provider first.
LEGACY_VERSION: Schema = {
    "name": "v1alpha1",
    "served": False,
    "storage": False,
    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
}


def incluster_pool_crd(kind: str, namespaced: bool, description: str) -> Schema:
    ip_addresses = counts(
        "ipAddresses counts the pool's addresses.",
        total="total is the number of addresses the pool can hand out.",
        used="used is the number of IPAddresses of the pool.",
        free="free is the number of addresses still free.",
        outOfRange="outOfRange counts used addresses outside the pool.",
    )
    pool_status = status(
        "status is the observed state of the pool.",
        "conditions of the pool; Ready tells whether claims can be served.",
        ipAddresses=ip_addresses,
    )
    columns = [
        column("Addresses", "string", ".spec.addresses", "List of addresses, to allocate from"),
        *count_columns(
            "Count of IPs configured for the pool",
            "Count of unallocated IPs in the pool",
            "Count of allocated IPs in the pool",
        ),
    ]
    # A namespaced pool moves with everything it owns (its IPAddresses, and a Secret made owned by it).
    schema = document(description, model_schema(InClusterPoolSpec), pool_status)
    document_ = crd(kind, scope(namespaced), "v1alpha2", schema, columns)
    document_["spec"]["versions"].append(LEGACY_VERSION)
    return document_


def prefix_pool_crd(kind: str, namespaced: bool, description: str) -> Schema:
    ip_addresses = counts(
        "ipAddresses counts the pool's child prefixes (named as for address pools).",
        {"type": "integer"},
        ["free", "outOfRange", "total", "used"],
        total="total is the number of child prefixes the pool can hand out.",
        free="free is the number of child prefixes still to be handed out.",
        used="used is the number of IPAddresses of the pool.",
        outOfRange="outOfRange counts IPAddresses whose prefix the pool could not hand out now: outside prefixes, "
        "overlapping excludedPrefixes, or of another length.",
    )
    pool_status = status(
        "status is the observed state of the prefix pool.",
        "conditions of the pool; Ready tells whether claims can be served.",
        ipAddresses=ip_addresses,
    )
    columns = [
        column("Prefixes", "string", ".spec.prefixes", "The prefixes child prefixes are taken from"),
        *count_columns(
            "Child prefixes the pool can hand out", "Child prefixes not handed out", "Child prefixes handed out"
        ),
    ]
    schema = document(description, model_schema(PrefixPoolSpec), pool_status)
    return crd(kind, scope(namespaced), "v1alpha2", schema, columns)


# Besides being released, a reservation may change only its claim's uid (and lose releasedAt): the claim of the same
# namespace/name takes over the reservation made from its IPAddress before the claim existed or before a restore,
# its pin or its own released reservation (`ReservationClient.take_over`, backends/incluster/reservations.py), and a
# released pinned claim gives it back to its pin (uid "").
# `namespace` is a CEL keyword: Kubernetes exposes the property as `__namespace__`.
SAME_PLACE = (
    "self.pool == oldSelf.pool && self.address == oldSelf.address"
    " && self.prefix == oldSelf.prefix && has(self.gateway) == has(oldSelf.gateway)"
    " && (!has(self.gateway) || self.gateway == oldSelf.gateway)"
)
TAKE_OVER_RULE = (
    f"({SAME_PLACE} && self.claim.__namespace__ == oldSelf.claim.__namespace__"
    " && self.claim.name == oldSelf.claim.name)"
)
# A released reservation (a release record) may be taken over by any claim: the allocation that reuses the address
# (`Ledger.reassign`, backends/incluster/ledger.py). Pool, address, prefix and gateway stay (a record whose pool's
# prefix or gateway changed since is deleted and the address reserved anew).
REUSE_RULE = f"(has(oldSelf.releasedAt) && {SAME_PLACE})"


RESERVATION_TEXT: Schema = {"type": "string"}


def strings(*names: str) -> Schema:
    """String properties named `names`."""
    return {name: RESERVATION_TEXT for name in names}


def reservation_spec() -> Schema:
    text = RESERVATION_TEXT
    return {
        "type": "object",
        "required": ["pool", "address", "prefix", "claim"],
        "x-kubernetes-validations": [
            {
                "rule": f"self == oldSelf || has(self.releasedAt) || {TAKE_OVER_RULE} || {REUSE_RULE}",
                "message": "a reservation changes only to be released, to be taken over by its claim, or, once "
                "released, to be reused for another claim",
            }
        ],
        "properties": {
            "pool": {
                "type": "object",
                "description": "pool is the pool the address belongs to.",
                "properties": strings("apiGroup", "kind", "namespace", "name"),
            },
            "address": {**text, "description": "address is the held address."},
            "prefix": {"type": "integer", "minimum": 0, "maximum": 128},
            "gateway": text,
            "claim": {
                "type": "object",
                "description": "claim is the IPAddressClaim holding the address.",
                "properties": strings("namespace", "name", "uid"),
            },
            "releasedAt": {
                **text,
                "description": "releasedAt is set while a released address waits out the pool's reuse grace period.",
            },
        },
    }


def reservation_crd() -> Schema:
    schema = {
        "description": "InClusterIPReservation records that one address of an in-cluster pool is held. Its name "
        "encodes (pool, address), so the API server's name uniqueness guarantees that no address is held twice. "
        "Managed by the controller; do not edit.",
        "type": "object",
        "required": ["spec"],
        "properties": {**strings("apiVersion", "kind"), "metadata": {"type": "object"}, "spec": reservation_spec()},
    }
    columns = [
        column("Address", "string", ".spec.address"),
        column("Pool", "string", ".spec.pool.name"),
        column("Claim", "string", ".spec.claim.name"),
        column("Released", "string", ".spec.releasedAt"),
    ]
    # Internal state, never moved: clusterctl would copy these cluster-scoped objects to the target and leave them at
    # the source. The target's controller rebuilds them from the IPAddresses that move (`Ledger`'s rebuild,
    # backends/incluster/ledger.py), and the source's drops those of pools that are gone (`Repair.sweep_orphaned`).
    return crd("InClusterIPReservation", "Cluster", "v1alpha2", schema, columns, move="never")


def netbox_pool_crd(kind: str, namespaced: bool, description: str) -> Schema:
    """The two kinds share one schema, but the namespaced one reads its Secret from its own namespace."""
    spec = model_schema(netbox.PoolSpec)
    if namespaced:
        secret_ref = spec["properties"]["connection"]["properties"]["secretRef"]
        del secret_ref["properties"]["namespace"]
        secret_ref["required"].remove("namespace")
    source_usage = {
        "type": "object",
        "description": "Usage of one source.",
        "properties": {
            "type": string("type is prefix or ipRange.", 16),
            "id": {**INT64, "description": "id of the source in NetBox."},
            "range": string("range is the source's CIDR or start-end.", 100),
            "total": {**INT64, "description": "total addresses NetBox hands out from the source."},
            "used": {**INT64, "description": "used addresses: IP addresses NetBox holds in the source (anyone's)."},
            "free": {**INT64, "description": "free addresses of the source."},
        },
    }
    ip_addresses = counts(
        "ipAddresses sums the sources' usage (capped at the int64 maximum).",
        total="total addresses NetBox hands out from the sources.",
        used="used addresses in the sources, by anyone.",
        free="free addresses in the sources.",
    )
    pool_status = status(
        f"{kind}Status is what the provider last saw of the pool in NetBox.",
        "conditions of the pool; Ready says whether claims can be served, and if not, why.",
        ipAddresses=ip_addresses,
        sources={"description": "sources lists each source's usage.", "type": "array", "items": source_usage},
    )
    columns = [
        *READY_COLUMNS,
        *count_columns(
            "Addresses NetBox hands out from the sources",
            "Free addresses in the sources",
            "Used addresses in the sources",
        ),
        AGE_COLUMN,
    ]
    return crd(kind, scope(namespaced), netbox.VERSION, document(description, spec, pool_status), columns)


INFOBLOX_CONDITIONS = "conditions of the object; Ready says whether it can be used, and if not, why."


def infoblox_instance_crd() -> Schema:
    instance_status = status("InfobloxInstanceStatus is what the provider last saw of the grid.", INFOBLOX_CONDITIONS)
    schema = document(
        "InfobloxInstance is one Infoblox NIOS grid that InfobloxIPPools allocate from.",
        model_schema(infoblox.InstanceSpec),
        instance_status,
    )
    columns = [
        column("Host", "string", ".spec.host", "Grid Master"),
        column("WAPI", "string", ".spec.wapiVersion", "WAPI version"),
        *READY_COLUMNS,
        AGE_COLUMN,
    ]
    # Copied to the target (and left at the source, being cluster-scoped), with anything it owns.
    return crd("InfobloxInstance", "Cluster", infoblox.VERSION, schema, columns, move="hierarchy")


def infoblox_pool_crd() -> Schema:
    ip_addresses = counts(
        "ipAddresses counts the pool's addresses.",
        total="total is what the subnets and ranges can hand out.",
        used="used is the number of IPAddresses of the pool.",
        free="free is total minus used (others' grid objects not counted).",
    )
    pool_status = status(
        "InfobloxIPPoolStatus is what the provider last saw of the pool.",
        INFOBLOX_CONDITIONS,
        ipAddresses=ip_addresses,
        networkView=string("networkView is the network view in use.", 64),
    )
    schema = document(
        "InfobloxIPPool hands out addresses of Infoblox networks to IPAddressClaims.",
        model_schema(infoblox.PoolSpec),
        pool_status,
    )
    columns = [
        column("Instance", "string", ".spec.instanceRef.name", "Grid"),
        column("View", "string", ".status.networkView", "Network view"),
        column("Mode", "string", ".spec.mode", "fixedAddress or hostRecord"),
        *count_columns("Addresses", "Unallocated", "Allocated"),
        *READY_COLUMNS,
        AGE_COLUMN,
    ]
    return crd("InfobloxIPPool", "Namespaced", infoblox.VERSION, schema, columns)


def documents() -> list[Schema]:
    """Every CRD of the project."""
    in_cluster = "held in the cluster itself"
    netbox_sources = "allocated in NetBox, from its prefixes and IP ranges"
    return [
        incluster_pool_crd("InClusterIPPool", True, f"InClusterIPPool is a namespaced pool of addresses {in_cluster}."),
        incluster_pool_crd(
            "GlobalInClusterIPPool", False, f"GlobalInClusterIPPool is a cluster-wide pool of addresses {in_cluster}."
        ),
        reservation_crd(),
        prefix_pool_crd(
            "InClusterPrefixPool", True, f"InClusterPrefixPool is a namespaced pool of child prefixes {in_cluster}."
        ),
        prefix_pool_crd(
            "GlobalInClusterPrefixPool",
            False,
            f"GlobalInClusterPrefixPool is a cluster-wide pool of child prefixes {in_cluster}; claims of any "
            "namespace may use it.",
        ),
        netbox_pool_crd("NetboxIPPool", True, f"NetboxIPPool is a namespaced pool of addresses {netbox_sources}."),
        netbox_pool_crd(
            "GlobalNetboxIPPool", False, f"GlobalNetboxIPPool is a cluster-wide pool of addresses {netbox_sources}."
        ),
        infoblox_instance_crd(),
        infoblox_pool_crd(),
    ]


class _NoAliasDumper(yaml.SafeDumper):
    """Writes shared sub-schemas out in full instead of as YAML anchors and aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def write(out: Path = OUT) -> None:
    """Write each CRD as `<out>/<group>_<plural>.yaml`, headed by a do-not-edit line, then `<out>/Kustomization`
    listing every CRD file there."""
    out.mkdir(exist_ok=True)
    for document in documents():
        body = yaml.dump(document, Dumper=_NoAliasDumper, sort_keys=False, width=120)
        name = f"{GROUP}_{document['spec']['names']['plural']}.yaml"
        (out / name).write_text("# Generated by hack/gen_crds.py; do not edit.\n---\n" + body)
    files = sorted(path.name for path in out.glob("*.yaml"))
    (out / KUSTOMIZATION).write_text(
        "# Generated by hack/gen_crds.py (`make generate`); do not edit.\n"
        "# crds/ as a kustomization, so that config/crd (and with it config/default) can build it: a\n"
        "# kustomization may name another kustomization's directory anywhere, but files only under its own.\n"
        "# Named `Kustomization` so that `kubectl apply -f crds/` (which reads .yaml, .yml and .json files only)\n"
        "# does not take it for an object.\n" + yaml.dump({"resources": files}, sort_keys=False)
    )


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
