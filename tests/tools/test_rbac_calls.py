"""config/rbac grants exactly what the code requests: the requests are derived from the code (tools/rbac_calls.py)
and compared with the ClusterRole and the leader-election Role both ways. The derivation itself is tested: a call
whose Resource it cannot follow fails the test with its line, and a new request shows as missing from config/rbac.
(The grants are proved against a real RBAC authorizer in tests/system/test_rbac.py.)"""

from __future__ import annotations

import functools

import pytest

from tools.rbac_calls import (
    ANY,
    OWN_NAMESPACE,
    Derivation,
    Grant,
    Request,
    config_grants,
    derive,
    missing,
    unused,
)

IPAM = "ipam.cluster.x-k8s.io"
STANDARD_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


@functools.cache
def derived() -> Derivation:
    return derive()


def test_every_request_of_the_code_is_derived() -> None:
    unresolved = "\n".join(derived().unresolved)
    assert not unresolved, f"requests whose resource cannot be derived (see tools/rbac_calls.py):\n{unresolved}"


def test_config_rbac_grants_every_request_the_code_makes() -> None:
    requests = derived().requests
    lacking = [f"{request}: {requests[request][0]}" for request in missing(requests, config_grants())]
    assert not lacking, "config/rbac lacks grants the code needs:\n" + "\n".join(lacking)


def test_config_rbac_grants_nothing_the_code_does_not_request() -> None:
    excess = unused(derived().requests, config_grants())
    assert not excess, "config/rbac grants what no request needs:\n" + "\n".join(map(str, excess))


def test_removing_any_grant_leaves_a_request_ungranted() -> None:
    granted = config_grants()
    for index, grant in enumerate(granted):
        fewer = granted[:index] + granted[index + 1 :]
        assert missing(derived().requests, fewer), f"nothing needs {grant}"


ADDED = [
    Grant("ClusterRole", "update", IPAM, "ipaddressclaims"),
    Grant("ClusterRole", "update", IPAM, "ipaddresses"),
    Grant("ClusterRole", "update", IPAM, "inclusterippools"),
    Grant("ClusterRole", "watch", IPAM, "inclusteripreservations"),
    Grant("ClusterRole", "list", IPAM, "infobloxinstances"),
    Grant("ClusterRole", "list", "cluster.x-k8s.io", "machines"),
    Grant("ClusterRole", "list", "", "secrets"),
    Grant("ClusterRole", "get", "coordination.k8s.io", "leases"),  # the Role grants it in the controller's namespace
    Grant("ClusterRole", "*", IPAM, "ipaddressclaims"),
    Grant("ClusterRole", "get", "", "configmaps"),
    Grant("Role", "delete", "coordination.k8s.io", "leases"),
    Grant("ClusterRole", "get", "", "namespaces"),  # a duplicate of a grant config/rbac has
]


@pytest.mark.parametrize("extra", ADDED, ids=str)
def test_an_added_grant_the_code_does_not_use_is_found(extra: Grant) -> None:
    assert extra in unused(derived().requests, [*config_grants(), extra])


def test_every_verb_the_code_does_not_use_on_a_resource_is_found_when_granted() -> None:
    requests, granted = derived().requests, config_grants()
    for group, resource in {(request.group, request.resource) for request in requests}:
        for verb in STANDARD_VERBS:
            extra = Grant("ClusterRole", verb, group, resource)
            if not any(extra.covers(request) for request in requests):
                assert extra in unused(requests, [*granted, extra]), extra


def test_the_leader_election_lease_is_requested_only_in_the_controllers_namespace() -> None:
    leases = {r for r in derived().requests if r.resource == "leases"}
    assert {(r.verb, r.namespace) for r in leases} == {(v, OWN_NAMESPACE) for v in ("get", "create", "patch")}


PROBE = """
import functools

import kubernetes_asyncio
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.api.capi import CLAIMS
from ipam_provider.runtime.kube.resources import NAMESPACES, SECRETS, Resource

async def probe(kube: KubeClient, plural: str) -> None:
    await kube.delete(SECRETS, "s", "ns")
    await kube.get(Resource("example.com", "v1", plural, "Example", namespaced=True), "x")
    delete = functools.partial(kube.delete, SECRETS)
    await delete("t", "ns")
    watched = [CLAIMS]
    watched.append(NAMESPACES)
    for resource in watched:
        await kube.watch(resource, resource_version="1")
"""


def test_a_new_request_is_derived_and_what_cannot_be_followed_is_named_with_its_line() -> None:
    probed = derive(extra={"ipam_provider.rbac_probe": PROBE})
    assert Request("delete", "", "secrets", "ns", "s") in probed.requests
    assert Request("delete", "", "secrets", "ns", "s") in missing(probed.requests, config_grants())
    assert {Request("watch", IPAM, "ipaddressclaims"), Request("watch", "", "namespaces")} <= set(probed.requests)
    found = sorted(line for line in probed.unresolved if line.startswith("ipam_provider/rbac_probe.py:"))
    assert len(found) == 3, probed.unresolved
    assert found[0].startswith("ipam_provider/rbac_probe.py:11:") and "plural" in found[0]  # the Resource unknown
    assert found[1].startswith("ipam_provider/rbac_probe.py:12:") and "passed on" in found[1]  # wrapped in a partial
    assert found[2].startswith("ipam_provider/rbac_probe.py:4:") and "kubernetes_asyncio" in found[2]
    assert ANY not in {r.group for r in probed.requests}
