"""Generate the in-cluster prefix pool CRDs under crds/ (run `make generate`; the output is committed).

InClusterPrefixPool and GlobalInClusterPrefixPool share one schema, wire-compatible with the Go in-cluster provider's
v1alpha2 API (v1.1.0): same group, version, kinds, fields, default, printer columns and category. What the Go
provider checks in its webhook is checked here with CEL, with the Go messages; IPv4 prefix pools are accepted too
(the Go provider serves IPv6 only), with messages of the same shape. What CEL cannot check (existing allocations
that a spec change would leave outside the pool) is the backend's to report.
"""

from __future__ import annotations

import sys
from typing import Any

from crdgen import column, conditions, crd, rules, write
from gen_crds import ENTRY_RULE

DEFAULT_ALLOCATION_PREFIX_LENGTH = 64
ALLOCATION = f"(has(self.allocationPrefixLength) ? self.allocationPrefixLength : {DEFAULT_ALLOCATION_PREFIX_LENGTH})"
# An entry written with dots and no colon is meant as IPv4; anything else (IPv4-mapped IPv6 included) as IPv6.
LOOKS_V4 = "(self.contains('.') && !self.contains(':'))"
V6_POOL = "self.prefixes[0].contains(':')"


def prefix_items() -> dict[str, Any]:
    return {
        "type": "string",
        "maxLength": 100,
        "x-kubernetes-validations": rules(
            (f"{LOOKS_V4} || isCIDR(self)", "provided entry is not a valid IPv6 CIDR"),
            (f"!{LOOKS_V4} || isCIDR(self)", "provided entry is not a valid IPv4 CIDR"),
            ("!isCIDR(self) || cidr(self) == cidr(self).masked()", "CIDR must be network-aligned"),
        ),
    }


def spec_rules() -> list[dict[str, Any]]:
    not_empty = "self.prefixes.size() == 0"
    # The Go message ends with the length in parentheses; a messageExpression with string(int) is refused by the
    # API server's cost estimate, so the CRD's message stops before it (the backend's names it).
    too_long = {
        "rule": f"self.prefixes.all(p, !isCIDR(p) || cidr(p).prefixLength() <= {ALLOCATION})",
        "message": "CIDR prefix length must be <= allocationPrefixLength",
        "fieldPath": ".prefixes",
    }
    gateway_of_family = (
        "!has(self.gateway) || self.gateway == '' || !isIP(self.gateway) || "
        f"{not_empty} || self.gateway.contains(':') == {V6_POOL}"
    )
    excluded_of_family = f"!has(self.excludedPrefixes) || {not_empty} || "
    return [
        *rules(
            ("self.prefixes.size() > 0", "prefixes is required", ".prefixes"),
            (
                "self.prefixes.all(p, p.contains(':')) || self.prefixes.all(p, !p.contains(':'))",
                "provided prefixes are of mixed IP families",
                ".prefixes",
            ),
        ),
        too_long,
        *rules(
            (
                f"{not_empty} || {V6_POOL} || {ALLOCATION} <= 32",
                "allocationPrefixLength must be between 1 and 32 for IPv4 prefixes",
                ".allocationPrefixLength",
            ),
            (f"{gateway_of_family} || !{V6_POOL}", "provided gateway must be IPv6", ".gateway"),
            (f"{gateway_of_family} || {V6_POOL}", "provided gateway must be IPv4", ".gateway"),
            (
                excluded_of_family + f"!{V6_POOL} || self.excludedPrefixes.all(e, e.contains(':'))",
                "only IPv6 excluded prefixes are supported",
                ".excludedPrefixes",
            ),
            (
                excluded_of_family + f"{V6_POOL} || self.excludedPrefixes.all(e, !e.contains(':'))",
                "only IPv4 excluded prefixes are supported",
                ".excludedPrefixes",
            ),
        ),
    ]


def spec_schema() -> dict[str, Any]:
    return {
        "description": "spec is the desired state of the prefix pool. Wire-compatible with the Go in-cluster "
        "provider's v1alpha2 API, IPv4 prefixes added.",
        "type": "object",
        "required": ["prefixes"],
        "properties": {
            "prefixes": {
                "description": "prefixes are the CIDRs the pool carves its child prefixes from, all of one IP "
                "family; each must be a network address (fd00::/48, 10.0.0.0/16).",
                "type": "array",
                "maxItems": 1024,
                "items": prefix_items(),
            },
            "allocationPrefixLength": {
                "description": "allocationPrefixLength is the length of each handed-out child prefix (64: every "
                "claim gets a /64). At least the length of every entry of prefixes; at most 128, or 32 for IPv4. "
                "It cannot change once the pool exists.",
                "type": "integer",
                "default": DEFAULT_ALLOCATION_PREFIX_LENGTH,
                "minimum": 1,
                "maximum": 128,
                "x-kubernetes-validations": rules(("self == oldSelf", "spec.allocationPrefixLength is immutable")),
            },
            "gateway": {
                "description": "gateway is copied into every IPAddress of the pool. It does not keep any child "
                "prefix from being handed out.",
                "type": "string",
                "maxLength": 39,
                "x-kubernetes-validations": rules(
                    ("self == '' || isIP(self)", "provided gateway is not a valid IP address")
                ),
            },
            "excludedPrefixes": {
                "description": "excludedPrefixes are never handed out: a child prefix that overlaps any of them is "
                "skipped. Each entry is a single IP, a range of two IPs (A-B), or a CIDR.",
                "type": "array",
                "maxItems": 1024,
                "items": {
                    "type": "string",
                    "maxLength": 100,
                    # The Go prefix pool webhook says "entry" where its address pool webhook says "address".
                    "x-kubernetes-validations": rules(
                        (ENTRY_RULE, "provided entry is not a valid IP, range, nor CIDR")
                    ),
                },
            },
        },
        "x-kubernetes-validations": spec_rules(),
    }


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
    schema = {
        "description": description,
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object."},
            "kind": {"type": "string", "description": "Kind of this object."},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": status_schema(),
        },
        "required": ["spec"],
    }
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
