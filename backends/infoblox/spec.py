"""The Infoblox API kinds (InfobloxInstance, InfobloxIPPool, v1alpha1), the ownership extensible attributes and the
IPAddress annotation keys. The CRDs (`crds/ipam.cluster.x-k8s.io_infoblox*.yaml`) are generated from the models and
their OpenAPI metadata (hack/gen_crds.py); `parse_pool` repeats the admission checks that matter for allocation, so an
object stored unvalidated fails with a message, not a crash."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from backends.validation import (
    NAMESPACE_NAME,
    NamedSecret,
    NamespaceName,
    ObjectName,
    OpenAPI,
    PoolSpecError,
    Spec,
    parse_spec,
    rules,
)
from ipam_provider.api.capi import IPAM_GROUP
from ipam_provider.backend.contract import PoolKind, PoolRef
from ipam_provider.backend.tenancy import SECRET_REFS_LABEL
from ipam_provider.common import Object
from ipam_provider.runtime.kube.resources import Resource, subdomain_problem

VERSION = "v1alpha1"
INFOBLOX_POOL = PoolKind(IPAM_GROUP, VERSION, "InfobloxIPPool", "infobloxippools", namespaced=True)
INSTANCES = Resource(IPAM_GROUP, VERSION, "infobloxinstances", "InfobloxInstance", namespaced=False)

# Extensible attributes this provider writes on every grid object it creates (all of type STRING).
EA_CLAIM_UID = "CAPI-Claim-UID"
EA_CLAIM_NAMESPACE = "CAPI-Claim-Namespace"
EA_CLAIM_NAME = "CAPI-Claim-Name"
EA_CLUSTER_NAME = "CAPI-Cluster-Name"
EA_POOL = "CAPI-Pool"
OWNERSHIP_EAS = (EA_CLAIM_UID, EA_CLAIM_NAMESPACE, EA_CLAIM_NAME, EA_CLUSTER_NAME, EA_POOL)
# The management cluster that made the object (BackendContext.cluster_identity), written only when the grid defines
# it: a grid several management clusters share works without it, but the repair loop then only reports leaks.
EA_CLUSTER_IDENTITY = "CAPI-Cluster-Identity"
OPTIONAL_EAS = (EA_CLUSTER_IDENTITY,)

# Keys of Allocation.annotations, stored by the reconciler on the IPAddress and handed back on release.
ANNOTATION_PREFIX = "infoblox.ipam.cluster.x-k8s.io/"
ANNOTATION_REF = ANNOTATION_PREFIX + "ref"
ANNOTATION_INSTANCE = ANNOTATION_PREFIX + "instance"
ANNOTATION_HOSTNAME = ANNOTATION_PREFIX + "hostname"

HOST_RECORD = "hostRecord"


CAPI_EAS = f"!self.exists(k, k in {list(OWNERSHIP_EAS)!r})"
IPV4 = OpenAPI(maxLength=15, validations=rules(("isIP(self) && ip(self).family() == 4", "must be an IPv4 address")))
LABEL_VALUE = OpenAPI("a label value.", type="string", maxLength=63)
# A metav1.LabelSelector.
LABEL_SELECTOR = OpenAPI(
    properties={
        "matchLabels": OpenAPI(
            "matchLabels: every one of these labels, with these values.",
            type="object",
            maxProperties=64,
            additionalProperties=LABEL_VALUE,
        ),
        "matchExpressions": OpenAPI(
            "matchExpressions: every one of these requirements.",
            type="array",
            maxItems=64,
            items=dict(
                description="a label requirement: key, an operator and (for In and NotIn) values.",
                type="object",
                required=["key", "operator"],
                properties={
                    "key": OpenAPI("key is the label key.", type="string", maxLength=317),
                    "operator": OpenAPI(
                        "operator relates the key to the values.",
                        type="string",
                        enum=["In", "NotIn", "Exists", "DoesNotExist"],
                    ),
                    "values": OpenAPI(
                        "values of In and NotIn; empty for Exists and DoesNotExist.",
                        type="array",
                        maxItems=64,
                        items=LABEL_VALUE,
                        list_type="atomic",
                    ),
                },
            ),
            list_type="atomic",
        ),
    },
)
LABEL_SELECTOR["x-kubernetes-map-type"] = "atomic"


class SecretRef(NamedSecret):
    namespace: Annotated[
        NamespaceName,
        OpenAPI(f'namespace of the Secret; it must carry the label {SECRET_REFS_LABEL}: "true" (docs/security.md).'),
    ]


class SecretKeyRef(SecretRef):
    key: Annotated[str, OpenAPI(maxLength=253, defaulted=True)] = "ca.crt"
    """key of the Secret's data holding the PEM bundle."""


