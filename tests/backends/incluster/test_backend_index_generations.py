"""Claims of one pool are allocated concurrently, and their reconciles may have read the pool at different
generations: one that read an older spec never replaces the pool's index built from a newer one."""

from __future__ import annotations

from backends.incluster.backend import IN_CLUSTER_POOL, InClusterBackend
from ipam_provider.backend.contract import BackendContext, ClaimContext
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.objects import POOLS, pool
from tests.system.incluster.test_existing_from_cache import allocate


async def test_a_reader_of_an_older_spec_allocates_from_the_newer_index(kube: KubeClient, namespace: str) -> None:
    old = await kube.create(POOLS, pool("gen", ["10.50.0.10-10.50.0.12"], 24), namespace)
    ref = IN_CLUSTER_POOL.ref(namespace, "gen")
    backend = InClusterBackend(BackendContext(kube=kube))
    try:
        first = await allocate(backend, ref, old, ClaimContext(namespace, "a", "uid-a"))
        assert first.address == "10.50.0.10"
        new = await kube.patch(POOLS, "gen", {"spec": {"addresses": ["10.50.0.20-10.50.0.22"]}}, namespace)
        assert new["metadata"]["generation"] > old["metadata"]["generation"]
        second = await allocate(backend, ref, new, ClaimContext(namespace, "b", "uid-b"))
        assert second.address == "10.50.0.20"
        stale = await allocate(backend, ref, old, ClaimContext(namespace, "c", "uid-c"))
        assert stale.address == "10.50.0.21", "the newer spec's index serves a reader of the older one"
        fourth = await allocate(backend, ref, new, ClaimContext(namespace, "d", "uid-d"))
        assert fourth.address == "10.50.0.22", "and it is still the index in use"
    finally:
        await backend.close()
