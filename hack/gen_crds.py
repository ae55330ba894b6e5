"""Generate the in-cluster CRDs under crds/ (run `make generate`; the output is committed).

InClusterIPPool and GlobalInClusterIPPool share one schema, wire-compatible with the Go in-cluster provider's
v1alpha2 API: same group, version, kinds, fields, printer columns and category. Validation that the Go provider
does in a webhook is done here with OpenAPI and CEL, with the same messages.
"""

from __future__ import annotations

import sys
from typing import Any

from crdgen import column, conditions, crd, write

from backends.incluster.policy import AllocationStrategy

ENTRY = (
    "Each entry is a single IP (10.0.0.5), a range of two IPs of the same family (10.0.0.10-10.0.0.20), "
    "or a CIDR (10.0.0.0/24)."
)
# No blanks around an entry or its range's ends: the Go provider's parsers (netip, netipx) refuse them.
ENTRY_RULE = (
    "isIP(self) || isCIDR(self) || (self.split('-').size() == 2 && "
    "isIP(self.split('-')[0]) && isIP(self.split('-')[1]))"
)
ENTRY_ITEMS = {
    "type": "string",
    "maxLength": 100,
    "x-kubernetes-validations": [
        {"rule": ENTRY_RULE, "message": "provided address is not a valid IP, range, nor CIDR"}
    ],
}
# A DNS label: the domain is also the value of a label on the domain's reservations.
DOMAIN_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# The pool's reservations are named by its domain (backends/incluster/domains.py): a change would strand them.
DOMAIN_IMMUTABLE = (
    "has(self.uniquenessDomain) == has(oldSelf.uniquenessDomain) && "
    "(!has(self.uniquenessDomain) || self.uniquenessDomain == oldSelf.uniquenessDomain)"
)


def pool_schema(scope_note: str) -> dict[str, Any]:
    family_v6 = "self.addresses[0].contains(':')"
    spec = {
        "description": f"spec is the desired state of the pool. {scope_note}",
        "type": "object",
        "required": ["addresses", "prefix"],
        "properties": {
            "addresses": {
                "description": f"addresses is the list of addresses the pool hands out. {ENTRY}",
                "type": "array",
                "maxItems": 1024,
                "items": ENTRY_ITEMS,
            },
            "prefix": {
                "description": "prefix is the network prefix length of the handed-out addresses.",
                "type": "integer",
                "minimum": 0,
                "maximum": 128,
            },
            "gateway": {
                "description": "gateway is the gateway of the network; it is never handed out.",
                "type": "string",
                "maxLength": 39,
                "x-kubernetes-validations": [
                    # The Go webhook checks the gateway only when it is not empty: "" means no gateway.
                    {"rule": "self == '' || isIP(self)", "message": "provided gateway is not a valid IP address"}
                ],
            },
            "allocateReservedIPAddresses": {
                "description": (
                    "allocateReservedIPAddresses lets the pool hand out the first address of the subnet "
                    "and, for IPv4, its broadcast address."
                ),
                "type": "boolean",
            },
            "excludedAddresses": {
                "description": f"excludedAddresses are never handed out. {ENTRY}",
                "type": "array",
                "maxItems": 1024,
                "items": ENTRY_ITEMS,
            },
            "addressReuseGracePeriodSeconds": {
                "description": "addressReuseGracePeriodSeconds keeps a released address unused for this long.",
                "type": "integer",
                "format": "int64",
                "minimum": 0,
            },
            "preAllocations": {
                "description": (
                    "preAllocations maps a claim to the address it gets. The address is never handed to another "
                    "claim, even before the named claim exists. An InClusterIPPool names claims of its own "
                    "namespace by name; a GlobalInClusterIPPool names them as namespace/name."
                ),
                "type": "object",
                "maxProperties": 1024,
                "additionalProperties": {
                    "type": "string",
                    "maxLength": 39,
                    "x-kubernetes-validations": [
                        {"rule": "isIP(self)", "message": "preAllocations: the address is not a valid IP address"}
                    ],
                },
            },
            "uniquenessDomain": {
                "description": (
                    "uniquenessDomain names a cluster-wide set of in-cluster pools (namespaced and global, of any "
                    "namespace) that never hand out the same address, even where their addresses overlap: an "
                    "address held by one pool of the domain is used for every other. Without it, addresses are "
                    "unique within the pool only, and pools whose addresses overlap report AddressesOverlap. "
                    "It cannot be set, changed or removed after the pool is created. Not part of the Go "
                    "provider's API."
                ),
                "type": "string",
                "minLength": 1,
                "maxLength": 63,
                "pattern": DOMAIN_PATTERN,
            },
            "allocationStrategy": {
                "description": (
                    "allocationStrategy is how a claim without a requested address gets one: LowestFree takes the "
                    "lowest free address; Random a free address chosen uniformly; LeastRecentlyReleased an address "
                    "never used before if there is one (the lowest), else the address released longest ago. "
                    "Every strategy respects addressReuseGracePeriodSeconds and reserveStaticBand."
                ),
                "type": "string",
                "enum": [strategy.value for strategy in AllocationStrategy],
                "default": AllocationStrategy.LOWEST_FREE.value,
            },
            "reserveStaticBand": {
                "description": (
                    "reserveStaticBand keeps the pool's lowest addresses (min(max(16, size/16), 256) of the "
                    "allocatable ones; none in a pool of fewer than 16) for requested and pre-allocated addresses: "
                    "claims without a requested address get an address of the band only when no other is free."
                ),
                "type": "boolean",
                "default": False,
            },
        },
        "x-kubernetes-validations": [
            {"rule": "self.addresses.size() > 0", "message": "addresses is required", "fieldPath": ".addresses"},
            {
                "rule": "self.addresses.all(a, a.contains(':')) || self.addresses.all(a, !a.contains(':'))",
                "message": "provided addresses are of mixed IP families",
                "fieldPath": ".addresses",
            },
            {
                "rule": (
                    "!has(self.gateway) || self.gateway == '' || self.addresses.size() == 0 || "
                    f"self.gateway.contains(':') == {family_v6}"
                ),
                "message": "provided gateway and addresses are of mixed IP families",
                "fieldPath": ".gateway",
            },
            {
                "rule": (
                    "!has(self.excludedAddresses) || self.addresses.size() == 0 || "
                    f"self.excludedAddresses.all(e, e.contains(':') == {family_v6})"
                ),
                "message": "addresses and excluded addresses are of mixed IP families",
                "fieldPath": ".excludedAddresses",
            },
            {
                "rule": f"self.addresses.size() == 0 || {family_v6} || self.prefix <= 32",
                "message": "provided prefix is not valid",
                "fieldPath": ".prefix",
            },
            {
                "rule": DOMAIN_IMMUTABLE,
                "message": "uniquenessDomain cannot change: create a new pool instead",
                "fieldPath": ".uniquenessDomain",
            },
        ],
    }
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
    return {
        "type": "object",
        "description": "",
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object."},
            "kind": {"type": "string", "description": "Kind of this object."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "required": ["spec"],
    }


def pool_crd(kind: str, plural: str, scope: str, description: str) -> dict[str, Any]:
    schema = pool_schema("Wire-compatible with the Go in-cluster provider's v1alpha2 API.")
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
