"""Generate the NetBox CRDs under crds/ (NetboxIPPool, GlobalNetboxIPPool; the output is committed).

Run `.venv/bin/python hack/gen_netbox_crds.py`. Version v1alpha1: these kinds are this project's own API, new and
still allowed to change without a conversion path. The two kinds share one schema; the cluster-scoped one must name
its Secret's namespace, the namespaced one reads its Secret from its own namespace. Validation is OpenAPI plus CEL
(isIP, isCIDR, matches), so mistakes are refused at admission with a message. backends/netbox/spec.py mirrors these
rules, and its bounds are used here; what a structural schema cannot bound (the depth and size of customFields
values, kept with x-kubernetes-preserve-unknown-fields) the admission webhook refuses with `parse_pool`.
"""

from __future__ import annotations

import sys

from crdgen import (
    Schema,
    age_column,
    column,
    conditions,
    crd,
    integer,
    namespace_name,
    object_name,
    ready_columns,
    rules,
    string,
    write,
)

from backends.netbox.spec import (
    CLAIM_UID_FIELD,
    CUSTOM_FIELD_NAME_LENGTH,
    CUSTOM_FIELDS,
    CUSTOM_FIELDS_DEPTH,
    CUSTOM_FIELDS_TEXT,
    CUSTOM_FIELDS_VALUES,
    DESCRIPTION_LENGTH,
    DNS_NAME_LENGTH,
    MAX_SOURCES,
    MAX_TAGS,
    NAME_LENGTH,
    OWNER_TAG,
    VERSION,
)
from ipam_provider.backend.tenancy import SECRET_REFS_LABEL

PLACEHOLDERS = "claim|namespace|cluster|machine"
TEMPLATE_RULE = f"self.matches('^([^{{}}]|[{{]({PLACEHOLDERS})[}}])*$')"
TEMPLATE_MESSAGE = "the only placeholders are {claim}, {namespace}, {cluster} and {machine}"


def ip_string(description: str) -> Schema:
    return string(description, 39, **{"x-kubernetes-validations": rules(("isIP(self)", "must be an IP address"))})


def vrf_fields() -> Schema:
    return {
        "vrf": string("vrf is the name of the source's NetBox VRF; omitted means the global table.", NAME_LENGTH),
        "vrfID": integer("vrfID is the NetBox id of the source's VRF (instead of vrf).", 1),
    }


def source_schema() -> Schema:
    by_id_no_vrf = (
        "!has(self.id) || (!has(self.vrf) && !has(self.vrfID))",
        "a source given by id takes its VRF from NetBox",
    )
    one_vrf = ("!(has(self.vrf) && has(self.vrfID))", "set at most one of vrf and vrfID")
    prefix = {
        "description": "prefix is a NetBox prefix: by id, or by cidr (and VRF).",
        "type": "object",
        "properties": {
            "id": integer("id is the NetBox id of the prefix.", 1),
            "cidr": string(
                "cidr is the prefix, e.g. 10.0.0.0/24 or 2001:db8::/64.",
                43,
                **{
                    "x-kubernetes-validations": rules(
                        (
                            "isCIDR(self) && cidr(self) == cidr(self).masked()",
                            "must be a network in CIDR form, without host bits (e.g. 10.0.0.0/24)",
                        )
                    )
                },
            ),
            **vrf_fields(),
        },
        "x-kubernetes-validations": rules(
            ("has(self.id) != has(self.cidr)", "set exactly one of id and cidr"), one_vrf, by_id_no_vrf
        ),
    }
    ip_range = {
        "description": "ipRange is a NetBox IP range: by id, or by start and end (and VRF).",
        "type": "object",
        "properties": {
            "id": integer("id is the NetBox id of the IP range.", 1),
            "start": ip_string("start is the first address of the range, without mask."),
            "end": ip_string("end is the last address of the range, without mask."),
            **vrf_fields(),
        },
        "x-kubernetes-validations": rules(
            ("has(self.start) == has(self.end)", "set both start and end"),
            ("has(self.id) != has(self.start)", "set either id, or start and end"),
            (
                "!has(self.start) || !has(self.end) || ip(self.start).family() == ip(self.end).family()",
                "start and end must be of one IP family",
            ),
            one_vrf,
            by_id_no_vrf,
        ),
    }
    return {
        "description": "A source of addresses: exactly one of prefix and ipRange.",
        "type": "object",
        "properties": {
            "prefix": prefix,
            "ipRange": ip_range,
            "gateway": ip_string(
                "gateway of the addresses from this source; overrides spec.gateway. A gateway inside the source "
                "must be recorded in NetBox as an IP address (else the pool is not Ready: GatewayNotRecorded); it "
                "is never given to a claim."
            ),
            "prefixLength": integer(
                "prefixLength of the addresses from this source; by default the source's own mask in NetBox. At "
                "most 32 for IPv4.",
                0,
                128,
            ),
        },
        "x-kubernetes-validations": rules(
            ("has(self.prefix) != has(self.ipRange)", "set exactly one of prefix and ipRange"),
            (
                "!has(self.prefixLength) || self.prefixLength <= 32 || !("
                "(has(self.prefix) && has(self.prefix.cidr) && isCIDR(self.prefix.cidr) && "
                "cidr(self.prefix.cidr).ip().family() == 4) || "
                "(has(self.ipRange) && has(self.ipRange.start) && isIP(self.ipRange.start) && "
                "ip(self.ipRange.start).family() == 4))",
                "prefixLength must be at most 32 for an IPv4 source",
            ),
        ),
    }


