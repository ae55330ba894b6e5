"""The flags a Cluster API manager is given (by cluster-api-operator, or CAPI's util/flags), in their Go forms."""

from __future__ import annotations

import argparse
import ssl
from typing import cast

import pytest

from ipam_provider.cli import leader_elector
from ipam_provider.flags import CLAIM_KIND, RunOptions, parse_args
from ipam_provider.runtime.flagforms import WebhookServing, go_bool, go_duration, take_kind_concurrency
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.serving.certificates import CertificateFiles, TlsOptions

# The command line cluster-api-operator writes for a provider whose manager spec sets leader election, the
# diagnostics endpoint, the health address, verbosity, the sync period, and groupKindConcurrency for claims.
OPERATOR_ARGS = [
    "run",
    "--leader-elect=true",
    "--leader-elect-lease-duration=15s",
    "--leader-elect-renew-deadline=10s",
    "--leader-elect-retry-period=2s",
    "--diagnostics-address=:8443",
    "--insecure-diagnostics=false",
    "--health-addr=:9440",
    "--v=2",
    "--sync-period=10m",
    "--leader-election-id=capi-ipam-system/capi-ipam-provider-py",
    "--ipaddressclaim-concurrency=10",
]


def options(*argv: str) -> RunOptions:
    parsed: RunOptions = parse_args(["run", *argv]).options
    return parsed


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """argparse's exit 2 for a bad command line; returns its message."""
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_the_operators_command_line() -> None:
    got: RunOptions = parse_args(OPERATOR_ARGS).options
    election = got.leader_election
    assert election.enabled
    assert (election.namespace, election.name) == ("capi-ipam-system", "capi-ipam-provider-py")
    assert (election.lease_duration, election.renew_deadline, election.retry_period) == (15.0, 10.0, 2.0)
    assert got.probes_address == ":9440" and got.probes_bind == ("0.0.0.0", 9440)
    # The diagnostics endpoint: HTTPS with authentication, on :8443.
    assert (got.metrics.address, got.metrics.flag, got.metrics.secure) == (":8443", "--diagnostics-address", True)
    assert got.controller.workers == 10
    assert (got.log_level, got.log_format) == ("info", "console")
    assert got.not_acted_on == ()
    assert got.controller.sync_period == 600.0
    # The leader elector is built with those durations: they act, not just parse.
    elector = leader_elector(cast(KubeClient, object()), election)
    assert (elector.namespace, elector.name) == ("capi-ipam-system", "capi-ipam-provider-py")
    assert (elector.lease_seconds, elector.renew_deadline_seconds, elector.retry_seconds) == (15.0, 10.0, 2.0)


def test_no_flags_serve_cluster_apis_defaults() -> None:
    got = options()
    assert (got.metrics.address, got.probes_address) == (":8443", ":8081")
    assert got.metrics.secure and got.metrics.cert == CertificateFiles(None, "tls.crt", "tls.key")
    assert (
        got.controller.workers == 8
        and got.controller.namespaces == []
        and got.controller.watch_filter is None
        and got.backends is None
    )
    assert not got.leader_election.enabled
    assert (got.leader_election.namespace, got.leader_election.name) == ("capi-ipam-system", "capi-ipam-provider-py")
    assert (got.log_format, got.log_level) == ("console", "info")
    assert got.webhook == WebhookServing("", 9443, CertificateFiles("/tmp/k8s-webhook-server/serving-certs"))
    assert got.webhook.bind == ("0.0.0.0", 9443)
    assert got.not_acted_on == ()


def test_webhook_flags(capsys: pytest.CaptureFixture[str]) -> None:
    got = options("--webhook-port=10443", "--webhook-host=127.0.0.1", "--webhook-cert-dir=/certs")
    assert got.webhook.bind == ("127.0.0.1", 10443) and got.webhook.address == "127.0.0.1:10443"
    assert str(got.webhook.cert.cert) == "/certs/tls.crt" and str(got.webhook.cert.key) == "/certs/tls.key"
    assert got.not_acted_on == ()
    assert options("--webhook-port=0").webhook.bind is None
    assert "is not a port" in usage_error(["run", "--webhook-port=http"], capsys)
    assert "is not a port" in usage_error(["run", "--webhook-port=70000"], capsys)