class LocalRef(Spec):
    name: ObjectName
    """name of the InfobloxInstance."""


class AllowedNamespaces(Spec):
    """The namespaces whose pools may use an instance: those in `names`, and those whose labels match `selector`
    (a metav1.LabelSelector; `{}` matches every namespace). None of them: no namespace."""

    openapi: ClassVar[OpenAPI] = OpenAPI(
        "allowedNamespaces says whose InfobloxIPPools may use this instance (and so its credentials): a pool's "
        "namespace must be in list or have labels that selector matches. Absent (or empty): no namespace may; "
        "`selector: {}`: every namespace. A pool of another namespace is Ready=False InstanceNotAllowed."
    )

    names: Annotated[
        list[str], OpenAPI(maxItems=256, items=OpenAPI("a namespace's name.", **NAMESPACE_NAME), list_type="set")
    ] = Field(default_factory=list, alias="list")
    """list names the namespaces allowed."""
    selector: Annotated[dict[str, Any] | None, LABEL_SELECTOR] = None
    """selector allows the namespaces whose labels it matches ({} matches every namespace)."""


class InstanceSpec(Spec):
    openapi: ClassVar[OpenAPI] = OpenAPI(
        "InfobloxInstanceSpec says how to reach one Infoblox NIOS grid (its Grid Master) over WAPI.",
        validations=rules(
            ("!(has(self.caBundle) && has(self.caBundleSecretRef))", "set caBundle or caBundleSecretRef, not both"),
            (
                "!(has(self.insecureSkipVerify) && self.insecureSkipVerify && "
                "(has(self.caBundle) || has(self.caBundleSecretRef)))",
                "insecureSkipVerify with a CA bundle is contradictory; remove one",
            ),
        ),
    )

    host: Annotated[
        str,
        OpenAPI(
            minLength=1,
            maxLength=253,
            validations=rules(
                ("!self.contains('/') && !self.contains('@')", "host is a name or an address, nothing more"),
                ("isIP(self) || !self.contains(':')", "put the port in spec.port"),
            ),
        ),
    ]
    """host is the Grid Master's DNS name or IP address, without scheme, port or path."""
    port: Annotated[int, OpenAPI(minimum=1, maximum=65535, defaulted=True)] = 443
    """port of the WAPI HTTPS endpoint."""
    wapi_version: Annotated[str, OpenAPI(maxLength=16, pattern=r"^2\.[0-9]+(\.[0-9]+)?$", defaulted=True)] = Field(
        default="2.12", alias="wapiVersion"
    )
    """wapiVersion is the WAPI version to speak, e.g. 2.12 (2.x; fixed addresses, host records, func:nextavailableip
    and extensible-attribute search need no newer one)."""
    credentials_secret_ref: SecretRef = Field(alias="credentialsSecretRef")
    """credentialsSecretRef names the Secret holding `username` and `password` (type kubernetes.io/basic-auth works),
    or `clientCert` and `clientKey` (PEM; `tls.crt`/`tls.key` of a kubernetes.io/tls Secret work too). The instance is
    cluster-scoped, so the Secret's namespace is explicit; keep it in the provider's namespace, labelled to lend
    Secrets to cluster-scoped objects. Whoever may create InfobloxInstances can make the provider send the credentials
    of any Secret of such a namespace to any host: grant that to cluster administrators only."""
    ca_bundle: Annotated[
        str | None,
        OpenAPI(
            maxLength=65536,
            validations=rules(("self.contains('-----BEGIN CERTIFICATE-----')", "caBundle must hold PEM certificates")),
        ),
    ] = Field(default=None, alias="caBundle")
    """caBundle is the PEM bundle of the CA(s) that signed the grid's certificate. Without it (and without
    caBundleSecretRef) the publicly trusted CAs are used. TLS verification is always on unless insecureSkipVerify is
    set."""
    ca_bundle_secret_ref: SecretKeyRef | None = Field(default=None, alias="caBundleSecretRef")
    """caBundleSecretRef names a Secret key holding the CA bundle (PEM), instead of caBundle."""
    insecure_skip_verify: Annotated[bool, OpenAPI(defaulted=True)] = Field(default=False, alias="insecureSkipVerify")
    """insecureSkipVerify turns TLS verification off. For tests only: anyone on the path can then read the
    credentials. The instance and its pools then show TLSVerified=False (InsecureSkipVerify) with a Warning Event."""
    default_network_view: Annotated[str, OpenAPI(maxLength=64, defaulted=True)] = Field(
        default="default", alias="defaultNetworkView"
    )
    """defaultNetworkView is the network view of pools that name none."""
    default_dns_view: Annotated[str, OpenAPI(maxLength=64, defaulted=True)] = Field(
        default="default", alias="defaultDNSView"
    )
    """defaultDNSView is the DNS view of host records of pools that name none."""
    manage_ea_definitions: Annotated[
        bool,
        OpenAPI(
            "manageExtensibleAttributeDefinitions lets the provider create the STRING extensible attribute "
            f"definitions it marks its objects with ({', '.join(OWNERSHIP_EAS)}) when they are missing; that needs "
            "the permission to create extensible attribute definitions. When false, an administrator creates them.",
            defaulted=True,
        ),
    ] = Field(default=True, alias="manageExtensibleAttributeDefinitions")
    request_timeout_seconds: Annotated[int, OpenAPI(defaulted=True)] = Field(
        default=10, alias="requestTimeoutSeconds", ge=1, le=300
    )
    """requestTimeoutSeconds bounds each WAPI request."""
    max_concurrent_requests: Annotated[int, OpenAPI(defaulted=True)] = Field(
        default=8, alias="maxConcurrentRequests", ge=1, le=64
    )
    """maxConcurrentRequests bounds the WAPI requests in flight to this grid."""
    allowed_namespaces: AllowedNamespaces | None = Field(default=None, alias="allowedNamespaces")

    @property
    def netloc(self) -> str:
        """`host:port` as infoblox-client wants it (IPv6 literals in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


class SubnetSpec(Spec):
    openapi: ClassVar[OpenAPI] = OpenAPI(
        "a network of the grid to allocate from.",
        validations=rules(
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
    )

    cidr: Annotated[str, OpenAPI(maxLength=43, validations=rules(("isCIDR(self)", "cidr must be a CIDR")))]
    """cidr is the network as the grid knows it, e.g. 10.0.0.0/24 or fd00::/64."""
    gateway: Annotated[
        str | None, OpenAPI(maxLength=39, validations=rules(("isIP(self)", "gateway must be an IP address")))
    ] = None
    """gateway is handed to claimants; it is never allocated (if nothing on the grid holds it, the provider reserves
    it with a fixed address)."""


class RangeSpec(Spec):
    openapi: ClassVar[OpenAPI] = OpenAPI(
        "an IPv4 DHCP range of the grid to allocate from (func:nextavailableip:<start>-<end>); start must not come "
        "after end."
    )

    start: Annotated[str, IPV4]
    """start is the range's first address."""
    end: Annotated[str, IPV4]
    """end is the range's last address."""
    prefix: Annotated[int, OpenAPI(minimum=0, maximum=32)]
    """prefix is the length of the network the range lies in."""
    gateway: Annotated[str | None, IPV4] = None
    """gateway is handed to claimants."""


