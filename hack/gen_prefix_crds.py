"""Generate the in-cluster prefix pool CRDs under crds/ (run `make generate`; the output is committed).

InClusterPrefixPool and GlobalInClusterPrefixPool share one schema, wire-compatible with the Go in-cluster provider's
v1alpha2 API (v1.1.0): same group, version, kinds, fields, default, printer columns and category. The spec schema
comes from the model in backends/incluster/prefix_spec.py, with its CEL rules.
"""

from __future__ import annotations

import sys
from typing import Any

from crdgen import column, conditions, crd, document, model_schema, write

from backends.incluster.prefix_spec import PrefixPoolSpec


def status_schema() -> dict[str, Any]:
    def count(description: str) -> dict[str, Any]:
        return {"type": "integer", "description": description}

    return {
        "description": "status is the observed state of the prefix pool.",
        "type": "object",
        "properties": {
            "ipAddresses": {
                "description": "ipAddresses counts the pool's child prefixes (named as for address pools).",
                "type": "object",
                "required": ["free", "outOfRange", "total", "used"],
                "properties": {
                    "total": count("total is the number of child prefixes the pool can hand out."),
                    "free": count("free is the number of child prefixes still to be handed out."),
                    "used": count("used is the number of IPAddresses of the pool."),
                    "outOfRange": count(
                        "outOfRange counts IPAddresses whose prefix the pool could not hand out now: outside "
                        "prefixes, overlapping excludedPrefixes, or of another length."
                    ),
                },
            },
            "conditions": conditions("conditions of the pool; Ready tells whether claims can be served."),
        },
    }


def prefix_pool_crd(kind: str, plural: str, scope: str, description: str) -> dict[str, Any]:
    schema = document(description, model_schema(PrefixPoolSpec), status_schema())
    columns = [
        column("Prefixes", "string", ".spec.prefixes", "The prefixes child prefixes are taken from"),
        column("Total", "integer", ".status.ipAddresses.total", "Child prefixes the pool can hand out"),
        column("Free", "integer", ".status.ipAddresses.free", "Child prefixes not handed out"),
        column("Used", "integer", ".status.ipAddresses.used", "Child prefixes handed out"),
    ]
    # As for the address pools (hack/gen_crds.py): a namespaced pool moves with what it owns, a cluster-scoped one
    # is copied alone and its IPAddresses move with their claims.
    return crd(
        kind=kind,
        plural=plural,
        scope=scope,
        version="v1alpha2",
        schema=schema,
        columns=columns,
        move="hierarchy" if scope == "Namespaced" else "object",
    )


def main() -> int:
    documents = {
        "ipam.cluster.x-k8s.io_inclusterprefixpools.yaml": prefix_pool_crd(
            "InClusterPrefixPool",
            "inclusterprefixpools",
            "Namespaced",
            "InClusterPrefixPool is a namespaced pool of child prefixes held in the cluster itself.",
        ),
        "ipam.cluster.x-k8s.io_globalinclusterprefixpools.yaml": prefix_pool_crd(
            "GlobalInClusterPrefixPool",
            "globalinclusterprefixpools",
            "Cluster",
            "GlobalInClusterPrefixPool is a cluster-wide pool of child prefixes held in the cluster itself; "
            "claims of any namespace may use it.",
        ),
    }
    write(documents, "hack/gen_prefix_crds.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
