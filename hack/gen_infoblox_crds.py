"""Generate the Infoblox CRDs under crds/ (InfobloxInstance, InfobloxIPPool; the output is committed).

Run `.venv/bin/python hack/gen_infoblox_crds.py`. Version v1alpha1: these kinds are this project's own API, new and
still allowed to change without a conversion path. They are not wire-compatible with the kinds of the same names of
telekom/cluster-api-ipam-provider-infoblox (different fields), and the two providers cannot be installed together.
Validation is OpenAPI plus CEL (isIP, isCIDR, cidr(), ip()) so mistakes are refused at admission with a message.
The models in backends/infoblox/spec.py mirror these schemas.
"""

from __future__ import annotations

import sys

from crdgen import (
    GROUP,
    Schema,
    age_column,
    conditions,
    crd,
    namespace_name,
    object_name,
    ready_columns,
    rules,
    string,
    write,
)

VERSION = "v1alpha1"
CONDITIONS = "conditions of the object; Ready says whether it can be used, and if not, why."
RESERVED_EAS = ["CAPI-Claim-UID", "CAPI-Claim-Namespace", "CAPI-Claim-Name", "CAPI-Cluster-Name", "CAPI-Pool"]


def secret_ref(description: str, with_key: bool = False) -> Schema:
    properties: Schema = {
        "name": object_name("name of the Secret."),
        "namespace": namespace_name(
            "namespace of the Secret; it must carry the label "
            'ipam.cluster.x-k8s.io/allow-cluster-scoped-secret-refs: "true" (docs/security.md).'
        ),
    }
    if with_key:
        properties["key"] = string("key of the Secret's data holding the PEM bundle.", 253, default="ca.crt")
    return {"description": description, "type": "object", "required": ["name", "namespace"], "properties": properties}


def label_selector(description: str) -> Schema:
    """A metav1.LabelSelector."""
    requirement: Schema = {
        "description": "a label requirement: key, an operator and (for In and NotIn) values.",
        "type": "object",
        "required": ["key", "operator"],
        "properties": {
            "key": string("key is the label key.", 317),
            "operator": {
                "description": "operator relates the key to the values.",
                "type": "string",
                "enum": ["In", "NotIn", "Exists", "DoesNotExist"],
            },
            "values": {
                "description": "values of In and NotIn; empty for Exists and DoesNotExist.",
                "type": "array",
                "maxItems": 64,
                "items": string("a label value.", 63),
                "x-kubernetes-list-type": "atomic",
            },
        },
    }
    return {
        "description": description,
        "type": "object",
        "properties": {
            "matchLabels": {
                "description": "matchLabels: every one of these labels, with these values.",
                "type": "object",
                "maxProperties": 64,
                "additionalProperties": string("a label value.", 63),
            },
            "matchExpressions": {
                "description": "matchExpressions: every one of these requirements.",
                "type": "array",
                "maxItems": 64,
                "items": requirement,
                "x-kubernetes-list-type": "atomic",
            },
        },
        "x-kubernetes-map-type": "atomic",
    }


def allowed_namespaces() -> Schema:
    return {
        "description": "allowedNamespaces says whose InfobloxIPPools may use this instance (and so its credentials): "
        "a pool's namespace must be in list or have labels that selector matches. Absent (or empty): no namespace "
        "may; `selector: {}`: every namespace. A pool of another namespace is Ready=False InstanceNotAllowed.",
        "type": "object",
        "properties": {
            "list": {
                "description": "list names the namespaces allowed.",
                "type": "array",
                "maxItems": 256,
                "items": namespace_name("a namespace's name."),
                "x-kubernetes-list-type": "set",
            },
            "selector": label_selector(
                "selector allows the namespaces whose labels it matches ({} matches every namespace)."
            ),
        },
    }


