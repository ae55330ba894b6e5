"""Every flag of the Go in-cluster provider v1.1.0's `--help` goes through `ipam-provider run`'s parser and is acted
on, so that a Deployment moved over from Go with its arguments starts.

The flags come from `go_incluster_v1.1.0_help.txt`, the Go binary's `--help` output checked in verbatim (its header
says how it was made). A pin, not the binary: `make test` does not build the Go provider (only the benchmarks do, a
cold build of several minutes), and v1.1.0 is a published release, so its `--help` cannot change.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ipam_provider.flags import parse_args

HELP = Path(__file__).with_name("go_incluster_v1.1.0_help.txt")
# A value our parser takes, for the Go flags whose --help names no default.
SAMPLES = {
    "--kubeconfig": "/etc/kubeconfig",
    "--namespace": "capi-system",
    "--tls-min-version": "VersionTLS12",  # its default is on the next line of --help
    "--tls-cipher-suites": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "--watch-filter": "team-a",
    "--webhook-cert-dir": "/tmp/k8s-webhook-server/serving-certs",
    "--webhook-cert-name": "tls.crt",
    "--webhook-key-name": "tls.key",
}


def go_flags() -> dict[str, str | None]:
    """Each flag of the pinned --help with a value to give it (None: a boolean)."""
    flags: dict[str, str | None] = {}
    for match in re.finditer(r"^ {6}(--[\w-]+)(?: (\w+))?(.*)$", HELP.read_text(), re.MULTILINE):
        flag, kind, rest = match.groups()
        default = re.search(r'\(default "?([^")]*)"?\)$', rest)
        flags[flag] = None if kind is None else (default.group(1) if default else SAMPLES[flag])
    return flags


def test_the_pin_holds_the_go_flags() -> None:
    assert len(go_flags()) == 13 and {"--webhook-cert-name", "--webhook-key-name"} <= go_flags().keys()


@pytest.mark.parametrize("flag", list(go_flags()))
def test_every_go_flag_is_accepted_in_both_forms_and_acted_on(flag: str) -> None:
    value = go_flags()[flag]
    forms = [[flag], [f"{flag}=true"], [f"{flag}=false"]] if value is None else [[flag, value], [f"{flag}={value}"]]
    for form in forms:
        options = parse_args(["run", *form]).options
        assert not [named for named in options.not_acted_on if named.startswith(flag)], form


def test_a_go_deployments_whole_command_line_starts() -> None:
    argv = [f"{flag}={value}" if value is not None else flag for flag, value in go_flags().items()]
    options = parse_args(["run", *argv]).options
    assert options.not_acted_on == ()
    assert options.leader_election.enabled and options.controller.watch_filter == "team-a"
    assert str(options.webhook.cert.cert) == "/tmp/k8s-webhook-server/serving-certs/tls.crt"