class HostRecordSpec(Spec):
    openapi: ClassVar[OpenAPI] = OpenAPI("hostRecord configures host records (mode hostRecord).")

    dns_zone: Annotated[str, OpenAPI(minLength=1, maxLength=253)] = Field(alias="dnsZone")
    """dnsZone is appended to the host name, e.g. nodes.example.com."""
    dns_view: Annotated[str | None, OpenAPI(maxLength=64)] = Field(default=None, alias="dnsView")
    """dnsView holds the records; default: the instance's defaultDNSView."""
    hostname_source: Annotated[Literal["claimName", "machineName"], OpenAPI(defaulted=True)] = Field(
        default="machineName", alias="hostnameSource"
    )
    """hostnameSource names the host: machineName (the cluster.x-k8s.io Machine found by following the claim's
    ownerReferences) or claimName (the claim's own name)."""
    configure_for_dns: Annotated[bool, OpenAPI(defaulted=True)] = Field(default=True, alias="configureForDNS")
    """configureForDNS publishes the record in DNS (the zone must exist on the grid)."""


class PoolSpec(Spec):
    openapi: ClassVar[OpenAPI] = OpenAPI(
        "InfobloxIPPoolSpec says where on which grid addresses come from and what is written there.",
        validations=rules(
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
    )

    instance_ref: LocalRef = Field(alias="instanceRef")
    """instanceRef names the InfobloxInstance (cluster-scoped) of the grid."""
    network_view: Annotated[str | None, OpenAPI(maxLength=64)] = Field(default=None, alias="networkView")
    """networkView holds the subnets; default: the instance's defaultNetworkView."""
    subnets: Annotated[list[SubnetSpec], OpenAPI(maxItems=32)] = Field(default_factory=list)
    """subnets are asked in order: when one has no free address the next is tried."""
    ranges: Annotated[list[RangeSpec], OpenAPI(maxItems=32)] = Field(default_factory=list)
    """ranges (IPv4 DHCP ranges) are asked after the subnets, in order."""
    mode: Annotated[Literal["fixedAddress", "hostRecord"], OpenAPI(defaulted=True)] = "fixedAddress"
    """mode is what holds an address on the grid: a fixedAddress (IPv4 MAC 00:00:00:00:00:00 or an IPv6 DUID derived
    from the claim's uid) or a hostRecord (a DNS host record)."""
    host_record: HostRecordSpec | None = Field(default=None, alias="hostRecord")
    extensible_attributes: Annotated[
        dict[str, str],
        OpenAPI(
            maxProperties=32,
            additionalProperties=OpenAPI(maxLength=256),
            validations=rules((CAPI_EAS, "the CAPI-* ownership attributes are the provider's own")),
        ),
    ] = Field(default_factory=dict, alias="extensibleAttributes")
    """extensibleAttributes are written on every object, next to the provider's own ownership attributes (CAPI-*);
    each must be defined on the grid."""


@dataclass(frozen=True)
class Target:
    """One place to allocate from, in the pool's order: a network (CIDR) or a DHCP range (first-last)."""

    argument: str  # what follows `func:nextavailableip:` before the network view
    kind: Literal["network", "range"]
    version: int
    prefix: int
    gateway: str | None
    usable: int  # addresses nextavailableip may hand out, as far as the pool's spec tells

    def __str__(self) -> str:
        return f"{self.kind} {self.argument}"

    def contains(self, value: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        if value.version != self.version:
            return False
        if self.kind == "network":
            return value in ipaddress.ip_network(self.argument)
        first, last = (int(ipaddress.ip_address(part)) for part in self.argument.split("-"))
        return first <= int(value) <= last


@dataclass(frozen=True)
class Pool:
    ref: PoolRef
    uid: str
    spec: PoolSpec
    targets: tuple[Target, ...]
    version: int
    generation: int = 0

    @property
    def instance(self) -> str:
        return self.spec.instance_ref.name

    @property
    def label(self) -> str:
        """The value of the CAPI-Pool attribute: `<namespace>/<name>`."""
        return f"{self.ref.namespace}/{self.ref.name}"

    def target_of(self, address: str) -> Target:
        """The subnet or range holding `address` (the first one if none does, e.g. after the spec changed)."""
        value = ipaddress.ip_address(address)
        return next((target for target in self.targets if target.contains(value)), self.targets[0])

    def target_for(self, address: str) -> tuple[Target | None, str]:
        """The first subnet or range that could hand out `address` (not its network, IPv4 broadcast or IPv6
        subnet-router anycast address, nor its gateway), or None and why none can ("" when none holds it)."""
        value = ipaddress.ip_address(address)
        why = ""
        for target in (t for t in self.targets if t.contains(value)):
            network = ipaddress.ip_network(target.argument) if target.kind == "network" else None
            reserved = network is not None and network.num_addresses > 2 and value == network.network_address
            if network is not None and network.version == 4 and network.prefixlen < 31:
                reserved = reserved or value == network.broadcast_address
            if target.gateway is not None and ipaddress.ip_address(target.gateway) == value:
                why = why or f"the gateway of {target}"
            elif reserved:
                why = why or f"a reserved address of {target} (its network, broadcast or subnet-router anycast address)"
            else:
                return target, ""
        return None, why

    def why_outside(self, address: str) -> str | None:
        """Why the pool as configured now cannot hand out `address`, or None when it can."""
        try:
            target, why = self.target_for(address)
        except ValueError:
            return "not an IP address"
        if target is not None:
            return None
        return why or f"in none of the pool's subnets and ranges ({', '.join(str(t) for t in self.targets)})"


def parse_pool(ref: PoolRef, pool: Object) -> Pool:
    """The spec of the pool `ref`, checked; PoolSpecError says what is wrong."""
    spec = parse_spec(PoolSpec, pool)
    if problem := subdomain_problem(spec.instance_ref.name):
        raise PoolSpecError(f"spec.instanceRef.name: {problem}")
    targets = [_subnet_target(i, s) for i, s in enumerate(spec.subnets)]
    targets += [_range_target(i, r) for i, r in enumerate(spec.ranges)]
    if not targets:
        raise PoolSpecError("spec needs at least one subnet or range")
    versions = {t.version for t in targets}
    if len(versions) > 1:
        raise PoolSpecError("subnets and ranges are of mixed IP families; use one pool per family")
    if spec.mode == HOST_RECORD and spec.host_record is None:
        raise PoolSpecError("spec.hostRecord (with dnsZone) is required when mode is hostRecord")
    reserved = sorted(set(spec.extensible_attributes) & {*OWNERSHIP_EAS, *OPTIONAL_EAS})
    if reserved:
        raise PoolSpecError(f"spec.extensibleAttributes may not set {', '.join(reserved)}: the provider owns them")
    meta = pool["metadata"]
    return Pool(ref, str(meta.get("uid", "")), spec, tuple(targets), versions.pop(), int(meta.get("generation") or 0))


def _subnet_target(index: int, subnet: SubnetSpec) -> Target:
    try:
        network = ipaddress.ip_network(subnet.cidr, strict=True)
    except ValueError as error:
        raise PoolSpecError(f"spec.subnets[{index}].cidr {subnet.cidr!r} is not a network CIDR: {error}") from error
    gateway = _gateway(f"spec.subnets[{index}]", subnet.gateway, network.version)
    if gateway is not None and ipaddress.ip_address(gateway) not in network:
        raise PoolSpecError(f"spec.subnets[{index}].gateway {gateway} is not inside {network}")
    size = network.num_addresses
    if network.version == 4 and network.prefixlen < 31:
        size -= 2  # network and broadcast addresses
    elif network.version == 6 and network.prefixlen < 127:
        size -= 1  # subnet-router anycast address
    if gateway is not None:
        size -= 1
    return Target(str(network), "network", network.version, network.prefixlen, gateway, max(size, 0))


def _range_target(index: int, spec: RangeSpec) -> Target:
    where = f"spec.ranges[{index}]"
    try:
        start, end = ipaddress.ip_address(spec.start), ipaddress.ip_address(spec.end)
    except ValueError as error:
        raise PoolSpecError(f"{where}: {error}") from error
    if start.version != 4 or end.version != 4:
        raise PoolSpecError(f"{where}: ranges are IPv4 DHCP ranges; use subnets for IPv6")
    if start > end:
        raise PoolSpecError(f"{where}: start {start} is after end {end}")
    if not 0 <= spec.prefix <= 32:
        raise PoolSpecError(f"{where}.prefix {spec.prefix} is not an IPv4 prefix length")
    gateway = _gateway(where, spec.gateway, 4)
    size = int(end) - int(start) + 1
    if gateway is not None and int(start) <= int(ipaddress.ip_address(gateway)) <= int(end):
        size -= 1
    return Target(f"{start}-{end}", "range", 4, spec.prefix, gateway, size)


def _gateway(where: str, gateway: str | None, version: int) -> str | None:
    if gateway is None:
        return None
    try:
        address = ipaddress.ip_address(gateway)
    except ValueError as error:
        raise PoolSpecError(f"{where}.gateway {gateway!r} is not an IP address") from error
    if address.version != version:
        raise PoolSpecError(f"{where}.gateway {gateway} is not of the same IP family as its addresses")
    return str(address)
