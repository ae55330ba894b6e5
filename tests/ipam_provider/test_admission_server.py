"""The admission webhook server on its own (no API server): malformed reviews are answered 400 and logged and the
server keeps serving; a review is answered within the API server's timeout even when its check hangs; a check that
raises is a refusal with code 500; before the controller hands it its API client it answers 503.

Reviews here need no API client: the pool's IPAddresses come from a stand-in for the controller's cache.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
import pytest_asyncio
import structlog

from backends.incluster.backend import IN_CLUSTER_POOL, InClusterBackend
from ipam_provider.admission import PoolAdmission, webhook_path
from ipam_provider.backend.contract import AddressInUse, BackendContext, PoolKind, PoolRef
from ipam_provider.backend.protocol import Capabilities
from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.common import Object
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.serving.certificates import CertificateFiles, ServingCertificate
from ipam_provider.runtime.serving.webhook import ALLOWED, Verdict, WebhookServer, parse_review
from tests.support.fake_backend import FAKE_POOL, GLOBAL_FAKE_POOL, FakeBackend

IN_CLUSTER_PATH = webhook_path(IN_CLUSTER_POOL)
FAKE_PATH = webhook_path(FAKE_POOL)


@dataclass
class ReviewingBackend(FakeBackend):
    """The fake backend with `review_pool_change`: it answers `reasons`, raises `error`, or waits on `hold`."""

    reasons: list[str] = field(default_factory=list)
    error: Exception | None = None
    hold: asyncio.Event | None = None

    def capabilities(self) -> Capabilities:
        return dataclasses.replace(super().capabilities(), review_pool_change=self.review_pool_change)

    async def review_pool_change(
        self, pool_ref: PoolRef, old: Object | None, new: Object | None, in_use: Sequence[AddressInUse]
    ) -> list[str]:
        if self.hold is not None:
            await self.hold.wait()
        if self.error is not None:
            raise self.error
        return list(self.reasons)


def test_paths_are_kubebuilders() -> None:
    assert IN_CLUSTER_PATH == "/validate-ipam-cluster-x-k8s-io-v1alpha2-inclusterippool"


def review(kind: PoolKind, operation: str, new: Object | None, old: Object | None = None) -> Object:
    request: Object = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": kind.group, "version": kind.version, "kind": kind.kind},
        "resource": {"group": kind.group, "version": kind.version, "resource": kind.plural},
        "namespace": "team-a",
        "name": "net",
        "operation": operation,
        "object": new,
        "oldObject": old,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def pool_object(kind: PoolKind, **spec: Any) -> Object:
    meta = {"name": "net", "namespace": "team-a", "uid": "0d6c-pool", "resourceVersion": "7"}
    return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": meta, "spec": spec}


@dataclass
class Served:
    server: WebhookServer
    backend: ReviewingBackend
    in_use: list[Object]
    session: aiohttp.ClientSession
    pools: list[Object] = field(default_factory=list)  # the cached pools

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.server.port}{path}"

    async def post(self, path: str, body: bytes, query: str = "") -> tuple[int, Any]:
        async with self.session.post(self.url(path) + query, data=body) as reply:
            text = await reply.text()
            is_json = reply.content_type == "application/json"
            return reply.status, json.loads(text) if is_json else text


@pytest_asyncio.fixture
async def served() -> AsyncIterator[Served]:
    kube = cast(KubeClient, object())  # never used: the cache stand-in answers every pool
    backend = ReviewingBackend()
    registry = BackendRegistry([InClusterBackend(BackendContext(kube=kube)), backend])
    in_use: list[Object] = []
    server = WebhookServer(ServingCertificate.load(CertificateFiles(None)))
    await server.start("127.0.0.1", 0)
    client_context = ssl.create_default_context()
    client_context.check_hostname = False
    client_context.verify_mode = ssl.CERT_NONE  # the development certificate: self-signed
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context))
    served = Served(server, backend, in_use, session)
    try:
        assert not server.serving
        status, text = await served.post(IN_CLUSTER_PATH, b"{}")
        assert status == 503 and "starting" in text
        server.use(PoolAdmission(kube, registry, lambda ref: in_use, lambda kind: served.pools).routes())
        assert server.serving
        yield served
    finally:
        await session.close()
        await server.close()


def encoded(body: Any) -> bytes:
    return json.dumps(body).encode()


MALFORMED: list[tuple[bytes, str]] = [
    (b"not json", "malformed AdmissionReview"),
    (b"\xff\xfe", "malformed AdmissionReview"),
    (encoded([1, 2]), "not a JSON object"),
    (encoded({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}), "admission.k8s.io/v1"),
    (encoded({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}), "no request"),
    (encoded({**review(IN_CLUSTER_POOL, "CREATE", {}), "request": {"operation": "CREATE"}}), "no uid"),
    (encoded({**review(IN_CLUSTER_POOL, "CREATE", {}), "request": {"uid": "u", "operation": "PATCH"}}), "PATCH"),
    (encoded({**review(IN_CLUSTER_POOL, "CREATE", {}), "request": {"uid": "u", "operation": "CREATE"}}), "no kind"),
    (encoded(review(IN_CLUSTER_POOL, "CREATE", cast(Object, "a string"))), "object is not an object"),
    (b"[" * 100_000 + b"]" * 100_000, "malformed AdmissionReview"),  # deeper than the JSON decoder recurses
]


async def test_malformed_reviews_are_400_logged_and_the_server_serves_on(served: Served) -> None:
    with structlog.testing.capture_logs() as logs:
        for body, said in MALFORMED:
            status, text = await served.post(IN_CLUSTER_PATH, body)
            assert status == 400 and said in text, (body, status, text)
    warnings = [entry for entry in logs if entry["event"] == "malformed admission review"]
    assert len(warnings) == len(MALFORMED) and all(entry["log_level"] == "warning" for entry in warnings)
    # Still serving: a valid pool is allowed, an invalid one refused with the backend's message, code 422.
    good = pool_object(IN_CLUSTER_POOL, addresses=["10.0.0.0/24"], prefix=24)
    status, answer = await served.post(IN_CLUSTER_PATH, encoded(review(IN_CLUSTER_POOL, "CREATE", good)))
    assert status == 200 and answer["response"] == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}
    bad = pool_object(IN_CLUSTER_POOL, addresses=["10.0.0.5", "10.0.1.5"], prefix=24)
    _, answer = await served.post(IN_CLUSTER_PATH, encoded(review(IN_CLUSTER_POOL, "CREATE", bad)))
    status = answer["response"]["status"]
    assert answer["response"]["allowed"] is False and (status["code"], status["reason"]) == (422, "Invalid")
    assert status["message"] == (
        "InClusterIPPool net: the pool's spec is invalid: "
        "provided address belongs to a different subnet than others: 10.0.1.5 (spec.addresses[1])"
    )


async def test_other_paths(served: Served) -> None:
    body = encoded(review(FAKE_POOL, "CREATE", pool_object(FAKE_POOL)))
    status, answer = await served.post("/validate-example-com-v1-unknownpool", body)
    assert status == 200 and answer["response"]["allowed"] is True  # a kind no loaded backend serves
    status, _ = await served.post("/mutate-anything", body)
    assert status == 404
    # A review of another kind than the path's is refused as a bad request.
    _, answer = await served.post(IN_CLUSTER_PATH, body)
    assert answer["response"]["allowed"] is False and answer["response"]["status"]["code"] == 400


async def test_a_hanging_check_is_answered_within_the_timeout(served: Served) -> None:
    served.backend.hold = asyncio.Event()  # never set: the check never ends
    body = encoded(review(FAKE_POOL, "UPDATE", pool_object(FAKE_POOL, size=2), pool_object(FAKE_POOL, size=1)))
    status, answer = await served.post(FAKE_PATH, body, "?timeout=1s")
    assert status == 200 and answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 500
    assert "could not check the change within 0.5 s" in answer["response"]["status"]["message"]


async def test_a_failing_check_is_a_refusal_with_code_500(served: Served) -> None:
    served.backend.error = RuntimeError("backend bug")
    body = encoded(review(FAKE_POOL, "CREATE", pool_object(FAKE_POOL)))
    with structlog.testing.capture_logs() as logs:
        status, answer = await served.post(FAKE_PATH, body)
    assert status == 200 and answer["response"]["status"]["code"] == 500
    assert "RuntimeError: backend bug" in answer["response"]["status"]["message"]
    assert any(entry["event"] == "admission check failed" for entry in logs)
    served.backend.error = None
    served.backend.reasons = ["no, because"]
    _, answer = await served.post(FAKE_PATH, body)
    assert answer["response"]["status"]["message"] == "FakeIPPool net: no, because"
    served.backend.reasons = [f"reason {number}" for number in range(25)]  # the first 20, the rest counted
    _, answer = await served.post(FAKE_PATH, body)
    assert answer["response"]["status"]["message"] == (
        "FakeIPPool net: " + "; ".join(f"reason {number}" for number in range(20)) + "; and 5 more"
    )


async def test_delete_of_a_pool_in_use_is_refused_for_any_kind(served: Served) -> None:
    pool = pool_object(FAKE_POOL)
    address: Object = {
        "metadata": {"name": "m1", "namespace": "team-a"},
        "spec": {
            "address": "10.0.0.10",
            "poolRef": {"apiGroup": FAKE_POOL.group, "kind": FAKE_POOL.kind, "name": "net"},
            "claimRef": {"name": "m1"},
        },
    }
    served.in_use.append(address)
    served.pools.append(pool)
    _, answer = await served.post(FAKE_PATH, encoded(review(FAKE_POOL, "DELETE", None, pool)))
    status = answer["response"]["status"]
    assert answer["response"]["allowed"] is False and (status["code"], status["reason"]) == (403, "Forbidden")
    assert status["message"].startswith("Pool has IPAddresses allocated. Cannot delete Pool until all IPAddresses")
    listing = "1 IPAddress(es) name the pool (`kubectl get ipaddresses.ipam.cluster.x-k8s.io -n team-a "
    assert listing in status["message"]
    assert "m1" not in status["message"] and "10.0.0.10" not in status["message"]  # the caller may be anyone
    for annotation in (
        "ipam.cluster.x-k8s.io/skip-validate-delete-webhook",
        "clusterctl.cluster.x-k8s.io/delete-for-move",
    ):
        annotated = {**pool, "metadata": {**pool["metadata"], "annotations": {annotation: ""}}}
        _, answer = await served.post(FAKE_PATH, encoded(review(FAKE_POOL, "DELETE", None, annotated)))
        assert answer["response"]["allowed"] is True, annotation
        if annotation.startswith("ipam."):  # a person's choice: told what it leaves behind
            (warning,) = answer["response"]["warnings"]
            assert warning.startswith("FakeIPPool/team-a/net still has 1 IPAddress(es) in use; ")
            assert "m1" not in warning
        else:  # clusterctl move's: nothing is read
            assert "warnings" not in answer["response"]
    served.in_use[0] = {**address, "metadata": {**address["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    _, answer = await served.post(FAKE_PATH, encoded(review(FAKE_POOL, "DELETE", None, pool)))
    assert answer["response"]["allowed"] is True, "an IPAddress being deleted is not in use"


@pytest.mark.parametrize("timeout", ["", "?timeout=banana", "?timeout=30s"])
async def test_timeouts_the_api_server_sends(served: Served, timeout: str) -> None:
    body = encoded(review(FAKE_POOL, "CREATE", pool_object(FAKE_POOL)))
    status, answer = await served.post(FAKE_PATH, body, timeout)
    assert status == 200 and answer["response"]["allowed"] is True


async def test_readyz_is_the_webhooks_when_it_serves() -> None:
    """Without the webhook, /readyz follows the caches (synced, or a standby); with it, the webhook serving from
    the synced caches every replica runs."""
    from ipam_provider.cli import Endpoints
    from ipam_provider.flags import parse_args
    from tests.ipam_provider.test_cli import free_port

    health = free_port()
    argv = ["run", "--metrics-bind-address=0", f"--health-addr=127.0.0.1:{health}"]
    endpoints = await Endpoints.bind(parse_args([*argv, "--webhook-host=127.0.0.1", "--webhook-port=0"]).options)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{health}/readyz") as reply:
                assert (reply.status, await reply.text()) == (503, "caches not synced")  # no webhook: caches decide
            endpoints.ready = lambda: True
            async with session.get(f"http://127.0.0.1:{health}/readyz") as reply:
                assert reply.status == 200
    finally:
        await endpoints.close()
    webhook = free_port()
    endpoints = await Endpoints.bind(
        parse_args([*argv, "--webhook-host=127.0.0.1", f"--webhook-port={webhook}"]).options
    )
    try:
        assert endpoints.webhook is not None and endpoints.webhook.port == webhook
        endpoints.ready = lambda: False  # the leader's caches (claims, Clusters) do not count: a standby's
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{health}/readyz") as reply:
                assert (reply.status, await reply.text()) == (503, "webhook not serving")
            kube = cast(KubeClient, object())
            endpoints.use_admission(PoolAdmission(kube, BackendRegistry([FakeBackend()])))
            async with session.get(f"http://127.0.0.1:{health}/readyz") as reply:  # a replica starting
                assert (reply.status, await reply.text()) == (503, "caches not synced")
            endpoints.admission_synced = lambda: True  # the caches every replica runs, standby or leader
            async with session.get(f"http://127.0.0.1:{health}/readyz") as reply:
                assert reply.status == 200, "a standby answers from its synced caches: it stays in the Service"
    finally:
        await endpoints.close()


@pytest_asyncio.fixture
async def unreachable(tmp_path: Path) -> AsyncIterator[KubeClient]:
    """A real API client of a server that does not listen: every request fails at once (connection refused)."""
    from tests.ipam_provider.test_cli import free_port

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{free_port()}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    kube = await KubeClient.from_kubeconfig(str(path))
    try:
        yield kube
    finally:
        await kube.close()


def annotated(pool: Object, annotation: str) -> Object:
    return {**pool, "metadata": {**pool["metadata"], "annotations": {annotation: ""}}}


SKIP, MOVE = "ipam.cluster.x-k8s.io/skip-validate-delete-webhook", "clusterctl.cluster.x-k8s.io/delete-for-move"


async def test_what_needs_no_read_is_decided_without_one(unreachable: KubeClient) -> None:
    """An UPDATE of metadata only (the controller's finalizer removal) and a DELETE under either annotation are
    decided without the API server; a change that needs the IPAddresses fails for want of them."""
    backend = ReviewingBackend(reasons=["the backend is not asked about metadata"])
    registry = BackendRegistry([InClusterBackend(BackendContext(kube=unreachable)), backend])
    admission = PoolAdmission(unreachable, registry)  # no cache: IPAddresses would be listed

    async def decide(kind: PoolKind, operation: str, new: Object | None, old: Object) -> Verdict:
        return await admission.decide(parse_review(review(kind, operation, new, old)), kind)

    pool = pool_object(IN_CLUSTER_POOL, addresses=["10.0.0.0/24"], prefix=24)
    finalized = {**pool, "metadata": {**pool["metadata"], "finalizers": ["ipam.cluster.x-k8s.io/ProtectPool"]}}
    assert await decide(IN_CLUSTER_POOL, "UPDATE", pool, finalized) == ALLOWED
    fake = pool_object(FAKE_POOL, size=1)
    assert await decide(FAKE_POOL, "UPDATE", annotated(fake, "x"), fake) == ALLOWED
    for annotation in (SKIP, MOVE):  # the skip annotation's warning needs the IPAddresses: none, when unread
        assert await decide(FAKE_POOL, "DELETE", None, annotated(fake, annotation)) == ALLOWED, annotation
    widened = pool_object(IN_CLUSTER_POOL, addresses=["10.0.0.0/23"], prefix=23)
    with pytest.raises(aiohttp.ClientError):
        await decide(IN_CLUSTER_POOL, "UPDATE", widened, pool)
    with pytest.raises(aiohttp.ClientError):
        await decide(FAKE_POOL, "DELETE", None, fake)


async def test_a_delete_without_its_old_object(unreachable: KubeClient) -> None:
    """API servers send `oldObject` with every DELETE: a review without it, or without a name, is a bad request,
    answered without a read."""
    admission = PoolAdmission(
        unreachable, BackendRegistry([ReviewingBackend()]), lambda ref: [address_of(FAKE_POOL, "m1")]
    )
    delete = parse_review(review(FAKE_POOL, "DELETE", None, None))
    verdict = await admission.decide(delete, FAKE_POOL)
    assert delete.old is None and (verdict.allowed, verdict.code) == (False, 400) and "oldObject" in verdict.message
    nameless = review(FAKE_POOL, "DELETE", None, None)
    nameless["request"]["name"] = ""
    assert (await admission.decide(parse_review(nameless), FAKE_POOL)).code == 400


def address_of(kind: PoolKind, claim: str) -> Object:
    return {
        "metadata": {"name": claim, "namespace": "team-a"},
        "spec": {
            "address": "10.0.0.10",
            "poolRef": {"apiGroup": kind.group, "kind": kind.kind, "name": "net"},
            "claimRef": {"name": claim},
        },
    }


async def test_a_replica_whose_caches_have_not_synced_lists_no_namespace_but_the_pools(unreachable: KubeClient) -> None:
    """A replica starting (no cache answers yet): a namespaced pool's IPAddresses are listed in its namespace (here
    the LIST fails: it was sent), and a cluster-scoped pool's change is refused with 503, to be retried, without a
    LIST."""
    registry = BackendRegistry([ReviewingBackend()])
    starting = PoolAdmission(unreachable, registry)  # no cache answers
    fake = pool_object(FAKE_POOL)
    with pytest.raises(aiohttp.ClientError):
        await starting.decide(parse_review(review(FAKE_POOL, "DELETE", None, fake)), FAKE_POOL)
    global_pool = {**pool_object(GLOBAL_FAKE_POOL), "metadata": {"name": "net"}}
    delete = review(GLOBAL_FAKE_POOL, "DELETE", None, global_pool)
    delete["request"].pop("namespace")
    verdict = await starting.decide(parse_review(delete), GLOBAL_FAKE_POOL)
    assert (verdict.allowed, verdict.code, verdict.reason) == (False, 503, "ServiceUnavailable")
    assert "caches" in verdict.message and "try again" in verdict.message
    # Once synced, a replica (leader or standby) lists what its cache does not cover (--namespace), as before.
    synced = PoolAdmission(unreachable, registry, lambda ref: None, lambda kind: [], lambda: True)
    with pytest.raises(aiohttp.ClientError):
        await synced.decide(parse_review(delete), GLOBAL_FAKE_POOL)
