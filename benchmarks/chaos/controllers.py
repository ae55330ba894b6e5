"""The controller replicas under chaos: real `ipam-provider run` processes with `--leader-elect`, kept running by a
supervisor as a Deployment's kubelet would (a replica that exits, killed or not, is started again after a pause).

`kill_all()` SIGKILLs every replica (the controller as a whole dies); `kill_leader()` SIGKILLs the one holding the
lease, so that a standby must take over once the lease runs out. A replica is matched to the lease by the
identity it logs when it starts waiting for leadership.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from benchmarks._support import start_process, stop_process
from ipam_provider.flags import build_parser
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import LEASES
from tools.controller_command import controller_command

log = structlog.get_logger(__name__)
LEASE_NAME = "capi-ipam-provider-chaos"
RESTART_PAUSE = 1.0
# client-go's proportions, scaled down so that a takeover happens within seconds.
LEADER_FLAGS = (
    "--leader-elect",
    "--leader-elect-lease-duration=6s",
    "--leader-elect-renew-deadline=4s",
    "--leader-elect-retry-period=1s",
)


def supported_flags(flags: Sequence[str]) -> tuple[list[str], list[str]]:
    """`flags` split into those this checkout's `ipam-provider run` accepts and those it refuses."""
    accepted, refused = [], []
    for flag in flags:
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                build_parser().parse_args(["run", flag])
            accepted.append(flag)
        except SystemExit:
            refused.append(flag)
    return accepted, refused


@dataclass
class Replica:
    index: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    offset: int = 0  # where the current process's log starts
    starts: int = 0
    exits: list[int] = field(default_factory=list)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def identity(self) -> str:
        """The leader-election identity the current process logged, or "" before it logged one."""
        with contextlib.suppress(OSError), self.log_path.open("rb") as stream:
            stream.seek(self.offset)
            for raw in stream:
                with contextlib.suppress(ValueError):
                    line = json.loads(raw)
                    if isinstance(line, dict) and line.get("event") == "waiting for leadership":
                        return str(line.get("identity", ""))
        return ""


class Replicas:
    def __init__(self, kubeconfig: Path, namespace: str, directory: Path, count: int, extra: Sequence[str]) -> None:
        """`count` replicas serving `namespace` through `kubeconfig` (the relay's), logging under `directory`;
        `extra` flags are passed to each."""
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.replicas = [Replica(i, directory / f"controller-{i}.log") for i in range(count)]
        self.argv = controller_command(
            kubeconfig,
            namespace,
            "--metrics-bind-address=0",
            "--health-probe-bind-address=0",
            "--log-format=json",
            "--log-level=info",
            f"--leader-election-namespace={namespace}",
            f"--leader-election-id={LEASE_NAME}",
            *LEADER_FLAGS,
            *extra,
        )
        self._supervisor: asyncio.Task[None] | None = None
        self.unplanned_exits = 0
        self._planned: set[int] = set()

    def start(self) -> None:
        for replica in self.replicas:
            self._launch(replica)
        self._supervisor = asyncio.create_task(self._supervise())

    async def stop(self) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        await asyncio.gather(*(asyncio.to_thread(stop_process, r.process) for r in self.replicas))

    def _launch(self, replica: Replica) -> None:
        replica.offset = replica.log_path.stat().st_size if replica.log_path.exists() else 0
        replica.process = start_process(self.argv, replica.log_path, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        replica.starts += 1

    async def _supervise(self) -> None:
        while True:
            for replica in self.replicas:
                process = replica.process
                if process is None or process.poll() is None:
                    continue
                replica.exits.append(process.returncode)
                if process.pid in self._planned:
                    self._planned.discard(process.pid)
                else:
                    self.unplanned_exits += 1
                    log.info("controller replica exited", replica=replica.index, code=process.returncode)
                replica.process = None
                await asyncio.sleep(RESTART_PAUSE)
                self._launch(replica)
            await asyncio.sleep(0.2)

    def _kill(self, replica: Replica) -> None:
        if replica.process is not None and replica.process.poll() is None:
            self._planned.add(replica.process.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(replica.process.pid, signal.SIGKILL)

    def kill_all(self) -> None:
        for replica in self.replicas:
            self._kill(replica)

    async def leader(self, kube: KubeClient, timeout: float) -> Replica | None:
        """The replica holding the lease, waited for up to `timeout` seconds; None if none is seen holding it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                lease = await kube.get(LEASES, LEASE_NAME, self.namespace)
                holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
                for replica in self.replicas:
                    if holder and replica.alive() and replica.identity() == holder:
                        return replica
            await asyncio.sleep(0.5)
        return None

    async def kill_leader(self, kube: KubeClient, timeout: float) -> bool:
        """SIGKILL the lease holder; False if no live replica was seen holding it within `timeout` seconds."""
        leader = await self.leader(kube, timeout)
        if leader is None:
            return False
        self._kill(leader)
        return True

    def all_alive(self) -> bool:
        return all(replica.alive() for replica in self.replicas)
