"""The real promtool and Prometheus server of the pinned release (PROMETHEUS_VERSION in hack/versions.env).

- `prometheus_binaries()` builds them once from the Go module (hack/prometheus/build.sh, cached by version outside
  the work tree) and returns their paths; `PrometheusUnavailable` says why when that cannot be done.
- `PrometheusServer` runs the server on a loopback port with a given configuration and storage directory, and
  answers PromQL through its HTTP API (`query`, `query_range`). Its web UI is not built; the API is complete.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from tools.controlplane.versions import REPO_ROOT

BUILD_SCRIPT = REPO_ROOT / "hack" / "prometheus" / "build.sh"


class PrometheusUnavailable(RuntimeError):
    """promtool or prometheus could not be built, or the server did not start; the message says why."""


@dataclass(frozen=True)
class PrometheusBinaries:
    promtool: Path
    prometheus: Path


def prometheus_binaries() -> PrometheusBinaries:
    """Build (or find in the cache) promtool and prometheus; return their paths."""
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise PrometheusUnavailable(
            "could not build promtool and prometheus (needs Go and the Go module proxy, or PROMETHEUS_BIN_DIR):\n"
            + result.stderr[-4000:]
        )
    directory = Path(result.stdout.strip().splitlines()[-1])
    return PrometheusBinaries(promtool=directory / "promtool", prometheus=directory / "prometheus")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def api_get(base_url: str, path: str, params: dict[str, str], timeout: float = 30.0) -> Any:
    """GET an HTTP API path of Prometheus and return its `data`; raise with Prometheus's error text if it fails."""
    url = f"{base_url.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = json.load(response)
    except urllib.error.HTTPError as error:
        text = error.read().decode(errors="replace")
        with contextlib.suppress(ValueError, AttributeError):
            text = json.loads(text).get("error", text)
        raise RuntimeError(f"{path} {params}: HTTP {error.code}: {text}") from None
    if body.get("status") != "success":
        raise RuntimeError(f"{path} {params}: {body.get('error', body)}")
    return body["data"]


class PrometheusServer:
    """A Prometheus server on 127.0.0.1 with `config` and storage in `storage`, logging to `log_path`.

    Use as a context manager; the server is stopped (SIGTERM, then SIGKILL) on the way out."""

    def __init__(self, binary: Path, config: Path, storage: Path, log_path: Path, *extra_args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._argv = [
            str(binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={storage}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            *extra_args,
        ]
        self._log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> None:
        with self._log_path.open("ab") as log:
            self._process = subprocess.Popen(self._argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise PrometheusUnavailable(f"prometheus exited ({self._process.returncode}):\n{self.log_tail()}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as response:
                if response.status == 200:
                    return
            time.sleep(0.5)
        raise PrometheusUnavailable(f"prometheus not ready after {timeout} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        self._process.terminate()
        try:
            self._process.wait(30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        result: list[dict[str, Any]] = api_get(self.url, "/api/v1/query", params)["result"]
        return result

    def __enter__(self) -> PrometheusServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
