"""The command line's pieces that need no API server: bind addresses and the leader-election exit code."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import cast

import pytest

from ipam_provider import cli
from ipam_provider.cli import lead_and_run
from ipam_provider.controller import Controller
from ipam_provider.runtime.flagforms import host_port
from ipam_provider.runtime.leader import LeaderElector


def test_bind_addresses_in_every_controller_runtime_form() -> None:
    assert host_port("0") is None and host_port("") is None
    assert host_port(":8080") == ("0.0.0.0", 8080)
    assert host_port("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert host_port("[::]:8080") == ("::", 8080)
    assert host_port("[::1]:9090") == ("::1", 9090)
    assert host_port("localhost:8081") == ("localhost", 8081)
    with pytest.raises(ValueError, match="brackets"):
        host_port("::1:8080")


class FakeController:
    def __init__(self) -> None:
        self._stopping = asyncio.Event()
        self.ran = False

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        self.ran = True
        await self._stopping.wait()

    async def wait_stopping(self) -> None:
        await self._stopping.wait()


class FakeElector:
    def __init__(self, *, lose_after: float | None) -> None:
        self.lose_after = lose_after
        self.released = False

    async def acquire(self) -> None:
        return None

    async def keep(self) -> None:
        if self.lose_after is None:
            await asyncio.Event().wait()
        else:
            await asyncio.sleep(self.lose_after)

    async def release(self) -> None:
        self.released = True


async def _lead(controller: FakeController, elector: FakeElector) -> int:
    return await lead_and_run(cast(Controller, controller), cast(LeaderElector, elector), asyncio.Event())


async def test_losing_the_lease_exits_non_zero() -> None:
    controller, elector = FakeController(), FakeElector(lose_after=0.05)
    assert await asyncio.wait_for(_lead(controller, elector), 5) == 1
    assert controller.ran and not elector.released, "a lost lease is not ours to release"


async def test_sigterm_while_leading_exits_zero_and_gives_the_lease_up() -> None:
    controller, elector = FakeController(), FakeElector(lose_after=None)
    task = asyncio.create_task(_lead(controller, elector))
    await asyncio.sleep(0.05)
    controller.stop()
    assert await asyncio.wait_for(task, 5) == 0
    assert elector.released


def test_a_fatal_error_is_one_json_record_and_exit_1() -> None:
    """An error nothing below handles (here: one raised where the API client is built) ends the process with
    exit 1 and is logged in the log's format: in JSON mode every line is JSON, the traceback structured."""
    flags = [
        "run",
        "--log-format=json",
        "--metrics-bind-address=0",
        "--health-probe-bind-address=0",
        "--webhook-port=0",
    ]
    script = (
        "import sys\n"
        "from ipam_provider import cli\n"
        "async def unexpected(*args, **kwargs):\n"
        "    raise RuntimeError('unexpected')\n"
        "cli.KubeClient.from_kubeconfig = unexpected\n"
        f"sys.exit(cli.main({flags!r}))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1, result.stderr
    records = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
    (fatal,) = [r for r in records if r["level"] == "critical"]
    assert fatal["event"] == "controller failed"
    assert isinstance(fatal["exception"], list) and fatal["exception"][0]["exc_type"], fatal


def test_the_controller_runs_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """`run` drives the controller on uvloop's event loop (less CPU per API request than asyncio's)."""
    loops: list[str] = []

    async def fake_run(options: object) -> int:
        loops.append(type(asyncio.get_running_loop()).__module__)
        return 0

    monkeypatch.setattr(cli, "run", fake_run)
    monkeypatch.setattr(cli, "configure_logging", lambda *args, **kwargs: None)  # leave the tests' logging alone
    assert cli.main(["run", "--metrics-bind-address=0", "--health-probe-bind-address=0"]) == 0
    assert loops and loops[0].startswith("uvloop"), loops
