"""Generate the in-cluster CRDs under crds/ (run `make generate`; the output is committed).

InClusterIPPool and GlobalInClusterIPPool share one schema, wire-compatible with the Go in-cluster provider's
v1alpha2 API: same group, version, kinds, fields, printer columns and category. Validation that the Go provider
does in a webhook is done with OpenAPI and CEL, with the same messages; the spec schema comes from the model in
backends/incluster/spec.py.
"""

from __future__ import annotations

import sys
from typing import Any

from crdgen import column, conditions, crd, document, model_schema, write

from backends.incluster.spec import InClusterPoolSpec


def pool_schema() -> dict[str, Any]:
    spec = model_schema(InClusterPoolSpec)
    count = {"type": "integer", "format": "int64"}
    status = {
        "description": "status is the observed state of the pool.",
        "type": "object",
        "properties": {
            "ipAddresses": {
                "description": "ipAddresses counts the pool's addresses.",
                "type": "object",
                "properties": {
                    "total": {
                        **count,
                        "description": "total is the number of addresses the pool can hand out.",
                    },
                    "used": {**count, "description": "used is the number of IPAddresses of the pool."},
                    "free": {**count, "description": "free is the number of addresses still free."},
                    "outOfRange": {
                        **count,
                        "description": "outOfRange counts used addresses outside the pool.",
                    },
                },
            },
            "conditions": conditions("conditions of the pool; Ready tells whether claims can be served."),
        },
    }
    return document("", spec, status)


def pool_crd(kind: str, plural: str, scope: str, description: str) -> dict[str, Any]:
    schema = pool_schema()
    schema["description"] = description
    columns = [
        column("Addresses", "string", ".spec.addresses", "List of addresses, to allocate from"),
        column("Total", "integer", ".status.ipAddresses.total", "Count of IPs configured for the pool"),
        column("Free", "integer", ".status.ipAddresses.free", "Count of unallocated IPs in the pool"),
        column("Used", "integer", ".status.ipAddresses.used", "Count of allocated IPs in the pool"),
    ]
    # A namespaced pool moves with everything it owns (its IPAddresses, and a Secret made owned by it); a
    # cluster-scoped one is copied alone, and its IPAddresses move with their claims (see crdgen.MOVE_LABELS).
    document = crd(
        kind=kind,
        plural=plural,
        scope=scope,
        version="v1alpha2",
        schema=schema,
        columns=columns,
        move="hierarchy" if scope == "Namespaced" else "object",
    )
    document["spec"]["versions"].append(LEGACY_VERSION)
    return document


# The Go provider's v1alpha1, listed but neither served nor stored: applying these CRDs over an install whose
# status.storedVersions still names v1alpha1 is then accepted (the API server refuses to drop a stored version).
# Objects still stored as v1alpha1 are read as v1alpha2 without conversion; migrate them with the Go provider first.
LEGACY_VERSION: dict[str, Any] = {
    "name": "v1alpha1",
    "served": False,
    "storage": False,
    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
}


# Besides being released, a reservation may change only its claim's uid (and lose releasedAt): the claim of the same
# namespace/name takes over the reservation made from its IPAddress before the claim existed or before a restore
# (backends/incluster/existing.py), its pin or its own released reservation (backends/incluster/pins.py), and a
# released pinned claim gives it back to its pin (uid "").
# `namespace` is a CEL keyword: Kubernetes exposes the property as `__namespace__`.
TAKE_OVER_RULE = (
    "(self.pool == oldSelf.pool && self.address == oldSelf.address"
    " && self.prefix == oldSelf.prefix && has(self.gateway) == has(oldSelf.gateway)"
    " && (!has(self.gateway) || self.gateway == oldSelf.gateway)"
    " && self.claim.__namespace__ == oldSelf.claim.__namespace__ && self.claim.name == oldSelf.claim.name)"
)
# A released reservation (a release record) may be taken over by any claim: the allocation that reuses the address
# (backends/incluster/released.py). Pool, address, prefix and gateway stay (a record whose pool's prefix or gateway
# changed since is deleted and the address reserved anew).
REUSE_RULE = (
    "(has(oldSelf.releasedAt) && self.pool == oldSelf.pool && self.address == oldSelf.address"
    " && self.prefix == oldSelf.prefix && has(self.gateway) == has(oldSelf.gateway)"
    " && (!has(self.gateway) || self.gateway == oldSelf.gateway))"
)


def reservation_crd() -> dict[str, Any]:
    string = {"type": "string"}
    schema = {
        "description": (
            "InClusterIPReservation records that one address of an in-cluster pool is held. "
            "Its name encodes (pool, address), so the API server's name uniqueness guarantees "
            "that no address is held twice. Managed by the controller; do not edit."
        ),
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": string,
            "kind": string,
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "required": ["pool", "address", "prefix", "claim"],
                "x-kubernetes-validations": [
                    {
                        "rule": f"self == oldSelf || has(self.releasedAt) || {TAKE_OVER_RULE} || {REUSE_RULE}",
                        "message": (
                            "a reservation changes only to be released, to be taken over by its claim, or, once "
                            "released, to be reused for another claim"
                        ),
                    }
                ],
                "properties": {
                    "pool": {
                        "type": "object",
                        "description": "pool is the pool the address belongs to.",
                        "properties": {
                            "apiGroup": string,
                            "kind": string,
                            "namespace": string,
                            "name": string,
                        },
                    },
                    "address": {**string, "description": "address is the held address."},
                    "prefix": {"type": "integer", "minimum": 0, "maximum": 128},
                    "gateway": string,
                    "claim": {
                        "type": "object",
                        "description": "claim is the IPAddressClaim holding the address.",
                        "properties": {
                            "namespace": string,
                            "name": string,
                            "uid": string,
                        },
                    },
                    "releasedAt": {
                        **string,
                        "description": "releasedAt is set while a released address waits "
                        "out the pool's reuse grace period.",
                    },
                },
            },
        },
    }
    columns = [
        column("Address", "string", ".spec.address"),
        column("Pool", "string", ".spec.pool.name"),
        column("Claim", "string", ".spec.claim.name"),
        column("Released", "string", ".spec.releasedAt"),
    ]
    return crd(
        kind="InClusterIPReservation",
        plural="inclusteripreservations",
        scope="Cluster",
        version="v1alpha2",
        schema=schema,
        columns=columns,
        # Internal state, never moved: clusterctl would copy these cluster-scoped objects to the target and leave them
        # at the source. The target's controller rebuilds them from the IPAddresses that move (backends/incluster/
        # existing.py), and the source's controller drops those of pools that are gone (backends/incluster/orphans.py).
        move="never",
        status_subresource=False,
    )


def main() -> int:
    documents = {
        "ipam.cluster.x-k8s.io_inclusterippools.yaml": pool_crd(
            "InClusterIPPool",
            "inclusterippools",
            "Namespaced",
            "InClusterIPPool is a namespaced pool of addresses held in the cluster itself.",
        ),
        "ipam.cluster.x-k8s.io_globalinclusterippools.yaml": pool_crd(
            "GlobalInClusterIPPool",
            "globalinclusterippools",
            "Cluster",
            "GlobalInClusterIPPool is a cluster-wide pool of addresses held in the cluster itself.",
        ),
        "ipam.cluster.x-k8s.io_inclusteripreservations.yaml": reservation_crd(),
    }
    write(documents, "hack/gen_crds.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
