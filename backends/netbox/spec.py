"""The NetboxIPPool / GlobalNetboxIPPool API (v1alpha1): pool kinds, the parsed spec, and the dnsName template.

The CRDs are generated from the models (their OpenAPI metadata: hack/gen_crds.py) and validate the same rules with
OpenAPI and CEL; `parse_pool` checks them again so that a pool the API server accepted under an older CRD still gets a
clear message instead of a crash, and checks what a structural schema cannot express (the nesting depth, entries and
string lengths of `customFields`, bounded by CUSTOM_FIELDS_DEPTH, CUSTOM_FIELDS_VALUES and CUSTOM_FIELDS_TEXT;
iteratively, so no shape can exhaust the stack). The admission webhook refuses what `parse_pool` refuses.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from backends.validation import NAMESPACE_NAME, NamedSecret, OpenAPI, PoolSpecError, Spec, parse_spec, rules
from ipam_provider.api.capi import IPAM_GROUP
from ipam_provider.backend.contract import ClaimContext, PoolKind, PoolRef
from ipam_provider.backend.tenancy import SECRET_REFS_LABEL, name_problem
from ipam_provider.common import Object

VERSION = "v1alpha1"
NETBOX_POOL = PoolKind(IPAM_GROUP, VERSION, "NetboxIPPool", "netboxippools", namespaced=True)
GLOBAL_NETBOX_POOL = PoolKind(IPAM_GROUP, VERSION, "GlobalNetboxIPPool", "globalnetboxippools", namespaced=False)

# The ownership marks every address we create carries. Only addresses with both are ever changed or deleted.
OWNER_TAG = "capi-ipam"
CLAIM_UID_FIELD = "capi_claim_uid"
# The claim's "<namespace>/<name>", recorded next to its UID: an address is re-keyed to a new claim UID (after a
# restore or clusterctl move) only for a claim of the same namespace and name.
CLAIM_REF_FIELD = "capi_claim_ref"
# The management cluster that made the address (BackendContext.cluster_identity): several management clusters may
# share one NetBox, and the repair loop lists as its own only addresses of its identity (none: never released).
CLUSTER_IDENTITY_FIELD = "capi_cluster_identity"
# IPAddress annotations (Allocation.annotations): the NetBox object and the claim it was made for.
ANNOTATION_IP_ID = "netbox.ipam.cluster.x-k8s.io/ip-id"
ANNOTATION_CLAIM_UID = "netbox.ipam.cluster.x-k8s.io/claim-uid"

STATUSES = ("active", "reserved", "deprecated", "dhcp", "slaac")
ROLES = ("loopback", "secondary", "anycast", "vip", "vrrp", "hsrp", "glbp", "carp")
PLACEHOLDERS = ("claim", "namespace", "cluster", "machine")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
DEFAULT_DESCRIPTION = "Cluster API claim {namespace}/{claim}"
MACHINE_KIND = "Machine"
SECRET_REF_FIELD = "spec.connection.secretRef"

# Bounds of the free-form and listed fields; the CRDs carry those a structural schema can express.
MAX_SOURCES = 32
MAX_TAGS = 32
NAME_LENGTH = 100  # a VRF name, a tenant or tag slug (NetBox allows 100 characters)
DNS_NAME_LENGTH = 255
DESCRIPTION_LENGTH = 200
CUSTOM_FIELDS = 64  # custom fields per pool
CUSTOM_FIELD_NAME_LENGTH = 50  # NetBox's limit on a custom field's name
CUSTOM_FIELDS_DEPTH = 8  # levels of objects and lists in one custom field's value (a scalar: 0)
CUSTOM_FIELDS_VALUES = 1024  # objects, lists, keys and scalars in all custom field values together
CUSTOM_FIELDS_TEXT = 4096  # characters of one string (a key or a value) in a custom field's value


TEMPLATE = OpenAPI(
    validations=rules(
        (
            f"self.matches('^([^{{}}]|[{{]({'|'.join(PLACEHOLDERS)})[}}])*$')",
            "the only placeholders are {claim}, {namespace}, {cluster} and {machine}",
        )
    )
)
IP = OpenAPI(maxLength=39, validations=rules(("isIP(self)", "must be an IP address")))
SLUG = OpenAPI(pattern="^[-a-zA-Z0-9_]+$")
ONE_VRF = ("!(has(self.vrf) && has(self.vrfID))", "set at most one of vrf and vrfID")
BY_ID_NO_VRF = (
    "!has(self.id) || (!has(self.vrf) && !has(self.vrfID))",
    "a source given by id takes its VRF from NetBox",
)
IPV4_LENGTH = (
    "!has(self.prefixLength) || self.prefixLength <= 32 || !("
    "(has(self.prefix) && has(self.prefix.cidr) && isCIDR(self.prefix.cidr) && "
    "cidr(self.prefix.cidr).ip().family() == 4) || "
    "(has(self.ipRange) && has(self.ipRange.start) && isIP(self.ipRange.start) && "
    "ip(self.ipRange.start).family() == 4))"
)


NetboxID = Annotated[int | None, OpenAPI(format="int64", minimum=1)]
PrefixLength = Annotated[int | None, OpenAPI(format="int64", minimum=0, maximum=128)]
Address = Annotated[str | None, IP]


class SecretRef(NamedSecret):
    """The generated CRD of the namespaced kind leaves `namespace` out (hack/gen_crds.py)."""

    namespace: Annotated[
        str | None,
        NAMESPACE_NAME,
        OpenAPI(
            "namespace of the Secret. The controller reads it only if the Namespace carries the label "
            f'{SECRET_REFS_LABEL}: "true".',
            required=True,
        ),
    ] = None


class ConnectionSpec(Spec):
    secret_ref: SecretRef = Field(alias="secretRef")
    """secretRef names the Secret with the keys url (NetBox's base URL, e.g. https://netbox.example.com), token (a v2
    token nbt_<key>.<secret>, sent as Bearer, or a v1 token, sent as Token) and optionally caBundle (PEM certificates
    to trust for NetBox's TLS certificate). A NetboxIPPool reads it from its own namespace; a GlobalNetboxIPPool names
    its namespace."""
    insecure_skip_verify: bool = Field(default=False, alias="insecureSkipVerify")
    """insecureSkipVerify turns off TLS certificate verification; never in production."""


class _NamedSource(Spec):
    """A NetBox object named by `id`, or by value (in the subclass's fields) in a VRF given by name or id."""

    id: int | None = None
    vrf: str | None = Field(default=None, max_length=NAME_LENGTH)
    """vrf is the name of the source's NetBox VRF; omitted means the global table."""
    vrf_id: NetboxID = Field(default=None, alias="vrfID")
    """vrfID is the NetBox id of the source's VRF (instead of vrf)."""


class PrefixSource(_NamedSource):
    openapi: ClassVar[OpenAPI] = OpenAPI(
        "prefix is a NetBox prefix: by id, or by cidr (and VRF).",
        validations=rules(("has(self.id) != has(self.cidr)", "set exactly one of id and cidr"), ONE_VRF, BY_ID_NO_VRF),
    )

    id: NetboxID = None
    """id is the NetBox id of the prefix."""
    cidr: Annotated[
        str | None,
        OpenAPI(
            maxLength=43,
            validations=rules(
                (
                    "isCIDR(self) && cidr(self) == cidr(self).masked()",
                    "must be a network in CIDR form, without host bits (e.g. 10.0.0.0/24)",
                )
            ),
        ),
    ] = None
    """cidr is the prefix, e.g. 10.0.0.0/24 or 2001:db8::/64."""


class RangeSource(_NamedSource):
    openapi: ClassVar[OpenAPI] = OpenAPI(
        "ipRange is a NetBox IP range: by id, or by start and end (and VRF).",
        validations=rules(
            ("has(self.start) == has(self.end)", "set both start and end"),
            ("has(self.id) != has(self.start)", "set either id, or start and end"),
            (
                "!has(self.start) || !has(self.end) || ip(self.start).family() == ip(self.end).family()",
                "start and end must be of one IP family",
            ),
            ONE_VRF,
            BY_ID_NO_VRF,
        ),
    )

    id: NetboxID = None
    """id is the NetBox id of the IP range."""
    start: Address = None
    """start is the first address of the range, without mask."""
    end: Address = None
    """end is the last address of the range, without mask."""


class SourceSpec(Spec):
    openapi: ClassVar[OpenAPI] = OpenAPI(
        "A source of addresses: exactly one of prefix and ipRange.",
        validations=rules(
            ("has(self.prefix) != has(self.ipRange)", "set exactly one of prefix and ipRange"),
            (IPV4_LENGTH, "prefixLength must be at most 32 for an IPv4 source"),
        ),
    )

    prefix: PrefixSource | None = None
    ip_range: RangeSource | None = Field(default=None, alias="ipRange")
    gateway: Address = None
    """gateway of the addresses from this source; overrides spec.gateway. A gateway inside the source must be recorded
    in NetBox as an IP address (else the pool is not Ready: GatewayNotRecorded); it is never given to a claim."""
    prefix_length: PrefixLength = Field(default=None, alias="prefixLength")
    """prefixLength of the addresses from this source; by default the source's own mask in NetBox. At most 32 for
    IPv4."""


class AddressFields(Spec):
    openapi: ClassVar[OpenAPI] = OpenAPI(
        "addressFields are written on every NetBox IP address the pool creates, next to the provider's ownership "
        f"marks (the tag {OWNER_TAG} and the custom field {CLAIM_UID_FIELD}). NetBox sets the VRF from the source. "
        "Templates may use {claim}, {namespace}, {cluster} and {machine} (the claim's Machine, else its controlling "
        "owner, else the claim)."
    )

    status: Annotated[str, OpenAPI(enum=list(STATUSES), defaulted=True)] = "active"
    """status of the addresses in NetBox."""
    role: Annotated[str | None, OpenAPI(enum=list(ROLES))] = None
    """role of the addresses in NetBox; none by default."""
    tenant: Annotated[str | None, SLUG] = Field(default=None, max_length=NAME_LENGTH)
    """tenant is the slug of the NetBox tenant of the addresses."""
    dns_name: Annotated[str | None, TEMPLATE] = Field(default=None, alias="dnsName", max_length=DNS_NAME_LENGTH)
    """dnsName is a template for the addresses' DNS name, e.g. {machine}.{cluster}.example.com."""
    description: Annotated[str | None, TEMPLATE] = Field(default=None, max_length=DESCRIPTION_LENGTH)
    """description is a template for the addresses' description (default: Cluster API claim {namespace}/{claim})."""
    tags: Annotated[
        list[str],
        OpenAPI(
            items=OpenAPI("a tag slug.", maxLength=NAME_LENGTH, **SLUG),
            validations=rules((f"!self.exists(t, t == '{OWNER_TAG}')", f"{OWNER_TAG} is the provider's own tag")),
            list_type="set",
        ),
    ] = Field(default_factory=list, max_length=MAX_TAGS)
    """tags are slugs of existing NetBox tags to put on the addresses."""
    custom_fields: Annotated[
        dict[str, Any],
        OpenAPI(
            "customFields are NetBox custom field values for the addresses, by field name (any JSON value; not "
            f"{CLAIM_UID_FIELD}, the provider's own), at most {CUSTOM_FIELDS}. The admission webhook refuses names "
            f"longer than {CUSTOM_FIELD_NAME_LENGTH} characters, values nested deeper than {CUSTOM_FIELDS_DEPTH} "
            f"levels of objects and lists, more than {CUSTOM_FIELDS_VALUES} values in all, and strings longer than "
            f"{CUSTOM_FIELDS_TEXT} characters.",
            additionalProperties={"x-kubernetes-preserve-unknown-fields": True},
        ),
    ] = Field(default_factory=dict, alias="customFields", max_length=CUSTOM_FIELDS)


class PoolSpec(Spec):
    openapi: ClassVar[OpenAPI] = OpenAPI(
        "spec says where in NetBox the pool's addresses come from and what they carry."
    )

    connection: ConnectionSpec
    """connection says how to reach NetBox."""
    sources: Annotated[list[SourceSpec], OpenAPI(minItems=1)] = Field(max_length=MAX_SOURCES)
    """sources are NetBox prefixes and IP ranges, in order: an address comes from the first one with room. All must be
    of one IP family."""
    gateway: Address = None
    """gateway of the pool's addresses, unless a source sets its own. A gateway inside a source must be recorded in
    NetBox as an IP address; it is never given to a claim."""
    prefix_length: PrefixLength = Field(default=None, alias="prefixLength")
    """prefixLength of the pool's addresses, unless a source sets its own; by default each source's mask. At most 32
    for IPv4 sources (checked against NetBox)."""
    address_fields: AddressFields = Field(default_factory=AddressFields, alias="addressFields")


@dataclass(frozen=True)
class SourceRef:
    """One source as the pool names it: a prefix or an ip-range, by id or by value (and VRF)."""

    type: Literal["prefix", "ipRange"]
    id: int | None
    value: str | None  # CIDR, or "start-end"
    vrf: str | None
    vrf_id: int | None
    gateway: str | None
    prefix_length: int | None

    def __str__(self) -> str:
        noun = "prefix" if self.type == "prefix" else "ip-range"
        if self.id is not None:
            return f"{noun} #{self.id}"
        vrf = f" in VRF {self.vrf}" if self.vrf else f" in VRF #{self.vrf_id}" if self.vrf_id else ""
        return f"{noun} {self.value}{vrf}"


@dataclass(frozen=True)
class Pool:
    """A parsed pool: what the backend needs, in a hashable shape."""

    ref: PoolRef
    uid: str  # the pool object's UID: a pool re-created under the same name is another pool
    generation: int
    secret_namespace: str
    secret_name: str
    insecure_skip_verify: bool
    sources: tuple[SourceRef, ...]
    fields: AddressFields


def parse_pool(ref: PoolRef, pool: Object) -> Pool:
    """The spec of the pool `ref`, checked; PoolSpecError says what is wrong."""
    spec = parse_spec(PoolSpec, pool)
    secret = spec.connection.secret_ref
    namespace = ref.namespace or secret.namespace
    if not namespace:
        raise PoolSpecError(f"{SECRET_REF_FIELD}.namespace is required for a cluster-scoped pool")
    if ref.namespace and secret.namespace not in (None, ref.namespace):
        raise PoolSpecError(f"{SECRET_REF_FIELD}.namespace must be empty or the pool's own namespace")
    if problem := name_problem(SECRET_REF_FIELD, secret.name, namespace):
        raise PoolSpecError(problem)
    if not spec.sources:
        raise PoolSpecError("spec.sources must name at least one NetBox prefix or ip-range")
    sources = tuple(_source(i, s, spec) for i, s in enumerate(spec.sources))
    _check_fields(spec.address_fields)
    return Pool(
        ref=ref,
        uid=str(pool["metadata"].get("uid") or ""),
        generation=int(pool["metadata"].get("generation") or 0),
        secret_namespace=namespace,
        secret_name=secret.name,
        insecure_skip_verify=spec.connection.insecure_skip_verify,
        sources=sources,
        fields=spec.address_fields,
    )


def _source(index: int, source: SourceSpec, spec: PoolSpec) -> SourceRef:
    where = f"spec.sources[{index}]"
    if (source.prefix is None) == (source.ip_range is None):
        raise PoolSpecError(f"{where}: set exactly one of prefix and ipRange")
    gateway = source.gateway or spec.gateway
    if gateway is not None:
        gateway = str(_check_ip(f"{where}.gateway" if source.gateway else "spec.gateway", gateway))
    length = source.prefix_length if source.prefix_length is not None else spec.prefix_length
    if length is not None and not 0 <= length <= 128:
        raise PoolSpecError(f"{where}.prefixLength must be between 0 and 128")
    if source.prefix is not None:
        named: _NamedSource = source.prefix
        value = source.prefix.cidr
        if (source.prefix.id is None) == (value is None):
            raise PoolSpecError(f"{where}.prefix: set exactly one of id and cidr")
        if value is not None:
            try:
                network = ipaddress.ip_network(value, strict=True)
            except ValueError as error:
                raise PoolSpecError(f"{where}.prefix.cidr: {value!r} is not a network in CIDR form") from error
            _check_length(where, length, network.version)
    else:
        assert source.ip_range is not None
        named = r = source.ip_range
        value = None
        if (r.id is None, r.start is None, r.end is None) not in ((True, False, False), (False, True, True)):
            raise PoolSpecError(f"{where}.ipRange: set either id, or both start and end")
        if r.start is not None and r.end is not None:
            start = _check_ip(f"{where}.ipRange.start", r.start)
            end = _check_ip(f"{where}.ipRange.end", r.end)
            if start.version != end.version or int(start) > int(end):
                raise PoolSpecError(f"{where}.ipRange: start and end must be of one family, start first")
            _check_length(where, length, start.version)
            value = f"{start}-{end}"
    kind: Literal["prefix", "ipRange"] = "prefix" if source.prefix is not None else "ipRange"
    if named.vrf is not None and named.vrf_id is not None:
        raise PoolSpecError(f"{where}.{kind}: set at most one of vrf and vrfID")
    if named.id is not None and (named.vrf is not None or named.vrf_id is not None):
        raise PoolSpecError(f"{where}.{kind}: a source given by id takes its VRF from NetBox; remove vrf/vrfID")
    return SourceRef(kind, named.id, value, named.vrf, named.vrf_id, gateway, length)


def _check_length(where: str, length: int | None, version: int) -> None:
    if length is not None and version == 4 and length > 32:
        raise PoolSpecError(f"{where}: prefixLength must be at most 32 for an IPv4 source (it is {length})")


def _check_ip(where: str, value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """`value` as a plain IP address; a prefix length ("10.0.0.1/24") is refused, as the CRD's isIP() does."""
    try:
        if "/" in value:
            raise ValueError(value)
        return ipaddress.ip_address(value.strip())
    except ValueError as error:
        raise PoolSpecError(f"{where}: {value!r} is not an IP address") from error


def _check_fields(fields: AddressFields) -> None:
    where = "spec.addressFields"
    if fields.status not in STATUSES:
        raise PoolSpecError(f"{where}.status must be one of {', '.join(STATUSES)}")
    if fields.role is not None and fields.role not in ROLES:
        raise PoolSpecError(f"{where}.role must be one of {', '.join(ROLES)}")
    for name, template in (("dnsName", fields.dns_name), ("description", fields.description)):
        for placeholder in _PLACEHOLDER.findall(template or ""):
            if placeholder not in PLACEHOLDERS:
                raise PoolSpecError(
                    f"{where}.{name}: unknown placeholder {{{placeholder}}}; use "
                    + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
                )
    for reserved in (CLAIM_UID_FIELD, CLAIM_REF_FIELD, CLUSTER_IDENTITY_FIELD):
        if reserved in fields.custom_fields:
            raise PoolSpecError(f"{where}.customFields: {reserved} is set by the provider")
    for name in fields.custom_fields:
        if len(name) > CUSTOM_FIELD_NAME_LENGTH:
            raise PoolSpecError(
                f"{where}.customFields: a NetBox custom field name has at most {CUSTOM_FIELD_NAME_LENGTH} characters "
                f"({name[:CUSTOM_FIELD_NAME_LENGTH]!r}... has {len(name)})"
            )
    if problem := shape_problem(fields.custom_fields):
        raise PoolSpecError(f"{where}.customFields{problem}")
    if OWNER_TAG in fields.tags:
        raise PoolSpecError(f"{where}.tags: {OWNER_TAG} is added by the provider")


def shape_problem(custom_fields: Mapping[str, Any]) -> str | None:
    """What makes `custom_fields` (the values of JSON objects and lists) too large, or None: more than
    CUSTOM_FIELDS_DEPTH levels in one value, more than CUSTOM_FIELDS_VALUES entries in all, or a string (key or
    value) longer than CUSTOM_FIELDS_TEXT characters. The answer starts with the path of the offending entry
    (".name[3].key: ..."). Iterative, and it stops at the first problem, so its cost is bounded by the bounds."""
    pending: list[tuple[str, Any, int]] = [(f".{name}", value, 0) for name, value in custom_fields.items()]
    seen = len(pending)
    while pending:
        path, value, depth = pending.pop()
        if isinstance(value, str) and len(value) > CUSTOM_FIELDS_TEXT:
            return f"{path}: a string of {len(value)} characters; at most {CUSTOM_FIELDS_TEXT} are allowed"
        if not isinstance(value, dict | list):
            continue
        if depth == CUSTOM_FIELDS_DEPTH:
            return f"{path}: nested deeper than {CUSTOM_FIELDS_DEPTH} levels of objects and lists"
        seen += len(value)
        if seen > CUSTOM_FIELDS_VALUES:
            return f": more than {CUSTOM_FIELDS_VALUES} values in all custom fields together"
        for key, item in value.items() if isinstance(value, dict) else enumerate(value):
            if isinstance(key, str) and len(key) > CUSTOM_FIELDS_TEXT:
                return f"{path}: a key of {len(key)} characters; at most {CUSTOM_FIELDS_TEXT} are allowed"
            pending.append((f"{path}.{key[:40]}" if isinstance(key, str) else f"{path}[{key}]", item, depth + 1))
    return None


def machine_name(claim: ClaimContext) -> str:
    """The claim's machine: its owning Machine, else its controlling owner (an infrastructure machine, named like
    its Machine), else the claim itself."""
    owners = list(claim.owner_references)
    for owner in owners:
        if owner.get("kind") == MACHINE_KIND and str(owner.get("apiVersion", "")).startswith("cluster.x-k8s.io/"):
            return str(owner.get("name", ""))
    for owner in owners:
        if owner.get("controller"):
            return str(owner.get("name", ""))
    return claim.name


def render(template: str, claim: ClaimContext) -> str:
    """`template` with {claim}, {namespace}, {cluster} and {machine} replaced."""
    values: Mapping[str, str] = {
        "claim": claim.name,
        "namespace": claim.namespace,
        "cluster": claim.cluster_name or "",
        "machine": machine_name(claim),
    }
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)
