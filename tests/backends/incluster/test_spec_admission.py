"""The in-cluster backend's admission checks on their own (the webhook with the real API server: tests/webhook)."""

from __future__ import annotations

from typing import Any

from backends.incluster.spec import pool_change_problems
from ipam_provider.backend.contract import AddressInUse
from ipam_provider.common import Object


def pool(addresses: list[str], prefix: int = 24, **spec: Any) -> Object:
    return {"metadata": {"name": "net", "namespace": "ns"}, "spec": {"addresses": addresses, "prefix": prefix, **spec}}


def used(*addresses: str) -> list[AddressInUse]:
    return [AddressInUse("ns", f"m{i}", address, f"ns/m{i}") for i, address in enumerate(addresses)]


LISTING = "(`kubectl get ipaddresses.ipam.cluster.x-k8s.io -n ns -o custom-columns="


def stranded(count: int) -> str:
    return f"pool addresses do not contain allocated addresses: the new spec leaves out {count} address(es) in use "


def names_nothing_in_use(problem: str, in_use: list[AddressInUse]) -> bool:
    """Whether the refusal names no IPAddress, claim or address in use (a review's requester is not known)."""
    return not any(text in problem for address in in_use for text in (address.name, address.address, address.claim))


def test_only_the_addresses_a_change_strands_are_counted() -> None:
    old = pool(["10.0.0.10-10.0.0.20"])
    in_use = used("10.0.0.10", "10.0.0.11", "10.0.0.13", "10.0.0.99")  # .99: outside the pool already
    (problem,) = pool_change_problems(old, pool(["10.0.0.12-10.0.0.20"], excludedAddresses=["10.0.0.13"]), in_use)
    assert problem.startswith(stranded(3) + LISTING) and problem.endswith("keep them in the pool or release them first")
    assert names_nothing_in_use(problem, in_use), problem
    assert pool_change_problems(old, pool(["10.0.0.10-10.0.0.30"]), in_use) == []
    # A gateway or, without allocateReservedIPAddresses, the network address are not allocatable either.
    (problem,) = pool_change_problems(old, pool(["10.0.0.10-10.0.0.20"], gateway="10.0.0.11"), in_use)
    assert problem.startswith(stranded(1))


def test_changes_to_anything_but_the_spec_are_never_refused() -> None:
    stranding = pool(["10.0.0.50"])
    annotated = {**stranding, "metadata": {**stranding["metadata"], "annotations": {"a": "b"}}}
    assert pool_change_problems(stranding, annotated, used("10.0.0.10")) == []
    # An old spec the backend cannot parse: every address outside the new one counts.
    (problem,) = pool_change_problems(pool(["10.0.0.5", "10.1.0.5"]), stranding, used("10.0.0.10"))
    assert problem.startswith(stranded(1))


def test_ipv6_and_many_holders() -> None:
    old = pool(["fd00::10-fd00::ff"], 64)
    in_use = used(*(f"fd00::{value:x}" for value in range(0x10, 0x20)))
    (problem,) = pool_change_problems(old, pool(["fd00::20-fd00::ff"], 64), in_use)
    assert problem.startswith(stranded(16)) and names_nothing_in_use(problem, in_use)


def test_pre_allocations() -> None:
    in_use = used("10.0.0.10")
    base = pool(["10.0.0.10-10.0.0.20"])
    (not_a_map,) = pool_change_problems(None, pool(["10.0.0.10-10.0.0.20"], preAllocations=["x"]), in_use)
    assert not_a_map.startswith("the pool's spec is invalid: ") and "preAllocations" in not_a_map
    (held,) = pool_change_problems(base, pool(["10.0.0.10-10.0.0.20"], preAllocations={"other": "10.0.0.10"}), in_use)
    assert held.startswith(
        f"spec.preAllocations[other]: 10.0.0.10 is already held by another claim's IPAddress {LISTING}"
    )
    assert "m0" not in held  # the address is the submitted spec's own; its holder is not named
    assert pool_change_problems(base, pool(["10.0.0.10-10.0.0.20"], preAllocations={"m0": "10.0.0.10"}), in_use) == []
    # A problem the old spec had already is not a reason to refuse another change.
    broken = pool(["10.0.0.10-10.0.0.20"], preAllocations={"other": "10.0.0.10"})
    widened = pool(["10.0.0.10-10.0.0.30"], preAllocations={"other": "10.0.0.10"})
    assert pool_change_problems(broken, widened, in_use) == []
    assert pool_change_problems(None, widened, in_use) == [held]
    # A GlobalInClusterIPPool names its claims as namespace/name; the claim's bare name is another claim's key.
    global_pool = pool(["10.0.0.10-10.0.0.20"], preAllocations={"ns/m0": "10.0.0.10"})
    global_pool["metadata"] = {"name": "net"}
    assert pool_change_problems(None, global_pool, in_use) == []
    global_pool["spec"]["preAllocations"] = {"other/m0": "10.0.0.10"}
    (held_elsewhere,) = pool_change_problems(None, global_pool, in_use)
    assert held_elsewhere.startswith("spec.preAllocations[other/m0]: 10.0.0.10 is already held by another claim's ")
    assert "ns/m0" not in held_elsewhere and "-A -o custom-columns=" in held_elsewhere


def test_an_unusable_spec_is_refused_with_the_backends_message() -> None:
    (problem,) = pool_change_problems(None, pool(["10.0.0.20-10.0.0.10"]), [])
    assert (
        problem
        == "the pool's spec is invalid: provided address is not a valid IP, range, nor CIDR: 10.0.0.20-10.0.0.10 "
        "(spec.addresses[0])"
    )
    (problem,) = pool_change_problems(None, pool(["10.0.0.1"], prefix="x"), [])  # type: ignore[arg-type]
    assert problem.startswith("the pool's spec is invalid: ")
    assert pool_change_problems(pool(["10.0.0.1"]), None, used("10.0.0.1")) == []  # DELETE: the core's


def test_a_family_switch_strands_every_address_the_old_pool_held() -> None:
    in_use = used("10.0.0.10", "10.0.0.11", "10.0.0.13", "10.9.9.9", "fd00::99")  # 10.9.9.9, fd00::99: outside
    (problem,) = pool_change_problems(pool(["10.0.0.10-10.0.0.20"]), pool(["fd00::/120"], 120), in_use)
    assert problem.startswith(stranded(3)) and names_nothing_in_use(problem, in_use)
    # And back: the IPv6 addresses held go, the IPv4 ones the IPv6 pool never held are not this change's doing.
    in_use = used("fd00::10", "fd00::11", "10.0.0.10")
    (problem,) = pool_change_problems(pool(["fd00::10-fd00::20"], 64), pool(["10.0.0.0/24"]), in_use)
    assert problem.startswith(stranded(2))
    # An old spec the backend cannot parse: every address outside the new one counts, of either family.
    (problem,) = pool_change_problems(pool(["10.0.0.5", "10.1.0.5"]), pool(["fd00::/120"], 120), used("10.0.0.5"))
    assert problem.startswith(stranded(1))
    # Addresses that are not addresses (or carry an IPv6 zone) are no pool's.
    assert pool_change_problems(pool(["10.0.0.0/24"]), pool(["fd00::/120"], 120), used("x", "fe80::1%eth0")) == []
