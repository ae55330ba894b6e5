"""The NetboxIPPool API: what the CRDs refuse at admission (real API server), what `parse_pool` refuses (and with
it the admission webhook: `review_pool_change`), and the dnsName/description templates. No NetBox needed."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from backends.netbox import NetboxBackend
from backends.netbox.spec import (
    CUSTOM_FIELDS_DEPTH,
    CUSTOM_FIELDS_TEXT,
    CUSTOM_FIELDS_VALUES,
    machine_name,
    parse_pool,
    render,
)
from backends.validation import PoolSpecError
from ipam_provider.backend.contract import BackendContext, ClaimContext, PoolRef
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from tests.support.netbox_backend import GLOBAL_NB_POOLS, NB_POOLS, ip_range, netbox_pool, prefix

Object = dict[str, Any]


def good() -> Object:
    return netbox_pool("p", [prefix("10.0.0.0/24", gateway="10.0.0.1"), ip_range("10.0.1.10", "10.0.1.20")])


def with_spec(**changes: Any) -> Object:
    body = copy.deepcopy(good())
    body["spec"].update(changes)
    return body


REFUSED: list[tuple[str, Object, str]] = [
    ("both kinds in one source", with_spec(sources=[{**prefix("10.0.0.0/24"), **ip_range(id=3)}]), "exactly one of"),
    ("prefix by id and cidr", with_spec(sources=[{"prefix": {"id": 3, "cidr": "10.0.0.0/24"}}]), "exactly one of"),
    ("not a CIDR", with_spec(sources=[prefix("10.0.0.1/24")]), "CIDR"),
    ("range without end", with_spec(sources=[{"ipRange": {"start": "10.0.0.1"}}]), "start and end"),
    ("range of two families", with_spec(sources=[ip_range("10.0.0.1", "2001:db8::1")]), "family"),
    ("vrf on a source by id", with_spec(sources=[{"prefix": {"id": 3, "vrf": "blue"}}]), "VRF from NetBox"),
    ("no source", with_spec(sources=[]), "source"),
    ("bad gateway", with_spec(gateway="10.0.0.300"), "IP address"),
    ("unknown placeholder", with_spec(addressFields={"dnsName": "{host}.example.com"}), "placeholder"),
    ("our own tag", with_spec(addressFields={"tags": ["capi-ipam"]}), "capi-ipam"),
    ("bad status", with_spec(addressFields={"status": "free"}), "status"),
    ("prefix length", with_spec(prefixLength=129), "128"),
    ("gateway with a mask", with_spec(gateway="10.0.0.1/24"), "IP address"),
    ("IPv4 prefix length 64", with_spec(sources=[prefix("10.0.0.0/24", prefixLength=64)]), "at most 32"),
    ("IPv4 range length 33", with_spec(sources=[{**ip_range("10.0.1.10", "10.0.1.20"), "prefixLength": 33}]), "32"),
    (
        "a Secret name that is a path",
        with_spec(connection={"secretRef": {"name": "../../team-b/secrets/netbox"}}),
        "secretRef.name",
    ),
    ("an upper-case Secret name", with_spec(connection={"secretRef": {"name": "NetBox"}}), "secretRef.name"),
    ("a tenant slug too long", with_spec(addressFields={"tenant": "t" * 101}), "tenant"),
]


def in_namespace(body: Object) -> Object:
    """`body` in namespace ns (a shallow copy: deepcopy cannot copy the deepest shapes)."""
    return {**body, "metadata": {**body["metadata"], "namespace": "ns"}}


def nested(levels: int) -> Any:
    """A JSON value of `levels` lists, one in the other, around a string."""
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


def custom_fields(value: Any) -> Object:
    return with_spec(addressFields={"customFields": {"field": value}})


# What the structural schema lets through (customFields values are x-kubernetes-preserve-unknown-fields) and the
# parser, hence the webhook, refuses: the message names the field and the bound.
TOO_LARGE: list[tuple[str, Object, str]] = [
    ("nested one level too deep", custom_fields(nested(CUSTOM_FIELDS_DEPTH + 1)), "deeper than 8 levels"),
    ("nested 100,000 levels deep", custom_fields(nested(100_000)), "deeper than 8 levels"),
    ("a long string", custom_fields({"k": "x" * (CUSTOM_FIELDS_TEXT + 1)}), "customFields.field.k: a string of 4097"),
    ("a long key", custom_fields({"k" * (CUSTOM_FIELDS_TEXT + 1): 1}), "a key of 4097 characters"),
    ("a custom field name too long", with_spec(addressFields={"customFields": {"f" * 51: 1}}), "50 characters"),
    ("too many values", custom_fields(list(range(CUSTOM_FIELDS_VALUES))), f"more than {CUSTOM_FIELDS_VALUES} values"),
]


@pytest.mark.parametrize(("case", "body", "hint"), REFUSED, ids=[c[0] for c in REFUSED])
async def test_the_crd_refuses(kube: KubeClient, namespace: str, case: str, body: Object, hint: str) -> None:
    with pytest.raises(ApiError) as refused:
        await kube.create(NB_POOLS, body, namespace)
    assert refused.value.status == 422
    assert hint.lower() in refused.value.message.lower(), refused.value.message


@pytest.mark.parametrize(("case", "body", "hint"), REFUSED + TOO_LARGE, ids=[c[0] for c in REFUSED + TOO_LARGE])
def test_parse_pool_refuses(case: str, body: Object, hint: str) -> None:
    body = in_namespace(body)
    with pytest.raises(PoolSpecError):
        parse_pool(PoolRef.from_object(body), body)


@pytest.mark.parametrize(("case", "body", "hint"), TOO_LARGE, ids=[c[0] for c in TOO_LARGE])
async def test_the_webhook_refuses_what_the_schema_cannot_bound(case: str, body: Object, hint: str) -> None:
    body = in_namespace(body)
    backend = NetboxBackend(BackendContext(kube=None))  # type: ignore[arg-type]  # the review reads nothing
    problems = await backend.review_pool_change(PoolRef.from_object(body), None, body, [])
    assert len(problems) == 1 and problems[0].startswith("spec.addressFields.customFields"), problems
    assert hint in problems[0], problems


async def test_the_webhook_allows_the_largest_shapes_and_every_delete() -> None:
    largest = {
        "deep": nested(CUSTOM_FIELDS_DEPTH),
        "wide": list(range(CUSTOM_FIELDS_VALUES - CUSTOM_FIELDS_DEPTH - 3)),  # 1,024 values with the three fields
        "long": "x" * CUSTOM_FIELDS_TEXT,
    }
    body = in_namespace(with_spec(addressFields={"customFields": largest}))
    backend = NetboxBackend(BackendContext(kube=None))  # type: ignore[arg-type]  # the review reads nothing
    ref = PoolRef.from_object(body)
    assert await backend.review_pool_change(ref, None, body, []) == []
    too_deep = custom_fields(nested(CUSTOM_FIELDS_DEPTH + 1))
    assert await backend.review_pool_change(ref, too_deep, None, []) == []  # DELETE: never refused for its spec


async def test_the_crds_accept_the_full_shape(kube: KubeClient, namespace: str) -> None:
    fields = {
        "status": "active",
        "role": "vip",
        "tenant": "acme",
        "dnsName": "{machine}.{cluster}.example.com",
        "description": "{namespace}/{claim}",
        "tags": ["k8s"],
        "customFields": {"environment": "prod", "rack": 12, "managed": True},
    }
    sources = [
        prefix("10.0.0.0/24", vrf="blue", gateway="10.0.0.1", prefixLength=16),
        {"prefix": {"id": 4}},
        ip_range("2001:db8::10", "2001:db8::20"),
        {"ipRange": {"id": 5}},
    ]
    created = await kube.create(NB_POOLS, netbox_pool("full", sources, addressFields=fields), namespace)
    assert created["spec"]["addressFields"]["customFields"] == fields["customFields"]
    parsed = parse_pool(PoolRef.from_object(created), created)
    assert [str(s) for s in parsed.sources] == [
        "prefix 10.0.0.0/24 in VRF blue",
        "prefix #4",
        "ip-range 2001:db8::10-2001:db8::20",
        "ip-range #5",
    ]
    assert parsed.sources[0].prefix_length == 16 and parsed.sources[1].gateway is None
    body = netbox_pool("cluster-wide", [prefix("10.0.0.0/24")])
    body.update(apiVersion=GLOBAL_NB_POOLS.api_version, kind=GLOBAL_NB_POOLS.kind)
    with pytest.raises(ApiError, match="namespace"):
        await kube.create(GLOBAL_NB_POOLS, body)


def test_parse_pool_takes_the_secret_namespace_from_the_pool() -> None:
    body = good()
    body["metadata"].update(namespace="team-a", generation=3)
    parsed = parse_pool(PoolRef.from_object(body), body)
    assert (parsed.secret_namespace, parsed.secret_name, parsed.generation) == ("team-a", "netbox", 3)
    body["spec"]["connection"]["secretRef"]["namespace"] = "elsewhere"
    with pytest.raises(PoolSpecError, match="own namespace"):
        parse_pool(PoolRef.from_object(body), body)


def test_parse_pool_refuses_a_global_pool_secret_namespace_that_is_not_a_label() -> None:
    body = good()
    body.update(apiVersion=GLOBAL_NB_POOLS.api_version, kind=GLOBAL_NB_POOLS.kind)
    body["spec"]["connection"]["secretRef"] = {"name": "netbox", "namespace": "../team-b"}
    with pytest.raises(PoolSpecError, match=r"secretRef\.namespace"):
        parse_pool(PoolRef.from_object(body), body)
    body["spec"]["connection"]["secretRef"]["namespace"] = "team-b"
    assert parse_pool(PoolRef.from_object(body), body).secret_namespace == "team-b"


def test_templates_and_the_machine_name() -> None:
    infra = {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "VSphereMachine", "name": "vm-1"}
    machine = {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "name": "md-0-abc"}
    plain = ClaimContext("ns", "claim-0", "uid")
    assert machine_name(plain) == "claim-0"
    assert machine_name(ClaimContext("ns", "c", "u", owner_references=[{**infra, "controller": True}])) == "vm-1"
    owned = ClaimContext("ns", "c", "u", cluster_name="prod", owner_references=[infra, machine])
    assert machine_name(owned) == "md-0-abc"
    assert render("{machine}.{cluster}.example.com", owned) == "md-0-abc.prod.example.com"
    assert render("{namespace}/{claim}", owned) == "ns/c"
