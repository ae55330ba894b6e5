"""A pool is parsed once per spec: the backend reuses its last parse while the pool's uid, generation and spec are
the same, and parses again (and so sees the change) when any of them changes or the pool's deletion was observed."""

from __future__ import annotations

import copy

from backends.incluster.backend import IN_CLUSTER_POOL, InClusterBackend
from ipam_provider.backend.contract import BackendContext
from ipam_provider.common import Object
from tests.support.fake_kube import FakeKube

REF = IN_CLUSTER_POOL.ref("ns", "p")


def pool(addresses: str = "10.1.0.10-10.1.0.20", generation: int = 1, uid: str = "u1") -> Object:
    return {
        "apiVersion": "ipam.cluster.x-k8s.io/v1alpha2",
        "kind": "InClusterIPPool",
        "metadata": {"name": "p", "namespace": "ns", "generation": generation, "uid": uid, "resourceVersion": "7"},
        "spec": {"addresses": [addresses], "prefix": 24},
        "status": {"ipAddresses": {"used": 0}},
    }


def test_an_unchanged_pool_is_not_parsed_again_even_when_its_status_changes() -> None:
    backend = InClusterBackend(BackendContext(kube=FakeKube()))
    first = backend.parse(REF, pool())
    later = copy.deepcopy(pool())
    later["status"] = {"ipAddresses": {"used": 3}}
    later["metadata"]["resourceVersion"] = "9"
    assert backend.parse(REF, later) is first


def test_a_changed_spec_generation_or_uid_is_parsed_again() -> None:
    backend = InClusterBackend(BackendContext(kube=FakeKube()))
    first = backend.parse(REF, pool())
    changed = backend.parse(REF, pool("10.1.0.30-10.1.0.40"))
    assert first.why_not("10.1.0.30") is not None and changed.why_not("10.1.0.30") is None
    assert backend.parse(REF, pool("10.1.0.30-10.1.0.40", generation=2)).generation == 2
    assert backend.parse(REF, pool("10.1.0.30-10.1.0.40", generation=2, uid="u2")).uid == "u2"


def test_the_parse_of_a_deleted_pool_is_forgotten() -> None:
    backend = InClusterBackend(BackendContext(kube=FakeKube()))
    first = backend.parse(REF, pool())
    backend.observe_pool(IN_CLUSTER_POOL, pool(), None)
    assert backend.parse(REF, pool()) is not first