def address_fields_schema() -> Schema:
    return {
        "description": (
            "addressFields are written on every NetBox IP address the pool creates, next to the provider's "
            f"ownership marks (the tag {OWNER_TAG} and the custom field {CLAIM_UID_FIELD}). NetBox sets the VRF "
            "from the source. Templates may use {claim}, {namespace}, {cluster} and {machine} (the claim's Machine, "
            "else its controlling owner, else the claim)."
        ),
        "type": "object",
        "properties": {
            "status": {
                "type": "string",
                "description": "status of the addresses in NetBox.",
                "enum": ["active", "reserved", "deprecated", "dhcp", "slaac"],
                "default": "active",
            },
            "role": {
                "type": "string",
                "description": "role of the addresses in NetBox; none by default.",
                "enum": ["loopback", "secondary", "anycast", "vip", "vrrp", "hsrp", "glbp", "carp"],
            },
            "tenant": string(
                "tenant is the slug of the NetBox tenant of the addresses.", NAME_LENGTH, pattern="^[-a-zA-Z0-9_]+$"
            ),
            "dnsName": string(
                "dnsName is a template for the addresses' DNS name, e.g. {machine}.{cluster}.example.com.",
                DNS_NAME_LENGTH,
                **{"x-kubernetes-validations": rules((TEMPLATE_RULE, TEMPLATE_MESSAGE))},
            ),
            "description": string(
                "description is a template for the addresses' description (default: Cluster API claim "
                "{namespace}/{claim}).",
                DESCRIPTION_LENGTH,
                **{"x-kubernetes-validations": rules((TEMPLATE_RULE, TEMPLATE_MESSAGE))},
            ),
            "tags": {
                "description": "tags are slugs of existing NetBox tags to put on the addresses.",
                "type": "array",
                "maxItems": MAX_TAGS,
                "x-kubernetes-list-type": "set",
                "items": string("a tag slug.", NAME_LENGTH, pattern="^[-a-zA-Z0-9_]+$"),
                "x-kubernetes-validations": rules(
                    (f"!self.exists(t, t == '{OWNER_TAG}')", f"{OWNER_TAG} is the provider's own tag")
                ),
            },
            "customFields": {
                "description": (
                    "customFields are NetBox custom field values for the addresses, by field name (any JSON value; "
                    f"not {CLAIM_UID_FIELD}, the provider's own), at most {CUSTOM_FIELDS}. The admission webhook "
                    f"refuses names longer than {CUSTOM_FIELD_NAME_LENGTH} characters, values nested deeper than "
                    f"{CUSTOM_FIELDS_DEPTH} levels of objects and lists, more than {CUSTOM_FIELDS_VALUES} values in "
                    f"all, and strings longer than {CUSTOM_FIELDS_TEXT} characters."
                ),
                "type": "object",
                "maxProperties": CUSTOM_FIELDS,
                "additionalProperties": {"x-kubernetes-preserve-unknown-fields": True},
            },
        },
    }


def pool_schema(kind: str, namespaced: bool, description: str) -> Schema:
    secret_ref: Schema = {
        "description": (
            "secretRef names the Secret with the keys url (NetBox's base URL, e.g. https://netbox.example.com), "
            "token (a v2 token nbt_<key>.<secret>, sent as Bearer, or a v1 token, sent as Token) and optionally "
            "caBundle (PEM certificates to trust for NetBox's TLS certificate). "
            + (
                "The Secret is read from the pool's own namespace."
                if namespaced
                else "namespace is required: the pool is cluster-scoped."
            )
        ),
        "type": "object",
        "required": ["name"] if namespaced else ["name", "namespace"],
        "properties": {"name": object_name("name of the Secret.")},
    }
    if not namespaced:
        secret_ref["properties"]["namespace"] = namespace_name(
            "namespace of the Secret. The controller reads it only if the Namespace carries the label "
            f'{SECRET_REFS_LABEL}: "true".'
        )
    count = {"type": "integer", "format": "int64"}
    spec = {
        "description": f"{kind}Spec says where in NetBox the pool's addresses come from and what they carry.",
        "type": "object",
        "required": ["connection", "sources"],
        "properties": {
            "connection": {
                "description": "connection says how to reach NetBox.",
                "type": "object",
                "required": ["secretRef"],
                "properties": {
                    "secretRef": secret_ref,
                    "insecureSkipVerify": {
                        "type": "boolean",
                        "description": (
                            "insecureSkipVerify turns off TLS certificate verification; never in production."
                        ),
                    },
                },
            },
            "sources": {
                "description": (
                    "sources are NetBox prefixes and IP ranges, in order: an address comes from the first one with "
                    "room. All must be of one IP family."
                ),
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_SOURCES,
                "items": source_schema(),
            },
            "gateway": ip_string(
                "gateway of the pool's addresses, unless a source sets its own. A gateway inside a source must be "
                "recorded in NetBox as an IP address; it is never given to a claim."
            ),
            "prefixLength": integer(
                "prefixLength of the pool's addresses, unless a source sets its own; by default each source's mask. "
                "At most 32 for IPv4 sources (checked against NetBox).",
                0,
                128,
            ),
            "addressFields": address_fields_schema(),
        },
    }
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
