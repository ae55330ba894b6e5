"""The metrics a real controller emits, scraped as Prometheus would: over HTTPS with a metrics reader's
ServiceAccount token, from `ipam-provider run` against the real API server and a real NetBox, after a known
sequence (allocations on two pools, an exhausted pool, a release, a NetBox that refuses the token, a deleted pool).
Every series of docs/metrics.md is checked for its value, and every line the controller logged in JSON mode must
parse as JSON."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from ipam_provider.api.capi import CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import SECRETS
from tests.support.cluster import wait_for
from tests.support.controller import controller_command
from tests.support.metrics import scrape
from tests.support.netbox_backend import NB_POOLS, nb_claim, netbox_pool, prefix
from tests.support.objects import POOLS, claim, pool, wait_address, wait_claim_reason
from tests.support.prometheus import documented_metrics, series_names

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer

LEASE = "ipam-metrics-e2e"
Check = tuple[str, dict[str, str], Callable[[float], bool]]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def samples(text: str) -> list[Sample]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def matching(found: list[Sample], name: str, labels: dict[str, str]) -> Iterator[Sample]:
    return (s for s in found if s.name == name and labels.items() <= s.labels.items())


def unmet(found: list[Sample], checks: list[Check]) -> list[str]:
    """The checks no sample meets, each with the values seen."""
    missing = []
    for name, labels, ok in checks:
        values = [s.value for s in matching(found, name, labels)]
        if not values or not ok(sum(values)):
            missing.append(f"{name}{labels}: {values or 'no series'}")
    return missing


def pool_checks(namespace: str) -> list[Check]:
    def of(name: str, **extra: str) -> dict[str, str]:
        return {"backend": "incluster", "kind": "InClusterIPPool", "namespace": namespace, "name": name, **extra}

    netbox = {"backend": "netbox", "kind": "NetboxIPPool", "namespace": namespace, "name": "nb"}
    in_cluster = {"backend": "incluster", "kind": "InClusterIPPool"}
    return [
        ("ipam_provider_allocation_total", of("pool-a"), lambda v: v == 2),
        ("ipam_provider_allocation_total", of("pool-b"), lambda v: v == 1),
        ("ipam_provider_allocation_total", of("small"), lambda v: v == 1),
        ("ipam_provider_allocated_ips", of("pool-a"), lambda v: v == 1),  # two allocated, one released
        ("ipam_provider_available_ips", of("pool-a"), lambda v: v == 10),  # .10-.20: 11 addresses
        ("ipam_provider_allocated_ips", of("small"), lambda v: v == 1),
        ("ipam_provider_available_ips", of("small"), lambda v: v == 0),
        ("ipam_provider_release_total", of("pool-a"), lambda v: v == 1),
        ("ipam_provider_allocation_errors_total", of("small", reason="PoolExhausted"), lambda v: v >= 1),
        ("ipam_provider_waiting_claims", of("small", reason="PoolExhausted"), lambda v: v == 1),
        ("ipam_provider_waiting_claims", of("pool-a"), lambda v: v == 0),
        # one histogram per backend and kind: the four claims fulfilled in the fresh process's in-cluster pools
        ("ipam_provider_allocation_duration_seconds_count", in_cluster, lambda v: v == 4),
        ("ipam_provider_allocation_duration_seconds_sum", in_cluster, lambda v: v > 0),
        ("ipam_provider_pool_ready", of("pool-a", reason="PoolReady"), lambda v: v == 1),
        ("ipam_provider_pool_ready", netbox, lambda v: v == 0),
        ("ipam_provider_waiting_claims", netbox, lambda v: v == 1),
        ("ipam_provider_allocation_total", netbox, lambda v: v == 0),
        ("ipam_provider_backend_requests_total", {"backend": "netbox", "outcome": "error"}, lambda v: v >= 1),
        ("ipam_provider_backend_request_duration_seconds_count", {"backend": "netbox"}, lambda v: v >= 1),
    ]


def controller_checks(workers: int) -> list[Check]:
    claims = {"controller": "ipaddressclaim"}
    queue = {"controller": "ipam", "name": "ipam"}
    return [
        ("workqueue_adds_total", queue, lambda v: v >= 7),
        ("workqueue_depth", queue, lambda v: v >= 0),
        ("workqueue_queue_duration_seconds_count", queue, lambda v: v >= 7),
        ("workqueue_work_duration_seconds_count", queue, lambda v: v >= 7),
        ("workqueue_unfinished_work_seconds", queue, lambda v: v >= 0),
        ("workqueue_longest_running_processor_seconds", queue, lambda v: v >= 0),
        ("workqueue_retries_total", queue, lambda v: v >= 0),
        ("controller_runtime_reconcile_total", {**claims, "result": "success"}, lambda v: v >= 6),
        ("controller_runtime_reconcile_total", {"controller": "inclusterippool"}, lambda v: v >= 3),
        ("controller_runtime_reconcile_errors_total", claims, lambda v: v >= 0),
        ("controller_runtime_reconcile_time_seconds_count", claims, lambda v: v >= 6),
        ("controller_runtime_active_workers", claims, lambda v: 0 <= v <= workers),
        ("controller_runtime_max_concurrent_reconciles", claims, lambda v: v == workers),
        ("rest_client_requests_total", {"code": "201", "method": "POST"}, lambda v: v >= 4),
        ("rest_client_requests_total", {"code": "200", "method": "PATCH"}, lambda v: v >= 1),
        ("rest_client_request_duration_seconds_count", {"verb": "POST"}, lambda v: v >= 4),
        ("leader_election_master_status", {"name": LEASE}, lambda v: v == 1),
        ("process_cpu_seconds_total", {}, lambda v: v > 0),
    ]


OURS = ("ipam_provider_", "workqueue_", "controller_runtime_", "rest_client_", "leader_election_")
# Emitted once a backend with the repair capability has made a pass; tests/system/test_repair_loop.py reads them.
REPAIR = "ipam_provider_repair_"


def assert_documented_is_emitted(found: list[Sample]) -> None:
    """The table the alert rules and the dashboard are checked against (docs/prometheus-and-grafana.md) names
    exactly the series of ours this controller emits (the repair loop's: at most), with their types and labels."""
    documented = {name: m for name, m in documented_metrics().items() if name.startswith(OURS)}
    emitted = {s.name for s in found if s.name.startswith(OURS)}
    required = {name for name in series_names(documented) if not name.startswith(REPAIR)}
    assert required <= emitted <= series_names(documented)
    by_sample = {name: metric for metric in documented.values() for name in series_names({metric.name: metric})}
    for sample in found:
        if sample.name in by_sample:
            keys = set(sample.labels) - {"le"}
            assert keys == set(by_sample[sample.name].labels), f"{sample.name}: {sorted(keys)}"


async def create_objects(kube: KubeClient, namespace: str, netbox: NetBoxServer) -> None:
    await kube.create(POOLS, pool("pool-a", ["10.61.0.10-10.61.0.20"], 24), namespace)
    await kube.create(POOLS, pool("pool-b", ["10.62.0.0/24"], 24), namespace)
    await kube.create(POOLS, pool("small", ["10.63.0.10"], 24), namespace)
    secret = {"url": netbox.url, "token": "0123456789abcdef0123456789abcdef01234567"}  # a token NetBox refuses
    await kube.create(
        SECRETS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "netbox"}, "stringData": secret}, namespace
    )
    await kube.create(NB_POOLS, netbox_pool("nb", [prefix("10.64.0.0/24")]), namespace)
    for name, pool_name in [("a-1", "pool-a"), ("a-2", "pool-a"), ("b-1", "pool-b"), ("s-1", "small")]:
        await kube.create(CLAIMS, claim(name, pool_name), namespace)
    await kube.create(CLAIMS, nb_claim("n-1", "nb"), namespace)