def test_the_existing_flags_in_both_forms() -> None:
    got = options(
        "--kubeconfig",
        "/k",
        "--namespace=a,b",
        "--namespace",
        "c",
        "--watch-filter=x",
        "--workers",
        "3",
        "--backends=incluster,netbox",
        "--leader-elect",
        "--leader-election-namespace=ns",
        "--leader-election-id=lock",
        "--metrics-bind-address=0",
        "--health-probe-bind-address",
        "[::1]:9",
        "--log-format=json",
        "--log-level=warning",
    )
    assert (
        got.kubeconfig == "/k" and got.controller.namespaces == ["a", "b", "c"] and got.controller.watch_filter == "x"
    )
    assert got.controller.workers == 3 and got.backends == ["incluster", "netbox"]
    assert got.leader_election.enabled and (got.leader_election.namespace, got.leader_election.name) == ("ns", "lock")
    assert got.metrics_bind is None and got.probes_bind == ("::1", 9)
    assert (got.log_format, got.log_level) == ("json", "warning")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], False),
        (["--leader-elect"], True),
        (["--leader-elect=true"], True),
        (["--leader-elect=false"], False),
        (["--leader-elect=1"], True),
        (["--leader-elect=F"], False),
        (["--leader-elect=TRUE"], True),
    ],
)
def test_go_booleans(argv: list[str], expected: bool) -> None:
    assert options(*argv).leader_election.enabled is expected


def test_a_bad_boolean_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert "'yes' is not a boolean" in usage_error(["run", "--leader-elect=yes"], capsys)
    with pytest.raises(argparse.ArgumentTypeError):
        go_bool("")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("15s", 15.0),
        ("1m", 60.0),
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("10m", 600.0),
        ("1h", 3600.0),
        ("1.5h", 5400.0),
        ("2h45m", 9900.0),
        ("1h0m0s", 3600.0),
        ("250us", 0.00025),
        ("0", 0.0),
        ("+3s", 3.0),
        ("-3s", -3.0),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "15", "1m30", "s", ".s", "1x", "1 s", "1s ", "m1", "1.5.5s", "1d"])
def test_not_go_durations(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="is not a duration"):
        go_duration(text)


def test_leader_election_durations_act_and_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    election = options(
        "--leader-elect",
        "--leader-elect-lease-duration=1m",
        "--leader-elect-renew-deadline=40s",
        "--leader-elect-retry-period=500ms",
    ).leader_election
    assert (election.lease_duration, election.renew_deadline, election.retry_period) == (60.0, 40.0, 0.5)
    assert "must be shorter than --leader-elect-lease-duration" in usage_error(
        ["run", "--leader-elect", "--leader-elect-lease-duration=10s"], capsys
    )
    assert "must be longer than 1.2 x --leader-elect-retry-period" in usage_error(
        ["run", "--leader-elect", "--leader-elect-retry-period=9s"], capsys
    )
    assert "greater than zero" in usage_error(["run", "--leader-elect-retry-period=0s"], capsys)
    assert "is not a duration" in usage_error(["run", "--leader-elect-lease-duration=15"], capsys)
    # Without --leader-elect the durations are not used, so they are not cross-checked (as controller-runtime).
    assert not options("--leader-elect=false", "--leader-elect-lease-duration=5s").leader_election.enabled


def test_leader_election_id_with_a_namespace(capsys: pytest.CaptureFixture[str]) -> None:
    election = options("--leader-election-namespace=ignored", "--leader-election-id=other/lock").leader_election
    assert (election.namespace, election.name) == ("other", "lock")
    assert options("--leader-election-namespace=mine", "--leader-election-id=lock").leader_election.namespace == "mine"
    for bad in ("/lock", "ns/", "a/b/c"):
        assert "expected NAME or NAMESPACE/NAME" in usage_error(["run", f"--leader-election-id={bad}"], capsys)


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        (["--v=0"], "info"),
        (["--v=2"], "info"),
        (["--v=3"], "info"),
        (["--v=4"], "debug"),
        (["--v", "10"], "debug"),
        (["--v=5", "--log-level=error"], "error"),
        (["--log-level=warning", "--v=0"], "warning"),
    ],
)
def test_verbosity_maps_to_the_log_level(argv: list[str], level: str) -> None:
    assert options(*argv).log_level == level


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        ([], "warning"),
        (["--v=4"], "warning"),
        (["--v=5"], "info"),
        (["--v=6"], "debug"),
        (["--v=8", "--log-level=info"], "warning"),
    ],
)
def test_the_libraries_log_more_only_at_a_high_verbosity(argv: list[str], level: str) -> None:
    assert options(*argv).library_log_level == level


def test_logging_format_is_an_alias_that_log_format_overrides() -> None:
    assert options("--logging-format=json").log_format == "json"
    assert options("--logging-format=text").log_format == "console"
    got = options("--logging-format=json", "--log-format=console")
    assert got.log_format == "console" and got.not_acted_on == ("--logging-format=json (--log-format wins)",)


