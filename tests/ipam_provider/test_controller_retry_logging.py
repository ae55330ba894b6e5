"""A failing reconcile logs its traceback once per failure streak: on the first failure of a key, not on the
retries that follow, again only when the error's type changes; a success ends the streak. Conflicts (another
writer was first) never carry one, nor use up the streak's."""

from __future__ import annotations

from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import pytest_asyncio
import structlog
from kubernetes_asyncio import client

from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.controller import Controller, ControllerSettings
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.watch import ClaimKey


@pytest_asyncio.fixture
async def controller() -> AsyncIterator[Controller]:
    kube = KubeClient(client.ApiClient(client.Configuration()))  # never used: nothing here talks to a server
    yield Controller(kube, BackendRegistry(), ControllerSettings())
    await kube.close()


def failures(controller: Controller, key: ClaimKey, *errors: BaseException) -> list[MutableMapping[str, Any]]:
    with structlog.testing.capture_logs() as records:
        for error in errors:
            controller._retry(key, None, error)
    return [r for r in records if r["event"] == "reconcile failed; retrying"]


async def test_the_traceback_is_logged_on_the_first_failure_of_a_streak_only(controller: Controller) -> None:
    key = ClaimKey("ns", "claim")
    first, second = RuntimeError("boom"), RuntimeError("boom again")
    streak = failures(controller, key, first, second, second)
    assert [r["exc_info"] for r in streak] == [first, None, None]
    assert [r["failures"] for r in streak] == [1, 2, 3]
    assert {r["log_level"] for r in streak} == {"warning"}
    other = ClaimKey("ns", "other")  # streaks are per key
    assert [r["exc_info"] for r in failures(controller, other, first)] == [first]

    controller._succeeded(key)  # a success ends the streak
    again = RuntimeError("back")
    assert [r["exc_info"] for r in failures(controller, key, again, again)] == [again, None]


async def test_a_conflict_or_a_429_is_logged_at_debug_without_traceback(controller: Controller) -> None:
    conflict = ApiError(409, "Conflict", "the object has been modified")
    throttled = ApiError(429, "TooManyRequests", "storage is (re)initializing")
    records = failures(controller, ClaimKey("ns", "claim"), conflict, throttled)
    assert [(r["log_level"], r["exc_info"]) for r in records] == [("debug", None), ("debug", None)]


async def test_a_conflict_does_not_use_up_the_streak_and_a_new_error_type_is_traced(controller: Controller) -> None:
    key = ClaimKey("ns", "claim")
    conflict = ApiError(409, "Conflict", "the object has been modified")
    boom, other = RuntimeError("boom"), ValueError("bad value")
    streak = failures(controller, key, conflict, boom, boom, other, other, boom)
    assert [r["exc_info"] for r in streak] == [None, boom, None, other, None, boom]
