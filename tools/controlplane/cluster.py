"""Start and stop one local etcd + kube-apiserver pair, as controller-runtime's envtest does.

Each instance lives in its own state directory (ports, data, certificates, logs, pids), so several instances can
run side by side. `stop()` leaves no process and, for a temporary instance, no directory behind.
`restart_apiserver()` and `restart_etcd()` restart one process on its own ports, keeping etcd's data.
With `audit=True`, kube-apiserver writes an audit log (`audit_log_path`, JSON lines, one event per finished request
at Metadata level: who, verb, URI, object reference, status; no bodies).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from tools.controlplane.pki import write_pki

ADMIN_USER = "admin"
CONTROLLER_USER = "system:serviceaccount:capi-ipam-system:capi-ipam-controller-manager"
READY_TIMEOUT = 90.0
# Metadata level: who did what to which object, and the answer's status, without request or response bodies; one
# event per request (ResponseComplete, or Panic); in blocking mode a request waits until its event is written.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
"""
PKI_FILES = {"ca": "ca.crt", "cert": "server.crt", "key": "server.key", "sa_key": "sa.key", "sa_pub": "sa.pub"}


class ControlPlaneError(RuntimeError):
    """The control plane could not start; the message says why and where the logs are."""


@dataclass
class ControlPlaneState:
    """What `up` records so that `down` (maybe another process) can stop the instance."""

    directory: str
    apiserver_port: int
    etcd_port: int
    etcd_pid: int
    apiserver_pid: int
    admin_token: str
    controller_token: str
    etcd_peer_port: int = 0

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def ca_path(self) -> Path:
        return Path(self.directory) / "pki" / "ca.crt"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """Ask the kernel to SIGTERM this child when the process that started it dies (Linux only)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class LocalControlPlane:
    """One etcd + kube-apiserver pair rooted at `directory`."""

    STATE_FILE = "state.json"

    def __init__(
        self,
        directory: Path,
        binaries: Path | None = None,
        *,
        apiserver_flags: tuple[str, ...] = (),
        audit: bool = False,
    ) -> None:
        """`apiserver_flags` are added to kube-apiserver's command line (e.g. `--watch-cache=false`); `audit` turns
        on its audit log (`audit_log_path`)."""
        self.directory = directory.resolve()
        self.binaries = binaries
        self.apiserver_flags = apiserver_flags
        self.audit = audit
        self.state: ControlPlaneState | None = None
        self._preexec: Callable[[], object] | None = _die_with_parent
        self._pki = {name: self.directory / "pki" / file for name, file in PKI_FILES.items()}

    @property
    def kubeconfig_path(self) -> Path:
        return self.directory / "kubeconfig"

    @property
    def audit_log_path(self) -> Path:
        """kube-apiserver's audit log (JSON lines), written when started with `audit=True`."""
        return self.directory / "audit.log"

    def _audit_flags(self) -> list[str]:
        if not self.audit:
            return []
        policy = self.directory / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log_path}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
            "--audit-log-maxsize=0",
        ]

    def start(self, *, detach: bool = False) -> ControlPlaneState:
        """Start etcd and kube-apiserver and wait until the API serves namespace `default`.

        With `detach`, the processes outlive this Python process (for `make cluster-up`); otherwise they are
        signalled when it dies, so a killed test run leaves no orphans.
        """
        if self.binaries is None:
            raise ControlPlaneError("no binaries directory given")
        self.directory.mkdir(parents=True, exist_ok=True)
        pki_dir = self.directory / "pki"
        pki_dir.mkdir(exist_ok=True)
        self._pki = write_pki(pki_dir)
        admin_token, controller_token = secrets.token_hex(24), secrets.token_hex(24)
        token_file = pki_dir / "tokens.csv"
        token_file.write_text(
            f'{admin_token},{ADMIN_USER},admin-uid,"system:masters"\n'
            f'{controller_token},{CONTROLLER_USER},controller-uid,"system:serviceaccounts"\n'
        )
        token_file.chmod(0o600)
        etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
        self._preexec = None if detach else _die_with_parent
        self.state = ControlPlaneState(
            str(self.directory), api_port, etcd_port, 0, 0, admin_token, controller_token, peer_port
        )
        self._start_etcd()
        self._start_apiserver()
        self._write_kubeconfig()
        return self.state

    def restart_apiserver(self, *, kill: bool = False) -> None:
        """Stop kube-apiserver (SIGTERM, SIGKILL after 10 s; with `kill`, SIGKILL at once) and start it again on
        the same port with the same etcd; return once it serves namespace `default` again."""
        assert self.state is not None, "not started"
        _terminate(self.state.apiserver_pid, signal.SIGKILL if kill else signal.SIGTERM)
        self._start_apiserver()

    def restart_etcd(self, *, kill: bool = False) -> None:
        """Stop etcd (SIGTERM, SIGKILL after 10 s; with `kill`, SIGKILL at once) and start it again on the same
        ports with the same data directory, so that everything stored survives; return once its /health answers
        and the API server is ready again."""
        assert self.state is not None, "not started"
        _terminate(self.state.etcd_pid, signal.SIGKILL if kill else signal.SIGTERM)
        self._start_etcd()
        assert self.state is not None
        if _alive(self.state.apiserver_pid):
            self._wait_ready(None)

    def _start_etcd(self) -> None:
        assert self.state is not None and self.binaries is not None
        state = self.state
        client_url, peer_url = f"http://127.0.0.1:{state.etcd_port}", f"http://127.0.0.1:{state.etcd_peer_port}"
        etcd = self._spawn(
            "etcd",
            [
                str(self.binaries / "etcd"),
                "--data-dir",
                str(self.directory / "etcd-data"),
                "--listen-client-urls",
                client_url,
                "--advertise-client-urls",
                client_url,
                "--listen-peer-urls",
                peer_url,
                "--initial-advertise-peer-urls",
                peer_url,
                "--initial-cluster",
                f"default={peer_url}",
                "--unsafe-no-fsync",
                "--log-level",
                "warn",
            ],
        )
        state.etcd_pid = etcd.pid
        self._save_state()
        self._wait_http(f"{client_url}/health", "etcd", etcd, ctx=None, token=None)

    def _start_apiserver(self) -> None:
        assert self.state is not None and self.binaries is not None
        state, pki = self.state, self._pki
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(self.binaries / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{state.etcd_port}",
                "--bind-address=127.0.0.1",
                f"--secure-port={state.apiserver_port}",
                f"--tls-cert-file={pki['cert']}",
                f"--tls-private-key-file={pki['key']}",
                f"--cert-dir={self.directory / 'apiserver-certs'}",
                f"--token-auth-file={self.directory / 'pki' / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                f"--service-account-issuer=https://127.0.0.1:{state.apiserver_port}",
                f"--service-account-key-file={pki['sa_pub']}",
                f"--service-account-signing-key-file={pki['sa_key']}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--disable-admission-plugins=ServiceAccount",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=0",
                *self._audit_flags(),
                *self.apiserver_flags,
            ],
        )
        state.apiserver_pid = apiserver.pid
        self._save_state()
        self._wait_ready(apiserver)

    def _wait_ready(self, apiserver: subprocess.Popen[bytes] | None) -> None:
        """Wait until kube-apiserver answers /readyz and serves namespace `default`."""
        assert self.state is not None
        ctx = ssl.create_default_context(cafile=str(self.state.ca_path))
        server, token = self.state.server, self.state.admin_token
        self._wait_http(f"{server}/readyz", "kube-apiserver", apiserver, ctx=ctx, token=token)
        self._wait_http(f"{server}/api/v1/namespaces/default", "namespace default", apiserver, ctx=ctx, token=token)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with (self.directory / f"{name}.log").open("ab") as log:
            return subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=self._preexec,
            )

    def _wait_http(
        self,
        url: str,
        what: str,
        process: subprocess.Popen[bytes] | None,
        *,
        ctx: ssl.SSLContext | None,
        token: str | None,
    ) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        last = "no answer"
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                self.stop()
                raise ControlPlaneError(
                    f"{what} exited with code {process.returncode}; see {self.directory}/*.log:\n{self._log_tail()}"
                )
            request = urllib.request.Request(url)
            if token:
                request.add_header("Authorization", f"Bearer {token}")
            try:
                with urllib.request.urlopen(request, timeout=5, context=ctx) as response:
                    if response.status == 200:
                        return
            except urllib.error.HTTPError as error:
                last = f"HTTP {error.code}"
            except OSError as error:
                last = str(error)
            time.sleep(0.2)
        self.stop()
        raise ControlPlaneError(f"{what} not ready after {READY_TIMEOUT:.0f} s ({last}):\n{self._log_tail()}")

    def _log_tail(self) -> str:
        tails = []
        for log in sorted(self.directory.glob("*.log")):
            tails.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(tails)

    def _save_state(self) -> None:
        assert self.state is not None
        path = self.directory / self.STATE_FILE
        path.write_text(json.dumps(asdict(self.state)))
        path.chmod(0o600)

    def _write_kubeconfig(self) -> None:
        assert self.state is not None
        users = {"admin": self.state.admin_token, "controller": self.state.controller_token}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {
                        "server": self.state.server,
                        "certificate-authority": str(self.state.ca_path),
                    },
                }
            ],
            "users": [{"name": name, "user": {"token": token}} for name, token in users.items()],
            "contexts": [{"name": name, "context": {"cluster": "local", "user": name}} for name in users],
            "current-context": "admin",
        }
        self.kubeconfig_path.write_text(json.dumps(config, indent=2))
        self.kubeconfig_path.chmod(0o600)

    @classmethod
    def attach(cls, directory: Path) -> LocalControlPlane:
        """The instance recorded in `directory` by an earlier `start(detach=True)`."""
        plane = cls(directory)
        state_file = plane.directory / cls.STATE_FILE
        if state_file.is_file():
            plane.state = ControlPlaneState(**json.loads(state_file.read_text()))
        return plane

    @property
    def running(self) -> bool:
        """Whether both recorded processes (etcd and kube-apiserver) still exist."""
        return self.state is not None and all(_alive(p) for p in (self.state.etcd_pid, self.state.apiserver_pid))

    def stop(self, *, remove: bool = True) -> None:
        """Stop both processes (SIGTERM, then SIGKILL after 10 s) and remove the state directory."""
        if self.state is not None:
            for pid in (self.state.apiserver_pid, self.state.etcd_pid):
                _terminate(pid)
        if remove:
            shutil.rmtree(self.directory, ignore_errors=True)
        self.state = None


def _terminate(pid: int, first: signal.Signals = signal.SIGTERM) -> None:
    if pid <= 0:
        return
    try:
        os.killpg(pid, first)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            finished, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child: poll for its existence instead
            finished = 0 if _alive(pid) else pid
        if finished == pid:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