def test_concurrency_flags() -> None:
    assert options("--ipaddressclaim-concurrency=10").controller.workers == 10
    assert options("--ipaddressclaim-concurrency", "4").controller.workers == 4
    # cluster-api-operator lower-cases groupKindConcurrency's keys, which may carry the group.
    assert options("--ipaddressclaim.ipam.cluster.x-k8s.io-concurrency=6").controller.workers == 6
    assert options("--max-concurrent-reconciles=5").controller.workers == 5
    got = options("--max-concurrent-reconciles=5", "--ipaddressclaim-concurrency=7")
    assert got.controller.workers == 7 and got.not_acted_on == (
        "--max-concurrent-reconciles=5 (--ipaddressclaim-concurrency wins)",
    )
    got = options("--workers=2", "--ipaddressclaim-concurrency=7")
    assert got.controller.workers == 2 and got.not_acted_on == ("--ipaddressclaim-concurrency=7 (--workers wins)",)
    # Other kinds share the workers: accepted, not acted on.
    got = options("--inclusterippool-concurrency=3", "--GlobalInClusterIPPool.ipam.cluster.x-k8s.io-concurrency", "2")
    assert got.controller.workers == 8
    assert got.not_acted_on == ("--globalinclusterippool-concurrency=2", "--inclusterippool-concurrency=3")


def test_bad_concurrency_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert "expected a whole number" in usage_error(["run", "--cluster-concurrency=many"], capsys)
    assert "expected a whole number" in usage_error(["run", "--cluster-concurrency"], capsys)
    assert "invalid int value" in usage_error(["run", "--ipaddressclaim-concurrency=x"], capsys)
    assert "at least 1" in usage_error(["run", "--ipaddressclaim-concurrency=0"], capsys)
    assert "at least 1" in usage_error(["run", "--workers=0"], capsys)


def test_concurrency_flags_are_only_taken_from_run() -> None:
    assert take_kind_concurrency(["status", "--x-concurrency=1"], CLAIM_KIND) == (["status", "--x-concurrency=1"], {})
    assert take_kind_concurrency(["run", "--", "--x-concurrency=1"], CLAIM_KIND) == (
        ["run", "--", "--x-concurrency=1"],
        {},
    )


def test_diagnostics_address_serves_the_metrics_securely_unless_insecure() -> None:
    got = options("--diagnostics-address=127.0.0.1:9443")
    assert got.metrics_bind == ("127.0.0.1", 9443) and got.metrics.flag == "--diagnostics-address"
    assert got.metrics.secure and got.not_acted_on == ()
    got = options("--insecure-diagnostics=true", "--diagnostics-address=127.0.0.1:9443")
    assert got.metrics_bind == ("127.0.0.1", 9443) and not got.metrics.secure and got.not_acted_on == ()
    got = options("--insecure-diagnostics")  # util/flags' default diagnostics address
    assert got.metrics.address == ":8443" and not got.metrics.secure
    assert options("--insecure-diagnostics=false").metrics.secure
    assert options("--diagnostics-address=0").metrics_bind is None


def test_metrics_bind_address_wins_with_plain_http() -> None:
    got = options("--insecure-diagnostics", "--diagnostics-address=:9443", "--metrics-bind-address=:9090")
    assert (got.metrics.address, got.metrics.flag, got.metrics.secure) == (":9090", "--metrics-bind-address", False)
    assert got.not_acted_on == (
        "--diagnostics-address=:9443 (--metrics-bind-address wins)",
        "--insecure-diagnostics=true (--metrics-bind-address wins)",
    )
    got = options("--diagnostics-address=:9443", "--metrics-cert-path=/certs", "--metrics-bind-address=:9090")
    assert got.metrics.address == ":9090" and not got.metrics.secure
    assert got.not_acted_on == (
        "--diagnostics-address=:9443 (--metrics-bind-address wins)",
        "--metrics-cert-path=/certs (--metrics-bind-address wins)",
    )
    got = options("--metrics-bind-address=0", "--diagnostics-address=:9443")
    assert got.metrics_bind is None, "an explicit 0 turns the metrics off, the diagnostics address too"


def test_certificate_flags() -> None:
    got = options("--metrics-cert-path=/tmp/k8s-metrics-server/metrics-certs")
    assert got.metrics.cert == CertificateFiles("/tmp/k8s-metrics-server/metrics-certs", "tls.crt", "tls.key")
    assert str(got.metrics.cert.cert) == "/tmp/k8s-metrics-server/metrics-certs/tls.crt"
    got = options("--metrics-cert-path=/c", "--metrics-cert-name=server.pem", "--metrics-cert-key=server-key.pem")
    assert (str(got.metrics.cert.cert), str(got.metrics.cert.key)) == ("/c/server.pem", "/c/server-key.pem")
    assert got.not_acted_on == ()
    got = options("--insecure-diagnostics", "--metrics-cert-path=/c")
    assert got.not_acted_on == ("--metrics-cert-path=/c (--insecure-diagnostics: plain HTTP)",)


