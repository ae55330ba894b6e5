"""Generate the NetBox CRDs under crds/ (NetboxIPPool, GlobalNetboxIPPool; the output is committed).

Run `.venv/bin/python hack/gen_netbox_crds.py`. Version v1alpha1: these kinds are this project's own API, new and
still allowed to change without a conversion path. The two kinds share one schema; the cluster-scoped one must name
its Secret's namespace, the namespaced one reads its Secret from its own namespace. Validation is OpenAPI plus CEL
(isIP, isCIDR, matches), so mistakes are refused at admission with a message. The spec schema comes from the
model in backends/netbox/spec.py; what a structural schema cannot bound (the depth and size of customFields
values, kept with x-kubernetes-preserve-unknown-fields) the admission webhook refuses with `parse_pool`.
"""

from __future__ import annotations

import sys

from crdgen import Schema, age_column, column, conditions, crd, document, model_schema, ready_columns, string, write

from backends.netbox.spec import VERSION, PoolSpec


def pool_schema(kind: str, namespaced: bool, description: str) -> Schema:
    spec = model_schema(PoolSpec)
    if namespaced:  # the Secret is read from the pool's own namespace
        secret_ref = spec["properties"]["connection"]["properties"]["secretRef"]
        del secret_ref["properties"]["namespace"]
        secret_ref["required"].remove("namespace")
    count = {"type": "integer", "format": "int64"}
    source_usage = {
        "type": "object",
        "description": "Usage of one source.",
        "properties": {
            "type": string("type is prefix or ipRange.", 16),
            "id": {**count, "description": "id of the source in NetBox."},
            "range": string("range is the source's CIDR or start-end.", 100),
            "total": {**count, "description": "total addresses NetBox hands out from the source."},
            "used": {**count, "description": "used addresses: IP addresses NetBox holds in the source (anyone's)."},
            "free": {**count, "description": "free addresses of the source."},
        },
    }
    status = {
        "description": f"{kind}Status is what the provider last saw of the pool in NetBox.",
        "type": "object",
        "properties": {
            "ipAddresses": {
                "description": "ipAddresses sums the sources' usage (capped at the int64 maximum).",
                "type": "object",
                "properties": {
                    "total": {**count, "description": "total addresses NetBox hands out from the sources."},
                    "used": {**count, "description": "used addresses in the sources, by anyone."},
                    "free": {**count, "description": "free addresses in the sources."},
                },
            },
            "sources": {"description": "sources lists each source's usage.", "type": "array", "items": source_usage},
            "conditions": conditions(
                "conditions of the pool; Ready says whether claims can be served, and if not, why."
            ),
        },
    }
    return document(description, spec, status)


def pool_crd(kind: str, plural: str, namespaced: bool, description: str) -> Schema:
    columns = [
        *ready_columns(),
        column("Total", "integer", ".status.ipAddresses.total", "Addresses NetBox hands out from the sources"),
        column("Free", "integer", ".status.ipAddresses.free", "Free addresses in the sources"),
        column("Used", "integer", ".status.ipAddresses.used", "Used addresses in the sources"),
        age_column(),
    ]
    return crd(
        kind=kind,
        plural=plural,
        scope="Namespaced" if namespaced else "Cluster",
        version=VERSION,
        schema=pool_schema(kind, namespaced, description),
        columns=columns,
        # As the in-cluster pools: a namespaced pool moves with what it owns, a cluster-scoped one alone.
        move="hierarchy" if namespaced else "object",
    )


def main() -> int:
    documents = {
        "ipam.cluster.x-k8s.io_netboxippools.yaml": pool_crd(
            "NetboxIPPool",
            "netboxippools",
            True,
            "NetboxIPPool is a namespaced pool of addresses allocated in NetBox, from its prefixes and IP ranges.",
        ),
        "ipam.cluster.x-k8s.io_globalnetboxippools.yaml": pool_crd(
            "GlobalNetboxIPPool",
            "globalnetboxippools",
            False,
            "GlobalNetboxIPPool is a cluster-wide pool of addresses allocated in NetBox, from its prefixes and IP "
            "ranges.",
        ),
    }
    write(documents, "hack/gen_netbox_crds.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
