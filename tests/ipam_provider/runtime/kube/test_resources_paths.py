"""Request paths are built in one place (`Resource.path`, runtime/kube/resources.py), which refuses any name that
is not a path segment: no other module writes a path by concatenation, and KubeClient sends nothing for a name such
as `../../x`, whatever the call."""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from ipam_provider.api.capi import CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import NAMESPACES, SECRETS, InvalidName

ROOT = Path(__file__).resolve().parents[4]
THE_ONE_PLACE = ROOT / "ipam_provider" / "runtime" / "kube" / "resources.py"
PATH_PIECES = ("/namespaces/", "/apis/", "/api/v1")
SEGMENTS = frozenset({"apis", "namespaces"})  # as the pieces of a "/".join(...)


def path_pieces(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string literal of `source`, f-strings' parts included, that holds a piece of an API
    server request path, or is one of its fixed segments."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if any(piece in text for piece in PATH_PIECES) or text.strip("/") in SEGMENTS:
                found.append((node.lineno, text))
    return found


def modules() -> list[Path]:
    return sorted(p for folder in ("ipam_provider", "backends") for p in (ROOT / folder).rglob("*.py"))


def test_no_module_but_resources_writes_a_request_path() -> None:
    offenders = {
        str(path.relative_to(ROOT)): pieces
        for path in modules()
        if path != THE_ONE_PLACE and (pieces := path_pieces(path.read_text()))
    }
    assert offenders == {}, "build request paths with Resource.path only"


def test_the_check_finds_paths_written_by_hand() -> None:
    for bad in (
        'path = f"/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}"',
        'path = "/api/v1/namespaces/" + namespace + "/secrets/" + name',
        'path = base + "/namespaces/" + ns',
        'path = "/".join(["apis", group, version, plural])',
    ):
        assert path_pieces(bad), bad
    assert path_pieces(THE_ONE_PLACE.read_text()), "the one place itself is found"
    assert len(modules()) > 50


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[str]]]:
    """An HTTP server that answers `{}` to anything and records the paths it was asked for."""
    asked: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        asked.append(request.raw_path)
        return web.json_response({"metadata": {"name": "x", "resourceVersion": "1"}, "items": []})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", asked
    finally:
        await runner.cleanup()


Call = Callable[[KubeClient], Awaitable[Any]]
BODY = {"metadata": {"name": "x"}}
CALLS: list[tuple[str, Call]] = [
    ("get a Secret ../../x", lambda kube: kube.get(SECRETS, "../../x", "team-a")),
    ("get a Secret in namespace ../team-b", lambda kube: kube.get(SECRETS, "netbox", "../team-b")),
    ("get a claim x/../../y", lambda kube: kube.get(CLAIMS, "x/../../y", "team-a")),
    ("get a Namespace ..", lambda kube: kube.get(NAMESPACES, "..")),
    ("get a Secret with %2F", lambda kube: kube.get(SECRETS, "a%2F..%2Fb", "team-a")),
    ("patch ../../x", lambda kube: kube.patch(CLAIMS, "../../x", {}, "team-a")),
    ("patch the status of ../../x", lambda kube: kube.patch(CLAIMS, "../../x", {}, "team-a", subresource="status")),
    ("patch a subresource ../x", lambda kube: kube.patch(CLAIMS, "c", {}, "team-a", subresource="../x")),
    ("delete ../../x", lambda kube: kube.delete(CLAIMS, "../../x", "team-a")),
    ("create in namespace ../x", lambda kube: kube.create(CLAIMS, BODY, "../x")),
    ("replace ../../x", lambda kube: kube.replace(CLAIMS, {"metadata": {"name": "../../x", "namespace": "a"}})),
    ("list namespace ../x", lambda kube: kube.list(CLAIMS, "../x")),
]


@pytest.mark.parametrize(("what", "call"), CALLS, ids=[what for what, _ in CALLS])
async def test_a_name_that_is_not_a_path_segment_is_refused_before_anything_is_sent(
    server: tuple[str, list[str]], what: str, call: Call
) -> None:
    host, asked = server
    kube = KubeClient(client.ApiClient(client.Configuration(host=host)))
    try:
        with pytest.raises(InvalidName) as refused:
            await call(kube)
        assert await kube.get(SECRETS, "fine", "team-a") is not None, "the server answers a valid request"
    finally:
        await kube.close()
    assert refused.value.status == 400 and refused.value.reason == "Invalid"
    assert asked == ["/api/v1/namespaces/team-a/secrets/fine"], f"{what}: nothing sent but the valid request"
