"""The admission webhook with the real API server calling the controller on loopback.

Each test runs the controller in-process with its webhook server on 127.0.0.1 (a CA and a serving certificate made
for the test), and registers config/webhook's ValidatingWebhookConfiguration as shipped — rules, failurePolicy,
timeoutSeconds, matchPolicy — except that the API server reaches it by URL with the test's CA instead of through the
Service, and that an objectSelector limits it to objects labelled for this test, so that the shared API server's
other tests never meet it. The checks are then what a user sees from `kubectl`: the API server's refusal, with the
controller's message.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ipam_provider.admission import PoolAdmission
from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.common import Object
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import Resource
from ipam_provider.runtime.serving.certificates import CertificateFiles, ServingCertificate
from ipam_provider.runtime.serving.webhook import WebhookServer
from tests.support.cluster import wait_for
from tests.support.controller import run_controller
from tests.support.objects import GLOBAL_POOLS, POOLS, PREFIX_POOLS, claim, global_pool, pool, wait_address
from tools.controlplane.pki import write_pki

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "config" / "webhook" / "manifests.yaml"
WEBHOOK_CONFIGURATIONS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration",
    namespaced=False,
)
CONFIG_MAPS = Resource("", "v1", "configmaps", "ConfigMap", namespaced=True)
TEST_LABEL = "ipam-webhook-test"
DENIED = "denied the request"
SKIP_DELETE_VALIDATION = "ipam.cluster.x-k8s.io/skip-validate-delete-webhook"


def serving_pki(directory: Path) -> tuple[CertificateFiles, bytes]:
    """A throwaway CA and a certificate for 127.0.0.1 signed by it: the files, as --webhook-cert-dir holds them,
    and the CA's PEM for the configuration's caBundle."""
    paths = write_pki(directory)
    certs = directory / "serving-certs"
    certs.mkdir()
    shutil.copy(paths["cert"], certs / "tls.crt")
    shutil.copy(paths["key"], certs / "tls.key")
    return CertificateFiles(str(certs)), paths["ca"].read_bytes()


def configuration(name: str, url: str, ca: bytes, label: str) -> Object:
    """config/webhook's configuration, calling `url` + each webhook's path, for objects labelled `label`."""
    (shipped,) = [doc for doc in yaml.safe_load_all(MANIFESTS.read_text()) if doc]
    body: Object = copy.deepcopy(shipped)
    body["metadata"] = {"name": name}
    for webhook in body["webhooks"]:
        path = webhook["clientConfig"]["service"]["path"]
        webhook["clientConfig"] = {"url": f"{url}{path}", "caBundle": base64.b64encode(ca).decode()}
        webhook["objectSelector"] = {"matchLabels": {TEST_LABEL: label}}
    return body


def labelled(obj: Object, label: str) -> Object:
    obj["metadata"].setdefault("labels", {})[TEST_LABEL] = label
    return obj


async def refused(write: Any) -> ApiError:
    """The API server's refusal of the awaitable `write`; fails the test if it was accepted."""
    try:
        await write
    except ApiError as error:
        return error
    pytest.fail("the API server accepted the change")


@contextlib.asynccontextmanager
async def registered(kube: KubeClient, body: Object, namespace: str) -> AsyncIterator[None]:
    """Register the configuration and wait until the API server applies it (a probe pool with an unusable spec is
    refused); remove it afterwards."""
    await kube.create(WEBHOOK_CONFIGURATIONS, body)
    label = body["webhooks"][0]["objectSelector"]["matchLabels"][TEST_LABEL]
    probe = labelled(pool("probe", ["10.9.0.5", "10.9.1.5"], 24), label)

    async def in_force() -> bool:
        try:
            await kube.create(POOLS, probe, namespace)
        except ApiError as error:
            return DENIED in error.message
        await kube.delete(POOLS, "probe", namespace)
        return False

    try:
        await wait_for(in_force, timeout=60, interval=0.5, message="the webhook configuration to be in force")
        yield
    finally:
        await kube.delete(WEBHOOK_CONFIGURATIONS, body["metadata"]["name"])


@contextlib.asynccontextmanager
async def webhook(
    kube: KubeClient, kubeconfig: Path, namespace: str, tmp_path: Path, **settings: Any
) -> AsyncIterator[str]:
    """The controller serving `namespace` (`settings`: further arguments of `run_controller`, such as
    `extra_backends`), its webhook on loopback and registered; yields the test's label."""
    files, ca = serving_pki(tmp_path)
    async with run_controller(kubeconfig, namespaces=[namespace], **settings) as controller:
        server = WebhookServer(ServingCertificate.load(files))
        await server.start("127.0.0.1", 0)
        try:
            admission = PoolAdmission(
                controller.kube,
                controller.registry,
                controller.caches.cached_addresses,
                controller.caches.cached_pools,
                controller.caches.admission_synced,
            )  # as cli.py wires it
            server.use(admission.routes())
            body = configuration(f"ipam-test-{namespace}", f"https://127.0.0.1:{server.port}", ca, namespace)
            async with registered(kube, body, namespace):
                yield namespace
        finally:
            await server.close()