def instance_schema() -> Schema:
    spec: Schema = {
        "description": "InfobloxInstanceSpec says how to reach one Infoblox NIOS grid (its Grid Master) over WAPI.",
        "type": "object",
        "required": ["host", "credentialsSecretRef"],
        "properties": {
            "host": string(
                "host is the Grid Master's DNS name or IP address, without scheme, port or path.",
                253,
                minLength=1,
                **{
                    "x-kubernetes-validations": rules(
                        ("!self.contains('/') && !self.contains('@')", "host is a name or an address, nothing more"),
                        ("isIP(self) || !self.contains(':')", "put the port in spec.port"),
                    )
                },
            ),
            "port": {
                "description": "port of the WAPI HTTPS endpoint.",
                "type": "integer",
                "minimum": 1,
                "maximum": 65535,
                "default": 443,
            },
            "wapiVersion": string(
                "wapiVersion is the WAPI version to speak, e.g. 2.12 (2.x; fixed addresses, host records, "
                "func:nextavailableip and extensible-attribute search need no newer one).",
                16,
                default="2.12",
                pattern=r"^2\.[0-9]+(\.[0-9]+)?$",
            ),
            "credentialsSecretRef": secret_ref(
                "credentialsSecretRef names the Secret holding `username` and `password` (type "
                "kubernetes.io/basic-auth works), or `clientCert` and `clientKey` (PEM; `tls.crt`/`tls.key` of a "
                "kubernetes.io/tls Secret work too). The instance is cluster-scoped, so the Secret's namespace is "
                "explicit; keep it in the provider's namespace, labelled to lend Secrets to cluster-scoped objects. "
                "Whoever may create InfobloxInstances can make the provider send the credentials of any Secret of "
                "such a namespace to any host: grant that to cluster administrators only."
            ),
            "caBundle": string(
                "caBundle is the PEM bundle of the CA(s) that signed the grid's certificate. Without it (and "
                "without caBundleSecretRef) the publicly trusted CAs are used. TLS verification is always on "
                "unless insecureSkipVerify is set.",
                65536,
                **{
                    "x-kubernetes-validations": rules(
                        ("self.contains('-----BEGIN CERTIFICATE-----')", "caBundle must hold PEM certificates")
                    )
                },
            ),
            "allowedNamespaces": allowed_namespaces(),
            "caBundleSecretRef": secret_ref(
                "caBundleSecretRef names a Secret key holding the CA bundle (PEM), instead of caBundle.", True
            ),
            "insecureSkipVerify": {
                "description": "insecureSkipVerify turns TLS verification off. For tests only: anyone on the path "
                "can then read the credentials. The instance and its pools then show TLSVerified=False "
                "(InsecureSkipVerify) with a Warning Event.",
                "type": "boolean",
                "default": False,
            },
            "defaultNetworkView": string(
                "defaultNetworkView is the network view of pools that name none.", 64, default="default"
            ),
            "defaultDNSView": string(
                "defaultDNSView is the DNS view of host records of pools that name none.", 64, default="default"
            ),
            "manageExtensibleAttributeDefinitions": {
                "description": "manageExtensibleAttributeDefinitions lets the provider create the STRING extensible "
                "attribute definitions it marks its objects with (CAPI-Claim-UID, CAPI-Claim-Namespace, "
                "CAPI-Claim-Name, CAPI-Cluster-Name, CAPI-Pool) when they are missing; that needs the permission to "
                "create extensible attribute definitions. When false, an administrator creates them.",
                "type": "boolean",
                "default": True,
            },
            "requestTimeoutSeconds": {
                "description": "requestTimeoutSeconds bounds each WAPI request.",
                "type": "integer",
                "minimum": 1,
                "maximum": 300,
                "default": 10,
            },
            "maxConcurrentRequests": {
                "description": "maxConcurrentRequests bounds the WAPI requests in flight to this grid.",
                "type": "integer",
                "minimum": 1,
                "maximum": 64,
                "default": 8,
            },
        },
        "x-kubernetes-validations": rules(
            ("!(has(self.caBundle) && has(self.caBundleSecretRef))", "set caBundle or caBundleSecretRef, not both"),
            (
                "!(has(self.insecureSkipVerify) && self.insecureSkipVerify && "
                "(has(self.caBundle) || has(self.caBundleSecretRef)))",
                "insecureSkipVerify with a CA bundle is contradictory; remove one",
            ),
        ),
    }
    status = {
        "description": "InfobloxInstanceStatus is what the provider last saw of the grid.",
        "type": "object",
        "properties": {"conditions": conditions(CONDITIONS)},
    }
    return document("InfobloxInstance is one Infoblox NIOS grid that InfobloxIPPools allocate from.", spec, status)


