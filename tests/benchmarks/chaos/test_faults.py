"""The chaos runner's parts that need no control plane: the fault plan, loading backends by name, the verdict."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.chaos import loader
from benchmarks.chaos.faults import HEAVY, LIGHT, fault_plan
from benchmarks.chaos.incluster import InClusterChaos
from benchmarks.chaos.report import CHECKS, BackendResult, table


def test_the_short_plan_has_every_kind_and_the_full_one_scales_with_the_operations() -> None:
    short = Counter(fault_plan(("netbox-5xx",), 300, random.Random(1)))
    assert short == {**dict.fromkeys(HEAVY, 1), **dict.fromkeys((*LIGHT, "netbox-5xx"), 3)}
    full = Counter(fault_plan((), 2000, random.Random(1)))
    assert full == {**dict.fromkeys(HEAVY, 5), **dict.fromkeys(LIGHT, 20)}


def test_the_plan_is_the_seeds() -> None:
    assert fault_plan((), 2000, random.Random(7)) == fault_plan((), 2000, random.Random(7))
    assert fault_plan((), 2000, random.Random(7)) != fault_plan((), 2000, random.Random(8))


def test_a_backend_is_made_with_the_arguments_it_declares(tmp_path: Path) -> None:
    backend = loader.load("incluster", kubeconfig=tmp_path / "k", workdir=tmp_path, seed=3, namespace="n")
    assert isinstance(backend, InClusterChaos)
    assert backend.kubeconfig == tmp_path / "k"
    assert "incluster" in loader.available()
    with pytest.raises(ValueError, match="unknown backend"):
        loader.load("nowhere")


def test_the_in_cluster_pools_are_half_namespaced_half_global_and_named_as_the_truth_names_them() -> None:
    backend = InClusterChaos(Path("unused"))
    manifests = backend.manifests("chaos", 4)
    assert [m["kind"] for m in manifests] == ["InClusterIPPool", "GlobalInClusterIPPool"] * 2
    assert backend.pool_refs("chaos", 4) == [
        "InClusterIPPool/chaos/pool-0",
        "GlobalInClusterIPPool/chaos-global-1",
        "InClusterIPPool/chaos/pool-2",
        "GlobalInClusterIPPool/chaos-global-3",
    ]
    cidrs = [m["spec"]["addresses"][0] for m in manifests]
    assert len(set(cidrs)) == 4


def test_a_run_passes_only_with_every_kind_injected_and_every_count_zero() -> None:
    clean = BackendResult("incluster", 1, fault_kinds=["force-delete"], faults={"force-delete": 2})
    clean.checks = dict.fromkeys(CHECKS, 0)
    assert clean.passed
    assert "| incluster |" in table([clean])
    missing = BackendResult("incluster", 1, fault_kinds=["force-delete", "etcd-restart"], faults={"force-delete": 1})
    missing.checks = dict.fromkeys(CHECKS, 0)
    assert not missing.passed
    assert "never injected: etcd-restart" in table([missing])
    leaky = BackendResult("incluster", 1, fault_kinds=["force-delete"], faults={"force-delete": 1})
    leaky.checks = {**dict.fromkeys(CHECKS, 0), "leaks": 1}
    assert not leaky.passed
    unchecked = BackendResult("incluster", 1)
    assert not unchecked.passed
