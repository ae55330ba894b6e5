"""Admission answers rest on a pool's addresses in use only for a review of the pool as stored (docs/admission.md,
"What an answer tells"): a review whose old object has not the stored pool's uid (and, UPDATE, resourceVersion), or a
CREATE of a pool that exists, is reviewed on its spec alone. The caches answer; a pool they lack is read by a GET."""

from __future__ import annotations

import copy
from typing import Any, cast

from backends.incluster.backend import IN_CLUSTER_POOL, InClusterBackend
from ipam_provider.admission import PoolAdmission
from ipam_provider.backend.contract import BackendContext, PoolKind
from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.common import Object
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import Resource
from ipam_provider.runtime.serving.webhook import ReviewRequest, Verdict

STORED: Object = {
    "metadata": {"name": "private", "namespace": "victim", "uid": "5f0c-real", "resourceVersion": "41"},
    "spec": {"addresses": ["10.97.0.10-10.97.0.20"], "prefix": 24},
}
HELD = {
    "metadata": {"name": "secret-m1", "namespace": "victim"},
    "spec": {
        "address": "10.97.0.13",
        "prefix": 24,
        "poolRef": {"apiGroup": IN_CLUSTER_POOL.group, "kind": IN_CLUSTER_POOL.kind, "name": "private"},
        "claimRef": {"name": "secret-m1"},
    },
}


class StoredPools:
    """The API server's GET of a pool (what a cache that lacks the pool falls back to): `pools` by name."""

    def __init__(self, *pools: Object) -> None:
        self.pools = {pool["metadata"]["name"]: pool for pool in pools}
        self.gets: list[str] = []

    async def get(self, resource: Resource, name: str, namespace: str | None = None) -> Object | None:
        self.gets.append(name)
        return self.pools.get(name)


def admission(kube: StoredPools, cached: list[Object] | None) -> PoolAdmission:
    client = cast(KubeClient, kube)
    registry = BackendRegistry([InClusterBackend(BackendContext(kube=client))])
    return PoolAdmission(client, registry, lambda ref: [HELD], lambda kind: cached, lambda: cached is not None)


def with_meta(pool: Object, **meta: Any) -> Object:
    changed = copy.deepcopy(pool)
    changed["metadata"].update(meta)
    return changed


def with_spec(pool: Object, **spec: Any) -> Object:
    changed = copy.deepcopy(pool)
    changed["spec"].update(spec)
    return changed


async def decide(admitted: PoolAdmission, operation: str, new: Object | None, old: Object | None) -> Verdict:
    kind: PoolKind = IN_CLUSTER_POOL
    request = ReviewRequest("u", operation, kind.group, kind.kind, "victim", "private", old, new)
    return await admitted.decide(request, kind)


NARROW = with_spec(STORED, addresses=["10.97.0.20"])  # leaves out 10.97.0.13, held
PROBE = with_spec(STORED, preAllocations={"probe": "10.97.0.13"})  # asks whether 10.97.0.13 is held


def learns_nothing(verdict: Verdict) -> bool:
    return verdict.allowed and not verdict.warnings and "10.97.0.13" not in verdict.message


async def test_a_forged_update_learns_no_address_in_use() -> None:
    for cached in ([STORED], None):  # from the cache, or (a cache not synced) by a GET
        kube = StoredPools(STORED)
        admitted = admission(kube, cached)
        forged = (with_meta(STORED, uid="guessed"), with_meta(STORED, resourceVersion="40"), STORED | {"metadata": {}})
        for old in forged:
            for new in (NARROW, PROBE):
                assert learns_nothing(await decide(admitted, "UPDATE", new, old)), (cached, old["metadata"])
        # The review of the pool as stored is refused, for what it would strand or pre-allocate.
        verdict = await decide(admitted, "UPDATE", NARROW, STORED)
        assert not verdict.allowed and "leaves out 1 address(es) in use" in verdict.message, verdict
        verdict = await decide(admitted, "UPDATE", PROBE, STORED)
        assert not verdict.allowed and "10.97.0.13 is already held" in verdict.message, verdict
        # A review the cache does not confirm is checked by a GET (one without uid needs none); the stored one once.
        assert len(kube.gets) == (4 if cached else 6)


async def test_a_cache_behind_the_stored_pool_is_read_past() -> None:
    """A status write moved the stored pool on; the cache still holds resourceVersion 40: the GET decides."""
    kube = StoredPools(STORED)
    verdict = await decide(admission(kube, [with_meta(STORED, resourceVersion="40")]), "UPDATE", NARROW, STORED)
    assert not verdict.allowed and "leaves out 1 address(es) in use" in verdict.message, verdict
    assert kube.gets == ["private"]


async def test_a_create_of_a_stored_pool_learns_no_address_in_use() -> None:
    create = with_meta(PROBE, uid="", resourceVersion="")
    assert learns_nothing(await decide(admission(StoredPools(STORED), [STORED]), "CREATE", create, None))
    # A pool that is not stored: IPAddresses left naming it (a pool deleted under the skip annotation) still count.
    verdict = await decide(admission(StoredPools(), []), "CREATE", create, None)
    assert not verdict.allowed and "10.97.0.13 is already held" in verdict.message, verdict


async def test_a_forged_delete_learns_no_count() -> None:
    kube = StoredPools(STORED)
    admitted = admission(kube, [STORED])
    skipped = with_meta(STORED, annotations={"ipam.cluster.x-k8s.io/skip-validate-delete-webhook": ""})
    for old in (with_meta(STORED, uid="guessed"), with_meta(skipped, uid="guessed"), STORED | {"metadata": {}}):
        assert learns_nothing(await decide(admitted, "DELETE", None, old)), old["metadata"]
    verdict = await decide(admitted, "DELETE", None, with_meta(STORED, resourceVersion="40"))  # a DELETE: uid alone
    assert (verdict.allowed, verdict.code) == (False, 403) and "1 IPAddress(es) name the pool" in verdict.message
    verdict = await decide(admitted, "DELETE", None, skipped)
    assert verdict.allowed and "still has 1 IPAddress(es) in use" in verdict.warnings[0]
    assert (await decide(admitted, "DELETE", None, None)).code == 400  # API servers always send oldObject