async def settled_scrape(url: str, token: str, checks: list[Check]) -> list[Sample]:
    """Scrape until every check holds (gauges follow the pool reconciles that trail each write)."""
    last: list[list[str]] = [[]]

    async def all_met() -> list[Sample] | None:
        status, body = await scrape(url, token)
        if status != 200:
            last[0] = [f"HTTP {status}: {body[:200]}"]
            return None
        found = samples(body)
        last[0] = unmet(found, checks)
        return None if last[0] else found

    return await wait_for(all_met, timeout=90, message=lambda: "every expected series; unmet:\n" + "\n".join(last[0]))


async def test_a_scrape_shows_every_series_after_a_known_sequence(
    kube: KubeClient, kubeconfig: Path, namespace: str, netbox: NetBoxServer, metrics_reader_token: str, tmp_path: Path
) -> None:
    port, workers = free_port(), 4
    log_path = tmp_path / "controller.log"
    url = f"https://127.0.0.1:{port}/metrics"
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *controller_command(kubeconfig, namespace),
            f"--diagnostics-address=127.0.0.1:{port}",
            "--health-probe-bind-address=0",
            "--log-format=json",
            f"--workers={workers}",
            "--leader-elect",
            f"--leader-election-id={namespace}/{LEASE}",
            stderr=log,
            env={**os.environ},
        )
    try:
        await create_objects(kube, namespace, netbox)
        for name in ("a-1", "a-2", "b-1", "s-1"):
            await wait_address(kube, namespace, name, timeout=60)
        await kube.create(CLAIMS, claim("s-2", "small"), namespace)
        await wait_claim_reason(kube, namespace, "s-2", "PoolExhausted", timeout=60)
        await kube.delete(CLAIMS, "a-2", namespace)
        await wait_for(lambda: _gone(kube, namespace, "a-2"), timeout=60, message="claim a-2 released")
        found = await settled_scrape(url, metrics_reader_token, pool_checks(namespace) + controller_checks(workers))
        assert_documented_is_emitted(found)

        # A deleted pool's series disappear.
        await kube.delete(CLAIMS, "b-1", namespace)
        await wait_for(lambda: _gone(kube, namespace, "b-1"), timeout=60, message="claim b-1 released")
        await kube.delete(POOLS, "pool-b", namespace)

        async def pool_b_series_gone() -> bool:
            _, body = await scrape(url, metrics_reader_token)
            return not any(s.labels.get("name") == "pool-b" for s in samples(body))

        await wait_for(pool_b_series_gone, timeout=60, message="pool-b's series removed")
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    assert lines, "the controller logged nothing"
    for line in lines:
        record = json.loads(line)  # every line is JSON, the NetBox error path's included
        assert {"event", "level", "timestamp"} <= record.keys(), line
    assert "0123456789abcdef0123456789abcdef01234567" not in log_path.read_text()


async def _gone(kube: KubeClient, namespace: str, name: str) -> bool:
    return await kube.get(CLAIMS, name, namespace) is None
