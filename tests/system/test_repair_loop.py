"""The repair loop through the real controller and the real API server, with a small repairable backend of the
example plugin's `StaticIPPool` kind that keeps its records in memory (so the test can change them behind the
controller's back): a claim force-deleted without its finalizer leaves a record that the loop releases, and a
record deleted behind the controller's back is recorded again for its live IPAddress. Without the loop
(`interval=0`) neither happens and the test fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY

from ipam_provider.api.capi import ADDRESSES, ANNOTATION_PAUSED, CLAIMS
from ipam_provider.backend.contract import (
    AddressCounts,
    Allocation,
    BackendContext,
    ClaimContext,
    PoolExhaustedError,
    PoolKind,
    PoolRef,
    PoolReport,
)
from ipam_provider.backend.protocol import Capabilities
from ipam_provider.backend.repair import Holding, Pacer, Restore, RestoreOutcome
from ipam_provider.common import Object
from ipam_provider.repair import RepairSettings
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import EVENTS, Resource
from tests.support.cluster import wait_for
from tests.support.controller import ControllerFactory
from tests.support.objects import claim, wait_address
from tools.controlplane.crds import install_crds

PLUGIN_CRD = Path(__file__).resolve().parents[1] / "plugin_package" / "ipam_static_pool" / "crd.yaml"
STATIC_POOL = PoolKind("ipam.example.com", "v1alpha1", "StaticIPPool", "staticippools", namespaced=True)
STATIC_POOLS = Resource("ipam.example.com", "v1alpha1", "staticippools", "StaticIPPool", namespaced=True)
REPAIR = RepairSettings(interval=1.0, grace_period=2.0)


@dataclass
class Record:
    address: str
    claim: str
    claim_uid: str


class RecordingStaticBackend:
    """Hands out the pool's listed addresses; one record per held address, by handle."""

    name = "static-repairable"

    def __init__(self) -> None:
        self.records: dict[str, Record] = {}
        self._handles = 0

    @property
    def kinds(self) -> Sequence[PoolKind]:
        return (STATIC_POOL,)

    def _add(self, address: str, claim: str, uid: str) -> None:
        self._handles += 1
        self.records[f"r{self._handles}"] = Record(address, claim, uid)

    def held_for(self, uid: str) -> list[str]:
        return [r.address for r in self.records.values() if r.claim_uid == uid]

    async def allocate(
        self, pool_ref: PoolRef, pool: Mapping[str, Any], claim: ClaimContext, existing: Allocation | None = None
    ) -> Allocation:
        prefix = int(pool["spec"].get("prefix", 32))
        held = self.held_for(claim.uid)
        if not held:
            taken = {r.address for r in self.records.values()}
            free = [existing.address] if existing else [a for a in pool["spec"]["addresses"] if a not in taken]
            if not free:
                raise PoolExhaustedError("no free address")
            self._add(free[0], str(claim), claim.uid)
            held = free[:1]
        return Allocation(held[0], prefix)

    async def release(
        self, pool_ref: PoolRef, pool: Mapping[str, Any] | None, claim: ClaimContext, allocation: Allocation | None
    ) -> None:
        self.records = {h: r for h, r in self.records.items() if r.claim_uid != claim.uid}

    async def report(self, pool_ref: PoolRef, pool: Mapping[str, Any], addresses: Sequence[Allocation]) -> PoolReport:
        total = len(pool["spec"]["addresses"])
        return PoolReport(
            True, "PoolReady", "ready", counts=AddressCounts(total, len(addresses), total - len(addresses))
        )

    async def close(self) -> None:
        return None

    def capabilities(self) -> Capabilities:
        return Capabilities(name=self.name, repair=self)

    async def list_holdings(self, pool_ref: PoolRef, pool: Mapping[str, Any], pacer: Pacer) -> Sequence[Holding]:
        await pacer.wait()
        return [Holding(r.address, r.claim, r.claim_uid, handle) for handle, r in self.records.items()]

    async def release_holding(self, pool_ref: PoolRef, pool: Mapping[str, Any], holding: Holding) -> bool:
        record = self.records.get(holding.handle)
        if record is None or record.claim_uid != holding.claim_uid:
            return False
        del self.records[holding.handle]
        return True

    async def restore(
        self, pool_ref: PoolRef, pool: Mapping[str, Any], claim: ClaimContext, allocation: Allocation
    ) -> Restore:
        for record in self.records.values():
            if record.address == allocation.address:
                same = record.claim_uid == claim.uid
                return Restore(RestoreOutcome.HELD) if same else Restore(RestoreOutcome.TAKEN, f"claim {record.claim}")
        self._add(allocation.address, str(claim), claim.uid)
        return Restore(RestoreOutcome.RECORDED)

    async def outside_pool(
        self, pool_ref: PoolRef, pool: Mapping[str, Any], addresses: Sequence[str]
    ) -> Mapping[str, str]:
        return {a: "not listed in the pool" for a in addresses if a not in pool["spec"]["addresses"]}