async def fulfilled(kube: KubeClient, namespace: str, pool_name: str, names: list[str], **kind: Any) -> list[str]:
    """Claims served one after another, so each gets the lowest free address: their addresses."""
    addresses = []
    for name in names:
        await kube.create(CLAIMS, claim(name, pool_name, **kind), namespace)
        addresses.append(str((await wait_address(kube, namespace, name))["spec"]["address"]))
    return addresses


@pytest.mark.apiserver
async def test_updates_that_strand_addresses_in_use_are_refused(
    kube: KubeClient, kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    async with webhook(kube, kubeconfig, namespace, tmp_path) as label:
        await kube.create(POOLS, labelled(pool("net", ["10.61.0.10-10.61.0.20"], 24), label), namespace)
        assert await fulfilled(kube, namespace, "net", ["a", "b", "c"]) == ["10.61.0.10", "10.61.0.11", "10.61.0.12"]

        shrink = {"spec": {"addresses": ["10.61.0.12-10.61.0.20"]}}
        error = await refused(kube.patch(POOLS, "net", shrink, namespace))
        assert error.status == 422, error
        assert (
            "pool addresses do not contain allocated addresses: the new spec leaves out 2 address(es) in use "
            f"(`kubectl get ipaddresses.ipam.cluster.x-k8s.io -n {namespace} " in error.message
        ), error.message
        assert "10.61.0.10" not in error.message and f"{namespace}/a" not in error.message
        exclude = {"spec": {"excludedAddresses": ["10.61.0.12"]}}
        error = await refused(kube.patch(POOLS, "net", exclude, namespace))
        assert "leaves out 1 address(es) in use" in error.message and f"{namespace}/c" not in error.message

        # Changes that keep every address in use are allowed, and so are those that touch no spec field.
        await kube.patch(POOLS, "net", {"spec": {"addresses": ["10.61.0.10-10.61.0.40"]}}, namespace)
        await kube.patch(POOLS, "net", {"spec": {"excludedAddresses": ["10.61.0.30-10.61.0.40"]}}, namespace)
        await kube.patch(POOLS, "net", {"metadata": {"annotations": {"note": "x"}}}, namespace)
        # A spec the backend cannot use, though CEL accepts it, is refused with the backend's message.
        error = await refused(kube.patch(POOLS, "net", {"spec": {"addresses": ["10.61.0.10", "10.62.0.1"]}}, namespace))
        assert "provided address belongs to a different subnet than others: 10.62.0.1" in error.message


@pytest.mark.apiserver
async def test_deleting_a_pool_in_use_is_refused_unless_annotated(
    kube: KubeClient, kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    async with webhook(kube, kubeconfig, namespace, tmp_path) as label:
        for name, subnet in (("kept", "10.63.0"), ("skipped", "10.63.1"), ("moved", "10.63.2"), ("empty", "10.63.3")):
            await kube.create(POOLS, labelled(pool(name, [f"{subnet}.0/24"], 24), label), namespace)
        for pool_name in ("kept", "skipped", "moved"):
            await fulfilled(kube, namespace, pool_name, [f"{pool_name}-m1"])

        error = await refused(kube.delete(POOLS, "kept", namespace))
        assert error.status == 403, error
        assert (
            "Pool has IPAddresses allocated. Cannot delete Pool until all IPAddresses have been removed."
            in error.message
        )
        assert "1 IPAddress(es) name the pool" in error.message and "kept-m1" not in error.message
        assert await kube.get(POOLS, "kept", namespace) is not None

        # The Go provider's annotation, and the one clusterctl move sets before deleting its source copy.
        for name, annotation in (
            ("skipped", SKIP_DELETE_VALIDATION),
            ("moved", "clusterctl.cluster.x-k8s.io/delete-for-move"),
        ):
            await kube.patch(POOLS, name, {"metadata": {"annotations": {annotation: ""}}}, namespace)
            assert await kube.delete(POOLS, name, namespace)
        assert await kube.delete(POOLS, "empty", namespace)

        # Once its claims are gone, the pool in use can go too.
        await kube.delete(CLAIMS, "kept-m1", namespace)

        async def address_gone() -> bool:
            return await kube.get(ADDRESSES, "kept-m1", namespace) is None

        await wait_for(address_gone, timeout=60, message="the claim's IPAddress to be deleted")
        assert await kube.delete(POOLS, "kept", namespace)


@pytest.mark.apiserver
async def test_pre_allocations_that_conflict_are_refused(
    kube: KubeClient, kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    async with webhook(kube, kubeconfig, namespace, tmp_path) as label:
        await kube.create(POOLS, labelled(pool("net", ["10.64.0.10-10.64.0.20"], 24), label), namespace)
        assert await fulfilled(kube, namespace, "net", ["holder"]) == ["10.64.0.10"]

        cases = {
            "outside": ({"m1": "10.64.0.50"}, "preAllocations[m1]: 10.64.0.50 is not an allocatable address"),
            "duplicate": (
                {"m1": "10.64.0.15", "m2": "10.64.0.15"},
                "preAllocations: 10.64.0.15 is pre-allocated to more than one claim: m1, m2",
            ),
            "held": (
                {"m1": "10.64.0.10"},
                "preAllocations[m1]: 10.64.0.10 is already held by another claim's IPAddress (`kubectl get "
                f"ipaddresses.ipam.cluster.x-k8s.io -n {namespace} ",
            ),
        }
        for case, (entries, said) in cases.items():
            error = await refused(kube.patch(POOLS, "net", {"spec": {"preAllocations": entries}}, namespace))
            assert error.status == 422 and said in error.message, (case, error.message)
            if case != "held":  # on create too (a new pool's addresses are held by no IPAddress naming it)
                body = labelled(pool(f"new-{case}", ["10.64.0.10-10.64.0.20"], 24, preAllocations=entries), label)
                error = await refused(kube.create(POOLS, body, namespace))
                assert said in error.message, (case, error.message)

        # The holder's own address for the holder, and a free address for another claim, are fine.
        await kube.patch(
            POOLS, "net", {"spec": {"preAllocations": {"holder": "10.64.0.10", "m1": "10.64.0.15"}}}, namespace
        )


@pytest.mark.apiserver
async def test_global_pools_are_checked_too(kube: KubeClient, kubeconfig: Path, namespace: str, tmp_path: Path) -> None:
    name = f"g-{namespace}"
    async with webhook(kube, kubeconfig, namespace, tmp_path) as label:
        await kube.create(GLOBAL_POOLS, labelled(global_pool(name, ["10.65.0.0/24"], 24), label))
        try:
            (address,) = await fulfilled(kube, namespace, name, ["m1"], kind="GlobalInClusterIPPool")
            error = await refused(kube.patch(GLOBAL_POOLS, name, {"spec": {"excludedAddresses": [address]}}))
            assert "leaves out 1 address(es) in use" in error.message and "-A -o custom-columns=" in error.message
            assert address not in error.message and f"{namespace}/m1" not in error.message
            error = await refused(kube.delete(GLOBAL_POOLS, name))
            assert error.status == 403 and "1 IPAddress(es) name the pool" in error.message
            assert "m1" not in error.message
            entries = {f"{namespace}/other": address}
            error = await refused(kube.patch(GLOBAL_POOLS, name, {"spec": {"preAllocations": entries}}))
            assert f"{address} is already held by another claim's IPAddress" in error.message
            assert f"{namespace}/m1" not in error.message
            await kube.patch(GLOBAL_POOLS, name, {"spec": {"preAllocations": {f"{namespace}/m1": address}}})
        finally:
            await kube.delete(CLAIMS, "m1", namespace)

            async def released() -> bool:
                return await kube.get(ADDRESSES, "m1", namespace) is None

            await wait_for(released, timeout=60, message="m1's IPAddress to be deleted")
            await kube.delete(GLOBAL_POOLS, name)


@pytest.mark.apiserver
async def test_a_delete_review_of_no_stored_pool_learns_no_count(kube: KubeClient, namespace: str) -> None:
    """Without caches, the pool is read by a GET: a DELETE review whose old object has another uid than the stored
    pool's is allowed without a word (the API server deletes no pool on it); the stored pool's is refused."""
    from backends.incluster.backend import IN_CLUSTER_POOL, InClusterBackend
    from ipam_provider.backend.contract import BackendContext
    from ipam_provider.backend.registry import BackendRegistry
    from ipam_provider.runtime.serving.webhook import parse_review

    admission = PoolAdmission(kube, BackendRegistry([InClusterBackend(BackendContext(kube=kube))]))
    stored = await kube.create(POOLS, pool("kept", ["10.66.0.0/24"], 24), namespace)
    address = {
        "apiVersion": ADDRESSES.api_version,
        "kind": ADDRESSES.kind,
        "metadata": {"name": "kept-m1"},
        "spec": {
            "address": "10.66.0.10",
            "prefix": 24,
            "poolRef": {"apiGroup": IN_CLUSTER_POOL.group, "kind": IN_CLUSTER_POOL.kind, "name": "kept"},
            "claimRef": {"name": "kept-m1"},
        },
    }
    await kube.create(ADDRESSES, address, namespace)

    def delete(old: Object) -> Object:
        kind = {"group": IN_CLUSTER_POOL.group, "version": IN_CLUSTER_POOL.version, "kind": IN_CLUSTER_POOL.kind}
        request = {"uid": "u", "kind": kind, "namespace": namespace, "name": "kept", "operation": "DELETE"}
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request | {"oldObject": old}}

    forged = {**stored, "metadata": {**stored["metadata"], "uid": "00000000-0000-0000-0000-000000000000"}}
    verdict = await admission.decide(parse_review(delete(forged)), IN_CLUSTER_POOL)
    assert verdict.allowed and not verdict.message and not verdict.warnings, verdict
    verdict = await admission.decide(parse_review(delete(stored)), IN_CLUSTER_POOL)
    assert not verdict.allowed and "1 IPAddress(es) name the pool" in verdict.message


def prefix_pool(name: str, prefixes: list[str], **spec: Any) -> Object:
    metadata = {"name": name}
    return {
        "apiVersion": PREFIX_POOLS.api_version,
        "kind": PREFIX_POOLS.kind,
        "metadata": metadata,
        "spec": {"prefixes": prefixes, **spec},
    }


@pytest.mark.apiserver
async def test_prefix_pools_keep_their_children_in_use(
    kube: KubeClient, kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    async with webhook(kube, kubeconfig, namespace, tmp_path) as label:
        await kube.create(PREFIX_POOLS, labelled(prefix_pool("p6", ["fd00:61::/62"]), label), namespace)
        kind = "InClusterPrefixPool"
        assert await fulfilled(kube, namespace, "p6", ["a", "b"], kind=kind) == ["fd00:61::", "fd00:61:0:1::"]

        error = await refused(kube.patch(PREFIX_POOLS, "p6", {"spec": {"prefixes": ["fd00:61:0:2::/63"]}}, namespace))
        assert error.status == 422, error
        assert (
            "existing allocations become non-allocatable: the new spec leaves out 2 address(es) in use" in error.message
        ), error.message
        assert "fd00:61::" not in error.message and f"{namespace}/a" not in error.message
        exclude = {"spec": {"excludedPrefixes": ["fd00:61:0:1::/64"]}}
        error = await refused(kube.patch(PREFIX_POOLS, "p6", exclude, namespace))
        assert "non-allocatable: the new spec leaves out 1 address(es) in use" in error.message, error.message

        # Widening, excluding a free child and touching no spec field are allowed.
        await kube.patch(PREFIX_POOLS, "p6", {"spec": {"prefixes": ["fd00:61::/60"]}}, namespace)
        await kube.patch(PREFIX_POOLS, "p6", {"spec": {"excludedPrefixes": ["fd00:61:0:5::/64"]}}, namespace)
        await kube.patch(PREFIX_POOLS, "p6", {"metadata": {"annotations": {"note": "x"}}}, namespace)
        # A spec CEL lets through (a reversed range) is refused with the backend's message, on update and create.
        reversed_range = ["fd00:61::9-fd00:61::1"]
        said = "provided entry is not a valid IP, range, nor CIDR: fd00:61::9-fd00:61::1"
        error = await refused(kube.patch(PREFIX_POOLS, "p6", {"spec": {"excludedPrefixes": reversed_range}}, namespace))
        assert said in error.message, error.message
        body = labelled(prefix_pool("bad", ["fd00:62::/62"], excludedPrefixes=reversed_range), label)
        error = await refused(kube.create(PREFIX_POOLS, body, namespace))
        assert error.status == 422 and said in error.message, error.message

        # Deleting the pool in use is refused, counting its IPAddresses, unless the Go provider's annotation says not.
        error = await refused(kube.delete(PREFIX_POOLS, "p6", namespace))
        assert error.status == 403, error
        assert "Pool has IPAddresses allocated." in error.message and "IPAddress(es) name the pool" in error.message
        await kube.patch(PREFIX_POOLS, "p6", {"metadata": {"annotations": {SKIP_DELETE_VALIDATION: ""}}}, namespace)
        assert await kube.delete(PREFIX_POOLS, "p6", namespace)