def subnet_schema() -> Schema:
    return {
        "description": "a network of the grid to allocate from.",
        "type": "object",
        "required": ["cidr"],
        "properties": {
            "cidr": string(
                "cidr is the network as the grid knows it, e.g. 10.0.0.0/24 or fd00::/64.",
                43,
                **{"x-kubernetes-validations": rules(("isCIDR(self)", "cidr must be a CIDR"))},
            ),
            "gateway": string(
                "gateway is handed to claimants; it is never allocated (if nothing on the grid holds it, the "
                "provider reserves it with a fixed address).",
                39,
                **{"x-kubernetes-validations": rules(("isIP(self)", "gateway must be an IP address"))},
            ),
        },
        "x-kubernetes-validations": rules(
            (
                "!isCIDR(self.cidr) || cidr(self.cidr).masked() == cidr(self.cidr)",
                "cidr must name the network address (10.0.0.0/24, not 10.0.0.5/24)",
                ".cidr",
            ),
            (
                "!has(self.gateway) || !isCIDR(self.cidr) || !isIP(self.gateway) || "
                "cidr(self.cidr).containsIP(self.gateway)",
                "gateway must lie inside cidr",
                ".gateway",
            ),
        ),
    }


def range_schema() -> Schema:
    address = {"x-kubernetes-validations": rules(("isIP(self) && ip(self).family() == 4", "must be an IPv4 address"))}
    return {
        "description": "an IPv4 DHCP range of the grid to allocate from (func:nextavailableip:<start>-<end>); "
        "start must not come after end.",
        "type": "object",
        "required": ["start", "end", "prefix"],
        "properties": {
            "start": string("start is the range's first address.", 15, **address),
            "end": string("end is the range's last address.", 15, **address),
            "prefix": {
                "description": "prefix is the length of the network the range lies in.",
                "type": "integer",
                "minimum": 0,
                "maximum": 32,
            },
            "gateway": string("gateway is handed to claimants.", 15, **address),
        },
    }


