"""The Infoblox API kinds (InfobloxInstance, InfobloxIPPool, v1alpha1), the ownership extensible attributes and the
IPAddress annotation keys. The models mirror `crds/ipam.cluster.x-k8s.io_infoblox*.yaml`; `parse_pool` repeats the
admission checks that matter for allocation, so an object stored unvalidated fails with a message, not a crash."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError

from backends.validation import PoolSpecError, spec_error
from ipam_provider.api.capi import Model
from ipam_provider.backend.contract import PoolKind, PoolRef
from ipam_provider.common import Object
from ipam_provider.runtime.kube.resources import IPAM_GROUP, Resource, subdomain_problem

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


class SecretRef(Model):
    name: str
    namespace: str


class SecretKeyRef(SecretRef):
    key: str = "ca.crt"


class LocalRef(Model):
    name: str


class AllowedNamespaces(Model):
    """The namespaces whose pools may use an instance: those in `names`, and those whose labels match `selector`
    (a metav1.LabelSelector; `{}` matches every namespace). None of them: no namespace."""

    names: list[str] = Field(default_factory=list, alias="list")
    selector: dict[str, Any] | None = None


class InstanceSpec(Model):
    host: str
    port: int = 443
    wapi_version: str = Field(default="2.12", alias="wapiVersion")
    credentials_secret_ref: SecretRef = Field(alias="credentialsSecretRef")
    ca_bundle: str | None = Field(default=None, alias="caBundle")
    ca_bundle_secret_ref: SecretKeyRef | None = Field(default=None, alias="caBundleSecretRef")
    insecure_skip_verify: bool = Field(default=False, alias="insecureSkipVerify")
    default_network_view: str = Field(default="default", alias="defaultNetworkView")
    default_dns_view: str = Field(default="default", alias="defaultDNSView")
    manage_ea_definitions: bool = Field(default=True, alias="manageExtensibleAttributeDefinitions")
    request_timeout_seconds: int = Field(default=10, alias="requestTimeoutSeconds", ge=1, le=300)
    max_concurrent_requests: int = Field(default=8, alias="maxConcurrentRequests", ge=1, le=64)
    allowed_namespaces: AllowedNamespaces | None = Field(default=None, alias="allowedNamespaces")

    @property
    def netloc(self) -> str:
        """`host:port` as infoblox-client wants it (IPv6 literals in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


class SubnetSpec(Model):
    cidr: str
    gateway: str | None = None


class RangeSpec(Model):
    start: str
    end: str
    prefix: int
    gateway: str | None = None


class HostRecordSpec(Model):
    dns_zone: str = Field(alias="dnsZone")
    dns_view: str | None = Field(default=None, alias="dnsView")
    hostname_source: Literal["claimName", "machineName"] = Field(default="machineName", alias="hostnameSource")
    configure_for_dns: bool = Field(default=True, alias="configureForDNS")


class PoolSpec(Model):
    instance_ref: LocalRef = Field(alias="instanceRef")
    network_view: str | None = Field(default=None, alias="networkView")
    subnets: list[SubnetSpec] = Field(default_factory=list)
    ranges: list[RangeSpec] = Field(default_factory=list)
    mode: Literal["fixedAddress", "hostRecord"] = "fixedAddress"
    host_record: HostRecordSpec | None = Field(default=None, alias="hostRecord")
    extensible_attributes: dict[str, str] = Field(default_factory=dict, alias="extensibleAttributes")


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
    try:
        spec = PoolSpec.model_validate(pool.get("spec") or {})
    except ValidationError as error:
        raise PoolSpecError(spec_error(error)) from error
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
