"""The in-cluster backend under chaos: InClusterIPPools and GlobalInClusterIPPools, whose truth is the
InClusterIPReservations the controller writes (one per held address, cluster-scoped, named by pool and address).

It has no external system and no faults of its own: every fault it suffers is the runner's Kubernetes-side one.
`delete_behind_back` deletes one reservation held for a claim, as an operator cleaning up by hand might; the
address then has an IPAddress but no reservation, which the repair loop must record again.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from backends.incluster.naming import RESERVATIONS
from backends.incluster.reservations import Reservation
from benchmarks.chaos.backends import TruthRecord
from ipam_provider.api.capi import IPAM_GROUP
from ipam_provider.runtime.kube.client import KubeClient

POOL_VERSION = f"{IPAM_GROUP}/v1alpha2"
POOL_PREFIX = 21  # 2,046 addresses a pool: room for every claim of a full run, released or not


class InClusterChaos:
    name = "incluster"
    fault_kinds: Sequence[str] = ()

    def __init__(self, kubeconfig: Path) -> None:
        """`kubeconfig`: the admin kubeconfig of the runner's control plane (read directly, not via its relay)."""
        self.kubeconfig = kubeconfig
        self._kube: KubeClient | None = None
        self._pools: set[str] = set()

    async def start(self) -> None:
        if self._kube is None:
            self._kube = await KubeClient.from_kubeconfig(str(self.kubeconfig))

    async def stop(self) -> None:
        if self._kube is not None:
            await self._kube.close()
            self._kube = None

    def _layout(self, namespace: str, count: int) -> list[tuple[str, str, str]]:
        """(kind, name, CIDR) per pool: even ones namespaced, odd ones cluster-scoped."""
        pools = []
        for index in range(count):
            cidr = f"10.{100 + index // 8}.{(index % 8) * 8}.0/{POOL_PREFIX}"
            if index % 2 == 0:
                pools.append(("InClusterIPPool", f"pool-{index}", cidr))
            else:
                pools.append(("GlobalInClusterIPPool", f"{namespace}-global-{index}", cidr))
        return pools

    def manifests(self, namespace: str, count: int) -> list[dict[str, Any]]:
        objects: list[dict[str, Any]] = []
        for kind, name, cidr in self._layout(namespace, count):
            metadata: dict[str, Any] = {"name": name}
            if kind == "InClusterIPPool":
                metadata["namespace"] = namespace
            spec = {"addresses": [cidr], "prefix": POOL_PREFIX}
            objects.append({"apiVersion": POOL_VERSION, "kind": kind, "metadata": metadata, "spec": spec})
        return objects

    def pool_refs(self, namespace: str, count: int) -> list[str]:
        refs = [
            f"{kind}/{namespace}/{name}" if kind == "InClusterIPPool" else f"{kind}/{name}"
            for kind, name, _ in self._layout(namespace, count)
        ]
        self._pools.update(refs)
        return refs

    async def inject(self, kind: str, rng: random.Random) -> None:
        raise ValueError(f"the in-cluster backend has no fault kind {kind!r}")

    async def delete_behind_back(self, rng: random.Random) -> str:
        held = [(record, obj) for record, obj in await self._reservations() if record.claim_uid]
        if not held:
            return ""
        record, obj = rng.choice(held)
        meta = obj["metadata"]
        if not await self._client().delete(RESERVATIONS, meta["name"], uid=meta["uid"]):
            return ""
        return f"InClusterIPReservation {meta['name']} ({record.address} of {record.pool})"

    async def truth(self) -> list[TruthRecord]:
        return [record for record, _ in await self._reservations()]

    async def _reservations(self) -> list[tuple[TruthRecord, dict[str, Any]]]:
        """Every reservation of this run's pools, with its object; a paginated read from the API server."""
        items, _ = await self._client().list(RESERVATIONS)
        found = []
        for obj in items:
            reservation = Reservation.parse(obj)
            pool = reservation.pool
            if pool is None:
                continue
            ref = f"{pool.kind}/{pool.namespace}/{pool.name}" if pool.namespace else f"{pool.kind}/{pool.name}"
            if ref not in self._pools:
                continue
            found.append((TruthRecord(ref, reservation.address, reservation.claim_uid, reservation.name), obj))
        return found

    def _client(self) -> KubeClient:
        if self._kube is None:
            raise RuntimeError("InClusterChaos.start() was not called")
        return self._kube


def create_chaos_backend(kubeconfig: Path) -> InClusterChaos:
    return InClusterChaos(kubeconfig)