def pool_schema() -> Schema:
    spec: Schema = {
        "description": "InfobloxIPPoolSpec says where on which grid addresses come from and what is written there.",
        "type": "object",
        "required": ["instanceRef"],
        "properties": {
            "instanceRef": {
                "description": "instanceRef names the InfobloxInstance (cluster-scoped) of the grid.",
                "type": "object",
                "required": ["name"],
                "properties": {"name": object_name("name of the InfobloxInstance.")},
            },
            "networkView": string("networkView holds the subnets; default: the instance's defaultNetworkView.", 64),
            "subnets": {
                "description": "subnets are asked in order: when one has no free address the next is tried.",
                "type": "array",
                "maxItems": 32,
                "items": subnet_schema(),
            },
            "ranges": {
                "description": "ranges (IPv4 DHCP ranges) are asked after the subnets, in order.",
                "type": "array",
                "maxItems": 32,
                "items": range_schema(),
            },
            "mode": {
                "description": "mode is what holds an address on the grid: a fixedAddress (IPv4 MAC 00:00:00:00:00:00 "
                "or an IPv6 DUID derived from the claim's uid) or a hostRecord (a DNS host record).",
                "type": "string",
                "enum": ["fixedAddress", "hostRecord"],
                "default": "fixedAddress",
            },
            "hostRecord": {
                "description": "hostRecord configures host records (mode hostRecord).",
                "type": "object",
                "required": ["dnsZone"],
                "properties": {
                    "dnsZone": string(
                        "dnsZone is appended to the host name, e.g. nodes.example.com.", 253, minLength=1
                    ),
                    "dnsView": string("dnsView holds the records; default: the instance's defaultDNSView.", 64),
                    "hostnameSource": {
                        "description": "hostnameSource names the host: machineName (the cluster.x-k8s.io Machine "
                        "found by following the claim's ownerReferences) or claimName (the claim's own name).",
                        "type": "string",
                        "enum": ["machineName", "claimName"],
                        "default": "machineName",
                    },
                    "configureForDNS": {
                        "description": "configureForDNS publishes the record in DNS (the zone must exist on the grid).",
                        "type": "boolean",
                        "default": True,
                    },
                },
            },
            "extensibleAttributes": {
                "description": "extensibleAttributes are written on every object, next to the provider's own "
                "ownership attributes (CAPI-*); each must be defined on the grid.",
                "type": "object",
                "maxProperties": 32,
                "additionalProperties": {"type": "string", "maxLength": 256},
                "x-kubernetes-validations": rules(
                    (
                        f"!self.exists(k, k in {RESERVED_EAS!r})",
                        "the CAPI-* ownership attributes are the provider's own",
                    )
                ),
            },
        },
        "x-kubernetes-validations": rules(
            (
                "(has(self.subnets) && self.subnets.size() > 0) || (has(self.ranges) && self.ranges.size() > 0)",
                "set at least one subnet or range",
                ".subnets",
            ),
            (
                "!has(self.subnets) || self.subnets.all(s, s.cidr.contains(':')) || "
                "self.subnets.all(s, !s.cidr.contains(':'))",
                "subnets are of mixed IP families; use one pool per family",
                ".subnets",
            ),
            (
                "!has(self.ranges) || !has(self.subnets) || self.subnets.all(s, !s.cidr.contains(':'))",
                "ranges are IPv4: they cannot join IPv6 subnets",
                ".ranges",
            ),
            (
                "self.mode != 'hostRecord' || has(self.hostRecord)",
                "mode hostRecord needs hostRecord.dnsZone",
                ".hostRecord",
            ),
        ),
    }
    count = {"type": "integer", "format": "int64"}
    status = {
        "description": "InfobloxIPPoolStatus is what the provider last saw of the pool.",
        "type": "object",
        "properties": {
            "ipAddresses": {
                "description": "ipAddresses counts the pool's addresses.",
                "type": "object",
                "properties": {
                    "total": {**count, "description": "total is what the subnets and ranges can hand out."},
                    "used": {**count, "description": "used is the number of IPAddresses of the pool."},
                    "free": {**count, "description": "free is total minus used (others' grid objects not counted)."},
                },
            },
            "networkView": string("networkView is the network view in use.", 64),
            "conditions": conditions(CONDITIONS),
        },
    }
    return document("InfobloxIPPool hands out addresses of Infoblox networks to IPAddressClaims.", spec, status)


def document(description: str, spec: Schema, status: Schema) -> Schema:
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


def main() -> int:
    instance_columns = [
        {"name": "Host", "type": "string", "jsonPath": ".spec.host", "description": "Grid Master"},
        {"name": "WAPI", "type": "string", "jsonPath": ".spec.wapiVersion", "description": "WAPI version"},
    ]
    pool_columns = [
        {"name": "Instance", "type": "string", "jsonPath": ".spec.instanceRef.name", "description": "Grid"},
        {"name": "View", "type": "string", "jsonPath": ".status.networkView", "description": "Network view"},
        {"name": "Mode", "type": "string", "jsonPath": ".spec.mode", "description": "fixedAddress or hostRecord"},
        {"name": "Total", "type": "integer", "jsonPath": ".status.ipAddresses.total", "description": "Addresses"},
        {"name": "Free", "type": "integer", "jsonPath": ".status.ipAddresses.free", "description": "Unallocated"},
        {"name": "Used", "type": "integer", "jsonPath": ".status.ipAddresses.used", "description": "Allocated"},
    ]
    documents = {
        f"{GROUP}_infobloxinstances.yaml": crd(
            kind="InfobloxInstance",
            plural="infobloxinstances",
            scope="Cluster",
            schema=instance_schema(),
            columns=[*instance_columns, *ready_columns(), age_column()],
            version=VERSION,
            # Copied to the target (and left at the source, being cluster-scoped), with anything it owns.
            move="hierarchy",
        ),
        f"{GROUP}_infobloxippools.yaml": crd(
            kind="InfobloxIPPool",
            plural="infobloxippools",
            scope="Namespaced",
            schema=pool_schema(),
            columns=[*pool_columns, *ready_columns(), age_column()],
            version=VERSION,
            move="hierarchy",
        ),
    }
    write(documents, "hack/gen_infoblox_crds.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
