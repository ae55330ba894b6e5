"""An address already in use (two controllers on one machine with the default ports) stops `ipam-provider run` at
once with exit code 1 and one line saying which flag and address, no traceback; and before the API server is
contacted: the kubeconfig given here names a server nothing listens on."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another process listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


UNREACHABLE = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def run_provider(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """`ipam-provider run` without the webhook (its default port may be taken on this machine), plus `flags`."""
    kubeconfig = tmp_path / "unreachable.kubeconfig"
    kubeconfig.write_text(UNREACHABLE)
    command = [sys.executable, "-m", "ipam_provider", "run", f"--kubeconfig={kubeconfig}", "--webhook-port=0"]
    return subprocess.run(
        [*command, *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--metrics-bind-address=127.0.0.1:{port}", "--health-probe-bind-address=0"], "--metrics-bind-address"),
        (["--metrics-bind-address=0", "--health-probe-bind-address=127.0.0.1:{port}"], "--health-probe-bind-address"),
        (["--metrics-bind-address=0", "--health-addr=127.0.0.1:{port}"], "--health-probe-bind-address"),
        (
            ["--insecure-diagnostics=true", "--diagnostics-address=127.0.0.1:{port}", "--health-addr=0"],
            "--diagnostics-address",
        ),
        (["--diagnostics-address=127.0.0.1:{port}", "--health-addr=0"], "--diagnostics-address"),  # HTTPS
        (
            ["--metrics-bind-address=0", "--health-addr=0", "--webhook-host=127.0.0.1", "--webhook-port={port}"],
            "--webhook-port",
        ),
    ],
)
def test_an_address_in_use_is_one_line_and_exit_1(tmp_path: Path, busy_port: int, flags: list[str], named: str) -> None:
    done = run_provider(tmp_path, *(flag.format(port=busy_port) for flag in flags))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert f"cannot listen on 127.0.0.1:{busy_port} ({named}): Address already in use" in lines[0]


def test_an_unusable_certificate_is_one_line_and_exit_1(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("not a certificate\n")
    (tmp_path / "tls.key").write_text("not a key\n")
    done = run_provider(tmp_path, f"--metrics-cert-path={tmp_path}", "--diagnostics-address=127.0.0.1:0")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"cannot use {tmp_path}/tls.crt with {tmp_path}/tls.key" in line


def test_metrics_and_probes_on_one_port(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    done = run_provider(tmp_path, f"--metrics-bind-address=127.0.0.1:{port}", f"--health-addr=127.0.0.1:{port}")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"cannot listen on 127.0.0.1:{port} (--health-probe-bind-address): Address already in use" in line


def test_flags_not_acted_on_are_logged_once_at_start_up(tmp_path: Path, busy_port: int) -> None:
    done = run_provider(
        tmp_path,
        "--log-format=json",
        "--profiler-address=localhost:6060",
        "--diagnostics-address=:8443",
        "--insecure-diagnostics=false",
        "--inclusterippool-concurrency=4",
        f"--metrics-bind-address=127.0.0.1:{busy_port}",
        "--health-addr=0",
    )
    assert done.returncode == 1
    warnings = [line for line in done.stderr.splitlines() if '"warning"' in line]
    assert len(warnings) == 1, done.stderr
    assert '"flags accepted but not acted on"' in warnings[0]
    for flag in ("--profiler-address=localhost:6060", "--diagnostics-address=:8443", "--insecure-diagnostics=false"):
        assert flag in warnings[0]
    assert "--inclusterippool-concurrency=4" in warnings[0]
