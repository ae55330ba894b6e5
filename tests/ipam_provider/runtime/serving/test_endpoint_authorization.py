"""The secure metrics endpoint against the real API server (RBAC on): `ipam-provider run` serves /metrics over
HTTPS on --diagnostics-address and lets in only tokens the API server authenticates and authorises for `get`
/metrics, as Cluster API's diagnostics endpoint does; and the reviews behind it, in-process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from pathlib import Path

import aiohttp
import pytest

from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.serving.certificates import CertificateFiles, ServingCertificate
from ipam_provider.runtime.serving.endpoint import MetricsEndpoint
from ipam_provider.runtime.serving.reviews import Reviewer
from tests.support.cluster import wait_for
from tests.support.controller import controller_command
from tests.support.metrics import bind_metrics_reader, remove_reader_binding, scrape, service_account_token


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def answered(url: str, token: str | None) -> tuple[int, str] | None:
    """The endpoint's answer once it listens and reviews requests (it says 503 until it has an API client)."""
    try:
        status, body = await scrape(url, token)
    except aiohttp.ClientConnectionError:
        return None
    return (status, body) if status != 503 else None


async def test_only_authorised_tokens_get_the_metrics(
    kube: KubeClient, kubeconfig: Path, namespace: str, metrics_reader_token: str
) -> None:
    outsider = await service_account_token(kube, namespace, "outsider", reader=False)
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *controller_command(kubeconfig, namespace),
        f"--diagnostics-address=127.0.0.1:{port}",
        "--health-probe-bind-address=0",
        "--log-format=json",
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ},
    )
    url = f"https://127.0.0.1:{port}/metrics"
    try:
        status, body = await wait_for(
            lambda: answered(url, metrics_reader_token), timeout=60, message="the metrics endpoint to serve"
        )
        assert status == 200, body
        assert "process_cpu_seconds_total" in body and "python_info" in body
        status, body = await scrape(url, metrics_reader_token, accept="application/openmetrics-text; version=1.0.0")
        assert status == 200 and body.rstrip().endswith("# EOF"), body[-200:]

        status, body = await scrape(url, outsider)
        assert status == 403, body
        assert f"system:serviceaccount:{namespace}:outsider" in body
        status, body = await scrape(url)
        assert status == 401 and "no bearer token" in body, body
        status, body = await scrape(url, "not-a-token")
        assert status == 401 and "not valid" in body, body
        status, body = await scrape(f"https://127.0.0.1:{port}/", metrics_reader_token)
        assert status == 404
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, stderr.decode()[-3000:]
    log = stderr.decode()
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    (serving,) = [r for r in records if r["event"] == "serving the metrics over HTTPS"]
    assert serving["certificate"] == "self-signed" and serving["address"] == f"127.0.0.1:{port}"
    for token in (metrics_reader_token, outsider):
        assert token not in log, "a token was logged"


async def test_reviews_are_cached_and_follow_rbac(kube: KubeClient, namespace: str) -> None:
    now = [0.0]
    token = await service_account_token(kube, namespace, "cached", reader=False)
    reviewer = Reviewer(kube, cache_seconds=10.0, clock=lambda: now[0])
    user = await reviewer.authenticate(token)
    assert user is not None and user.name == f"system:serviceaccount:{namespace}:cached"
    assert "system:serviceaccounts" in user.groups
    assert await reviewer.authenticate(token) == user
    assert await reviewer.authenticate("not-a-token") is None
    assert await reviewer.authenticate("not-a-token") is None
    assert not await reviewer.authorize(user, "/metrics", "get")
    assert not await reviewer.authorize(user, "/metrics", "get")
    assert reviewer.reviews == 3, "one review per token and per decision while cached"

    await bind_metrics_reader(kube, namespace, "cached")
    try:
        assert not await reviewer.authorize(user, "/metrics", "get"), "the cached denial holds until it expires"
        now[0] += 10.0
        assert await reviewer.authorize(user, "/metrics", "get"), "then the API server is asked again"
        assert not await reviewer.authorize(user, "/metrics", "post"), "the role grants get only"
        assert not await reviewer.authorize(user, "/other", "get"), "and only on /metrics"
        assert reviewer.reviews == 6
    finally:
        await remove_reader_binding(kube, namespace, "cached")


def broken_kubeconfig(kubeconfig: Path, directory: Path, broken: str) -> Path:
    """The session's kubeconfig pointing at a closed port, or with a token the API server does not accept."""
    config = json.loads(kubeconfig.read_text())
    if broken == "closed-port":
        for entry in config["clusters"]:
            entry["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    else:
        config["users"] = [{**u, "user": {"token": "refused-token"}} for u in config["users"]]
    path = directory / "kubeconfig"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("broken", ["closed-port", "refused"])
async def test_a_review_that_cannot_be_made_is_an_error_answer(kubeconfig: Path, tmp_path: Path, broken: str) -> None:
    """API server unreachable: 503; the API server refuses the review (this identity may not create
    TokenReviews): 500. Either way the body says why, and the endpoint keeps serving."""
    kube = await KubeClient.from_kubeconfig(str(broken_kubeconfig(kubeconfig, tmp_path, broken)))
    endpoint = MetricsEndpoint(ServingCertificate.load(CertificateFiles(None)))
    endpoint.reviewer = Reviewer(kube)
    port = free_port()
    await endpoint.start("127.0.0.1", port)
    try:
        status, body = await scrape(f"https://127.0.0.1:{port}/metrics", "some-token")
        if broken == "closed-port":
            assert status == 503 and "did not answer the TokenReview" in body, body
        else:
            assert status == 500 and "refused the TokenReview" in body and "401" in body, body
        assert "some-token" not in body
    finally:
        await endpoint.close()
        await kube.close()
