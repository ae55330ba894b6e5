"""The flags of the metrics and probe endpoints, under controller-runtime's, Cluster API's and kubebuilder's names.

The metrics are served as Cluster API's managers serve them: by default over HTTPS on `--diagnostics-address`
(`:8443`) with authentication and authorisation; `--insecure-diagnostics` makes that plain HTTP; the older
`--metrics-bind-address` serves plain HTTP on its address and wins over both (`0` turns the metrics off).
`--tls-min-version` and `--tls-cipher-suites` apply to the HTTPS endpoints: the metrics and the admission webhook
(`--webhook-port`, default 9443, 0 turns it off; certificate in `--webhook-cert-dir`), see tlsoptions.py.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ipam_provider.runtime.flagforms import bind_address, go_bool
from ipam_provider.runtime.serving.certificates import CertificateFiles
from ipam_provider.runtime.serving.tlsoptions import (
    DEFAULT_MIN_VERSION,
    INSECURE_SUITES,
    LEGACY_NAMES,
    SECURE_SUITES,
    TlsOptions,
    tls_options,
)

DEFAULT_PROBES_ADDRESS = ":8081"
DEFAULT_DIAGNOSTICS_ADDRESS = ":8443"  # Cluster API's util/flags default
DEFAULT_CERT_NAME = "tls.crt"
DEFAULT_CERT_KEY = "tls.key"
DEFAULT_WEBHOOK_PORT = 9443  # controller-runtime's
DEFAULT_WEBHOOK_CERT_DIR = "/tmp/k8s-webhook-server/serving-certs"  # controller-runtime's


@dataclass(frozen=True)
class MetricsServing:
    """Where and how the metrics are served: `address` ("0": not at all), the flag it came from (for error
    messages), over HTTPS with authentication (`secure`) and with which certificate files."""

    address: str
    flag: str
    secure: bool
    cert: CertificateFiles
    tls: TlsOptions  # for HTTPS only


@dataclass(frozen=True)
class WebhookServing:
    """Where the admission webhook listens (`port` 0: it is off) and with which certificate."""

    host: str
    port: int
    cert: CertificateFiles

    @property
    def bind(self) -> tuple[str, int] | None:
        return (self.host or "0.0.0.0", self.port) if self.port else None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def add_webhook_flags(run: argparse.ArgumentParser) -> None:
    webhook = run.add_argument_group("admission webhook")
    webhook.add_argument(
        "--webhook-port",
        type=_port,
        default=DEFAULT_WEBHOOK_PORT,
        metavar="PORT",
        help="the validating admission webhook's HTTPS port (default: %(default)s); 0 turns it off",
    )
    webhook.add_argument(
        "--webhook-host", default="", metavar="HOST", help="the webhook's address (default: every interface)"
    )
    webhook.add_argument(
        "--webhook-cert-dir",
        default=DEFAULT_WEBHOOK_CERT_DIR,
        metavar="DIRECTORY",
        help="the directory holding the webhook's tls.crt and tls.key (default: %(default)s), re-read when they "
        "change; while both are absent a self-signed certificate is served, which the API server does not trust",
    )


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0 to 65535)")
    return int(text)


def webhook_serving(args: argparse.Namespace) -> WebhookServing:
    return WebhookServing(args.webhook_host, args.webhook_port, CertificateFiles(args.webhook_cert_dir))


def add_serving_flags(run: argparse.ArgumentParser) -> None:
    serving = run.add_argument_group("metrics and probes")
    serving.add_argument(
        "--diagnostics-address",
        type=bind_address,
        metavar="ADDRESS",
        help=f"where the metrics are served, at /metrics (default: {DEFAULT_DIAGNOSTICS_ADDRESS}): over HTTPS, "
        "each request authenticated (TokenReview) and authorised (SubjectAccessReview: get on /metrics) by the "
        'API server, unless --insecure-diagnostics; "0" disables them',
    )
    serving.add_argument(
        "--insecure-diagnostics",
        nargs="?",
        const=True,
        type=go_bool,
        metavar="BOOL",
        help="true: serve the metrics at --diagnostics-address over plain HTTP, without authentication "
        "(default: false)",
    )
    serving.add_argument(
        "--metrics-bind-address",
        "--metrics-bind-addr",
        dest="metrics_bind_address",
        type=bind_address,
        metavar="ADDRESS",
        help='plain-HTTP metrics on this address instead, without authentication; "0" disables them (wins over '
        "the diagnostics flags)",
    )
    _add_certificate_flags(serving)
    _add_tls_flags(serving)
    serving.add_argument(
        "--health-probe-bind-address",
        "--health-addr",
        dest="health_probe_bind_address",
        type=bind_address,
        metavar="ADDRESS",
        default=DEFAULT_PROBES_ADDRESS,
        help='/healthz and /readyz (default: %(default)s); "0" disables them',
    )


def _add_certificate_flags(serving: argparse._ArgumentGroup) -> None:
    """The HTTPS metrics endpoint's certificate: where it is, and its files' names."""
    serving.add_argument(
        "--metrics-cert-path",
        metavar="DIRECTORY",
        help="the directory holding the HTTPS certificate and key (e.g. a mounted cert-manager Secret), re-read "
        "when they change; without it, or while both files are absent, a self-signed certificate generated at "
        "start is served",
    )
    serving.add_argument(
        "--metrics-cert-name", metavar="FILE", help=f"the certificate's file name (default: {DEFAULT_CERT_NAME})"
    )
    serving.add_argument(
        "--metrics-cert-key", metavar="FILE", help=f"the key's file name (default: {DEFAULT_CERT_KEY})"
    )


def _add_tls_flags(serving: argparse._ArgumentGroup) -> None:
    tls13 = [name for name, openssl_name in SECURE_SUITES.items() if openssl_name is None]
    secure = [name for name, openssl_name in SECURE_SUITES.items() if openssl_name and name not in LEGACY_NAMES]
    serving.add_argument(
        "--tls-min-version",
        metavar="VERSION",
        help=f"the HTTPS endpoints' (metrics, webhook) minimum TLS version: VersionTLS12 or VersionTLS13 (default: "
        f"{DEFAULT_MIN_VERSION}; VersionTLS10 and VersionTLS11 are refused)",
    )
    serving.add_argument(
        "--tls-cipher-suites",
        metavar="NAME,...",
        help="the HTTPS endpoints' (metrics, webhook) TLS 1.2 cipher suites, by Go's crypto/tls names (default: "
        f"Python's list). Preferred: {', '.join(secure)}. Insecure: {', '.join(INSECURE_SUITES)}. "
        f"{', '.join(tls13)} are accepted but, as in Go, not configurable: with TLS 1.3 all three are always on",
    )


def metrics_serving(args: argparse.Namespace, ignored: list[str], webhook: bool = False) -> MetricsServing:
    """Resolve the metrics flags; the ones that change nothing are appended to `ignored`, with the reason. With
    `webhook` (the HTTPS webhook is on) the TLS flags act whatever the metrics endpoint does."""
    cert_flags = [
        f"{flag}={value}"
        for flag, value in (
            ("--metrics-cert-path", args.metrics_cert_path),
            ("--metrics-cert-name", args.metrics_cert_name),
            ("--metrics-cert-key", args.metrics_cert_key),
        )
        if value is not None
    ]
    tls_flags = [
        f"{flag}={value}"
        for flag, value in (
            ("--tls-min-version", args.tls_min_version),
            ("--tls-cipher-suites", args.tls_cipher_suites),
        )
        if value is not None
    ]
    unused_suites: list[str] = []  # named only when an endpoint is HTTPS; plain HTTP names the flags themselves
    tls = tls_options(args.tls_min_version, args.tls_cipher_suites, unused_suites)  # checked in every mode, as CAPI
    if webhook:
        ignored += unused_suites
        unused_suites, tls_flags = [], []
    cert = CertificateFiles(
        args.metrics_cert_path, args.metrics_cert_name or DEFAULT_CERT_NAME, args.metrics_cert_key or DEFAULT_CERT_KEY
    )
    if args.metrics_bind_address is not None:
        diagnostics = [f"--diagnostics-address={args.diagnostics_address}"] if args.diagnostics_address else []
        if args.insecure_diagnostics is not None:
            diagnostics.append(f"--insecure-diagnostics={'true' if args.insecure_diagnostics else 'false'}")
        ignored += [f"{flag} (--metrics-bind-address wins)" for flag in diagnostics + cert_flags + tls_flags]
        return MetricsServing(args.metrics_bind_address, "--metrics-bind-address", False, cert, tls)
    address = args.diagnostics_address or DEFAULT_DIAGNOSTICS_ADDRESS
    if args.insecure_diagnostics:
        ignored += [f"{flag} (--insecure-diagnostics: plain HTTP)" for flag in cert_flags + tls_flags]
        return MetricsServing(address, "--diagnostics-address", False, cert, tls)
    ignored += unused_suites
    return MetricsServing(address, "--diagnostics-address", True, cert, tls)
