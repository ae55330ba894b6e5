"""The prefix pools' admission checks on their own (the webhook with the real API server: tests/webhook)."""

from __future__ import annotations

from typing import Any, cast

from backends.incluster.prefix_backend import IN_CLUSTER_PREFIX_POOL, InClusterPrefixBackend
from backends.incluster.prefix_spec import prefix_pool_change_problems
from ipam_provider.admission import PoolAdmission
from ipam_provider.backend.contract import AddressInUse, BackendContext, PoolRef
from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.common import Object
from ipam_provider.runtime.kube.client import KubeClient

REVERSED = "provided entry is not a valid IP, range, nor CIDR: fd00::9-fd00::1"


def pool(prefixes: list[str], **spec: Any) -> Object:
    return {"metadata": {"name": "net", "namespace": "ns"}, "spec": {"prefixes": prefixes, **spec}}


def used(*children: str, prefix: int | None = 64) -> list[AddressInUse]:
    return [AddressInUse("ns", f"m{i}", child, f"ns/m{i}", prefix) for i, child in enumerate(children)]


def stranded(count: int) -> str:
    return f"existing allocations become non-allocatable: the new spec leaves out {count} address(es) in use "


def test_only_the_children_a_change_strands_are_counted() -> None:
    old = pool(["fd00::/62"])  # fd00::, fd00:0:0:1::, fd00:0:0:2::, fd00:0:0:3::
    in_use = used("fd00:0:0:1::", "fd00::", "fd00:0:0:3::", "fd00:0:0:9::")  # the last: outside the pool already
    (problem,) = prefix_pool_change_problems(old, pool(["fd00:0:0:2::/63"]), in_use)
    columns = "NAMESPACE:.metadata.namespace,NAME:.metadata.name,KIND:.spec.poolRef.kind,POOL:.spec.poolRef.name"
    assert problem == (
        f"{stranded(2)}(`kubectl get ipaddresses.ipam.cluster.x-k8s.io -n ns -o custom-columns={columns}` lists "
        "them); keep their prefixes in the pool or release them first"
    )
    # An excluded entry overlapping a child in use strands it, however little of it it covers.
    (problem,) = prefix_pool_change_problems(old, pool(["fd00::/62"], excludedPrefixes=["fd00:0:0:3::5"]), in_use)
    assert problem.startswith(stranded(1))
    # Widening, excluding free children, and setting the gateway (which blocks nothing) keep every child in use.
    assert prefix_pool_change_problems(old, pool(["fd00::/60"]), in_use) == []
    assert prefix_pool_change_problems(old, pool(["fd00::/62"], excludedPrefixes=["fd00:0:0:2::/64"]), in_use) == []
    assert prefix_pool_change_problems(old, pool(["fd00::/62"], gateway="fd00::1"), in_use) == []


def test_changes_to_anything_but_the_spec_are_never_refused() -> None:
    stranding = pool(["fd00:0:0:8::/64"])
    annotated = {**stranding, "metadata": {**stranding["metadata"], "annotations": {"a": "b"}}}
    assert prefix_pool_change_problems(stranding, annotated, used("fd00::")) == []
    # An old spec the backend cannot parse: every child outside the new one counts.
    broken = pool(["fd00::/62"], excludedPrefixes=["fd00::9-fd00::1"])
    (problem,) = prefix_pool_change_problems(broken, stranding, used("fd00::"))
    assert problem.startswith(stranded(1))


def test_a_child_of_another_length_is_not_allocatable() -> None:
    old = pool(["fd00::/62"])
    # An IPAddress of another length was not one the pool hands out before the change either: not named.
    assert prefix_pool_change_problems(old, pool(["fd00:0:0:2::/63"]), used("fd00::", prefix=128)) == []
    # Without a prefix, the IPAddress is taken to carry the pool's allocation length.
    (problem,) = prefix_pool_change_problems(old, pool(["fd00:0:0:2::/63"]), used("fd00::", prefix=None))
    assert problem.startswith(stranded(1))
    # A changed allocationPrefixLength (the CRD refuses it first) strands every child in use.
    (problem,) = prefix_pool_change_problems(old, pool(["fd00::/62"], allocationPrefixLength=63), used("fd00::"))
    assert problem.startswith(stranded(1))


def test_ipv4_and_many_holders_counted() -> None:
    old = pool(["10.0.0.0/20"], allocationPrefixLength=24)
    in_use = used(*(f"10.0.{third}.0" for third in range(12)), prefix=24)
    (problem,) = prefix_pool_change_problems(old, pool(["10.0.12.0/22"], allocationPrefixLength=24), in_use)
    assert problem.startswith(stranded(12))
    assert not any(f"10.0.{third}.0" in problem or f"m{third}" in problem for third in range(12)), problem


def test_an_unusable_spec_is_refused_with_the_backends_message() -> None:
    reversed_range = pool(["fd00::/62"], excludedPrefixes=["fd00::9-fd00::1"])
    assert prefix_pool_change_problems(None, reversed_range, []) == [
        f"the pool's spec is invalid: {REVERSED} (spec.excludedPrefixes[0])"
    ]
    (problem,) = prefix_pool_change_problems(None, pool(["fd00::/62"], allocationPrefixLength="x"), [])
    assert problem.startswith("the pool's spec is invalid: spec.allocationPrefixLength: ")
    # On UPDATE, a problem the old spec had already does not block another change; a new one does, alone.
    widened = pool(["fd00::/60"], excludedPrefixes=["fd00::9-fd00::1"])
    assert prefix_pool_change_problems(reversed_range, widened, used("fd00::")) == []
    worse = pool(["fd00::/60"], excludedPrefixes=["fd00::9-fd00::1", "fd00::7-fd00::2"])
    assert prefix_pool_change_problems(reversed_range, worse, []) == [
        "the pool's spec is invalid: provided entry is not a valid IP, range, nor CIDR: fd00::7-fd00::2 "
        "(spec.excludedPrefixes[1])"
    ]
    assert prefix_pool_change_problems(pool(["fd00::/62"]), None, used("fd00::")) == []  # DELETE: the core's


def ip_address(name: str, address: str, prefix: int) -> Object:
    pool_ref = {"apiGroup": IN_CLUSTER_PREFIX_POOL.group, "kind": IN_CLUSTER_PREFIX_POOL.kind, "name": "net"}
    spec = {"address": address, "prefix": prefix, "poolRef": pool_ref, "claimRef": {"name": name}}
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": spec}


async def test_the_backend_reviews_with_each_ipaddress_prefix_length() -> None:
    """The webhook's IPAddresses in use carry their prefix length to the prefix backend's review."""
    kube = cast(KubeClient, object())  # never used: the cache stand-in answers
    backend = InClusterPrefixBackend(BackendContext(kube=kube))
    items = [ip_address("child", "fd00::", 64), ip_address("host", "fd00:0:0:1::", 128)]
    admission = PoolAdmission(kube, BackendRegistry([backend]), lambda ref: items)
    ref = PoolRef(IN_CLUSTER_PREFIX_POOL.group, IN_CLUSTER_PREFIX_POOL.kind, "ns", "net")
    try:
        in_use = await admission.addresses_in_use(ref)
        assert [(str(address), address.prefix) for address in in_use] == [("ns/child", 64), ("ns/host", 128)]
        review = backend.capabilities().review_pool_change
        assert review is not None
        # The /128 was never a child the pool hands out: only the /64 is stranded.
        (problem,) = await review(ref, pool(["fd00::/62"]), pool(["fd00:0:0:2::/63"]), in_use)
        assert problem.startswith(stranded(1)) and "child" not in problem
    finally:
        await backend.close()