def test_tls_flags_set_the_https_endpoints_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert options().metrics.tls == TlsOptions(ssl.TLSVersion.TLSv1_2)
    got = options("--tls-min-version=VersionTLS13")
    assert got.metrics.tls == TlsOptions(ssl.TLSVersion.TLSv1_3) and got.not_acted_on == ()
    got = options(
        "--tls-min-version=VersionTLS12",
        "--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    )
    assert got.metrics.tls.ciphers == "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-CHACHA20-POLY1305"
    assert got.not_acted_on == ()
    assert "--tls-min-version: VersionTLS10 is not served" in usage_error(
        ["run", "--tls-min-version=VersionTLS10"], capsys
    )
    assert "unknown cipher suite TLS_NOPE" in usage_error(["run", "--tls-cipher-suites=TLS_NOPE"], capsys)
    # Plain HTTP metrics and no webhook: the flags are still checked, and named as not acted on.
    assert "unknown TLS version" in usage_error(["run", "--insecure-diagnostics", "--tls-min-version=1.3"], capsys)
    got = options(
        "--insecure-diagnostics",
        "--webhook-port=0",
        "--tls-min-version=VersionTLS13",
        "--tls-cipher-suites=TLS_AES_128_GCM_SHA256",
    )
    assert got.not_acted_on == (
        "--tls-min-version=VersionTLS13 (--insecure-diagnostics: plain HTTP)",
        "--tls-cipher-suites=TLS_AES_128_GCM_SHA256 (--insecure-diagnostics: plain HTTP)",
    )
    got = options(
        "--metrics-bind-address=:8080", "--webhook-port=0", "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"
    )
    assert got.not_acted_on == (
        "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 (--metrics-bind-address wins)",
    )
    # The webhook (on by default) is HTTPS: there the flags act, whatever the metrics endpoint does.
    got = options("--metrics-bind-address=:8080", "--tls-min-version=VersionTLS13")
    assert got.metrics.tls == TlsOptions(ssl.TLSVersion.TLSv1_3) and got.not_acted_on == ()


def test_aliases_of_the_bind_addresses(capsys: pytest.CaptureFixture[str]) -> None:
    assert options("--health-addr=:9440").probes_address == ":9440"
    assert options("--metrics-bind-addr=:9090").metrics.address == ":9090"  # cluster-api-operator's name
    assert "put an IPv6 host in brackets" in usage_error(["run", "--health-addr=::1:80"], capsys)
    assert "the port must be a number" in usage_error(["run", "--metrics-bind-address=:http"], capsys)
    assert "write it as :8080" in usage_error(["run", "--diagnostics-address=8443"], capsys)


def test_every_other_manager_flag_is_accepted_and_named() -> None:
    got = options(
        "--profiler-address=localhost:6060",
        "--feature-gates=ClusterTopology=true",
        "--webhook-cert-secret-name=capi-webhook",
        "--webhook-cert-secret-namespace=capi-system",
        "--tls-curve-preferences=29,23",
    )
    assert [entry.split("=")[0] for entry in got.not_acted_on] == [
        "--profiler-address",
        "--feature-gates",
        "--webhook-cert-secret-name",
        "--webhook-cert-secret-namespace",
        "--tls-curve-preferences",
    ]


def test_help_names_the_flags_that_are_not_acted_on(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["run", "--help"])
    text = capsys.readouterr().out
    _, ignored = text.split("Cluster API manager flags that are accepted, not acted on:")
    for flag in ("--profiler-address", "--feature-gates", "--tls-curve-preferences"):
        assert flag in ignored
    assert "--sync-period" not in ignored and "--sync-period" in text
    assert "--webhook-cert-secret-name" in ignored and "--webhook-port" not in ignored
    assert "--tls-min-version" not in ignored and "--tls-cipher-suites" not in ignored
    flat = " ".join(text.split())
    assert "--inclusterippool-concurrency) is accepted, not acted on" in flat
    assert "over HTTPS, each request authenticated (TokenReview)" in flat  # --diagnostics-address
    assert "TLS_CHACHA20_POLY1305_SHA256 are accepted but, as in Go, not configurable" in flat


def test_the_sync_period(capsys: pytest.CaptureFixture[str]) -> None:
    assert options().controller.sync_period == 600.0, "Cluster API managers' 10m"
    assert options("--sync-period=1h30m").controller.sync_period == 5400.0
    assert "greater than zero" in usage_error(["run", "--sync-period=0s"], capsys)