async def force_delete(kube: KubeClient, namespace: str, name: str) -> Object:
    """Delete the claim without the controller's part, as `kubectl delete` after removing its finalizers by hand
    does: paused first, so that the controller does not add its finalizer back or release it meanwhile. Answers
    the claim as it was."""
    claim = await kube.patch(CLAIMS, name, {"metadata": {"annotations": {ANNOTATION_PAUSED: ""}}}, namespace)
    await kube.patch(CLAIMS, name, {"metadata": {"finalizers": None}}, namespace)
    await kube.delete(CLAIMS, name, namespace)
    return claim


async def test_the_repair_loop_releases_a_leak_and_restores_a_lost_record(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    await install_crds(kube, [PLUGIN_CRD])
    pool = {
        "apiVersion": STATIC_POOL.api_version,
        "kind": STATIC_POOL.kind,
        "metadata": {"name": "static"},
        "spec": {"addresses": ["192.0.2.7", "192.0.2.8", "192.0.2.9"], "prefix": 24},
    }
    await kube.create(STATIC_POOLS, pool, namespace)
    backend = RecordingStaticBackend()

    def factory(context: BackendContext) -> RecordingStaticBackend:
        return backend

    async with controller_factory(namespaces=[namespace], extra_backends=[factory], repair=REPAIR):
        for name in ("kept", "forced"):
            await kube.create(CLAIMS, claim(name, "static", kind="StaticIPPool", group="ipam.example.com"), namespace)
        kept, forced = [await wait_address(kube, namespace, name) for name in ("kept", "forced")]

        # A claim force-deleted without its finalizer; its IPAddress deleted by the garbage collector (which this
        # control plane does not run) keeps our finalizer: nothing but the repair loop lets either go.
        forced_claim = await force_delete(kube, namespace, "forced")
        await kube.delete(ADDRESSES, "forced", namespace)
        # The record of the other claim's address is deleted behind the controller's back.
        backend.records = {h: r for h, r in backend.records.items() if r.claim != f"{namespace}/kept"}

        async def leak_released() -> bool:
            return not backend.held_for(forced_claim["metadata"]["uid"])

        async def restored() -> list[str]:
            kept_uid = (await kube.get(CLAIMS, "kept", namespace) or {})["metadata"]["uid"]
            return backend.held_for(kept_uid)

        await wait_for(leak_released, timeout=60, message="the force-deleted claim's record to be released")
        assert await wait_for(restored, timeout=60, message="the lost record to be restored") == [
            kept["spec"]["address"]
        ]
        assert await kube.get(ADDRESSES, "forced", namespace) is None
        assert forced["spec"]["address"] not in {r.address for r in backend.records.values()}

        async def reasons() -> set[str]:
            events, _ = await kube.list(EVENTS, namespace)
            found = {e["reason"] for e in events}
            wanted = {"RepairSuspectedLeak", "RepairReleasedLeak", "RepairRestoredAllocation"}
            return found if wanted <= found else set()

        await wait_for(reasons, timeout=30, message="the repair loop's Events")

        async def recorded() -> bool:
            stored = await kube.get(STATIC_POOLS, "static", namespace) or {}
            conditions = (stored.get("status") or {}).get("conditions") or []
            return any(c["type"] == "AddressesRecorded" and c["status"] == "True" for c in conditions)

        await wait_for(recorded, timeout=30, message="the pool's AddressesRecorded=True condition")

        pool_labels = {"backend": RecordingStaticBackend.name, "kind": STATIC_POOL.kind, "namespace": namespace}
        pool_labels["name"] = "static"
        assert REGISTRY.get_sample_value("ipam_provider_repair_releases_total", pool_labels) == 1
        assert REGISTRY.get_sample_value("ipam_provider_repair_restored_total", pool_labels) == 1
        assert REGISTRY.get_sample_value("ipam_provider_repair_duplicates", pool_labels) == 0
        passes = {"backend": RecordingStaticBackend.name, "result": "ok"}
        assert (REGISTRY.get_sample_value("ipam_provider_repair_passes_total", passes) or 0) >= 3


async def test_report_only_keeps_a_leak_and_a_duplicate_is_reported_on_the_pool(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    await install_crds(kube, [PLUGIN_CRD])
    pool = {
        "apiVersion": STATIC_POOL.api_version,
        "kind": STATIC_POOL.kind,
        "metadata": {"name": "static"},
        "spec": {"addresses": ["192.0.2.7", "192.0.2.8", "192.0.2.9"], "prefix": 24},
    }
    await kube.create(STATIC_POOLS, pool, namespace)
    backend = RecordingStaticBackend()

    def factory(context: BackendContext) -> RecordingStaticBackend:
        return backend

    report_only = RepairSettings(interval=1.0, grace_period=2.0, report_only=True)
    async with controller_factory(namespaces=[namespace], extra_backends=[factory], repair=report_only):
        for name in ("twice", "forced"):
            await kube.create(CLAIMS, claim(name, "static", kind="StaticIPPool", group="ipam.example.com"), namespace)
        twice = await wait_address(kube, namespace, "twice")
        await wait_address(kube, namespace, "forced")
        forced_uid = (await force_delete(kube, namespace, "forced"))["metadata"]["uid"]
        await kube.patch(ADDRESSES, "forced", {"metadata": {"finalizers": None}}, namespace)
        await kube.delete(ADDRESSES, "forced", namespace)
        # Another holder takes the address of claim `twice` behind the controller's back: a record of ours for a
        # claim that does not exist, so a suspected leak itself (released when releasing is on, and then `twice`'s
        # address is restored; with report-only, both stay).
        ip = twice["spec"]["address"]
        backend.records = {h: r for h, r in backend.records.items() if r.address != ip}
        backend.records["elsewhere"] = Record(ip, f"{namespace}/elsewhere", "uid-elsewhere")
        passes = {"backend": RecordingStaticBackend.name, "result": "ok"}
        passes_before = REGISTRY.get_sample_value("ipam_provider_repair_passes_total", passes) or 0

        async def duplicate_condition() -> str:
            stored = await kube.get(STATIC_POOLS, "static", namespace) or {}
            for condition in (stored.get("status") or {}).get("conditions") or []:
                if condition["type"] == "AddressesRecorded" and condition["reason"] == "DuplicateAddress":
                    return str(condition["message"])
            return ""

        message = await wait_for(duplicate_condition, timeout=60, message="AddressesRecorded=False/DuplicateAddress")
        assert f"IPAddress {namespace}/twice" in message and f"claim {namespace}/elsewhere" in message and ip in message

        async def five_more_passes() -> bool:
            done = REGISTRY.get_sample_value("ipam_provider_repair_passes_total", passes) or 0
            return done >= passes_before + 5  # two passes and the 2 s grace period over, several times

        await wait_for(five_more_passes, timeout=60, message="five more repair passes")
        assert backend.held_for(forced_uid), "report-only never releases"
        assert backend.records["elsewhere"].claim_uid == "uid-elsewhere", "a duplicate is never taken over"
        labels = {"backend": RecordingStaticBackend.name, "kind": STATIC_POOL.kind, "namespace": namespace}
        labels["name"] = "static"
        assert REGISTRY.get_sample_value("ipam_provider_repair_suspected_leaks", labels) == 2, "forced, elsewhere"
        assert REGISTRY.get_sample_value("ipam_provider_repair_duplicates", labels) == 1
        assert (REGISTRY.get_sample_value("ipam_provider_repair_releases_total", labels) or 0) == 0

        async def warnings() -> list[tuple[str, str]]:
            events, _ = await kube.list(EVENTS, namespace)
            found = [(e["involvedObject"]["kind"], e["reason"]) for e in events if e["type"] == "Warning"]
            return found if ("IPAddressClaim", "DuplicateAddress") in found else []

        assert ("StaticIPPool", "DuplicateAddress") in await wait_for(warnings, timeout=30, message="Warnings")
