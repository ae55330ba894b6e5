"""The runtime's flags and the forms Go writes their values in.

pflag reads booleans as Go's strconv.ParseBool does and durations as time.ParseDuration does; controller-runtime
takes bind addresses as ":8080" or "[::]:8080"; cluster-api-operator writes per-kind concurrency as
`--<kind>-concurrency=N`, a flag name argparse cannot declare, so `take_kind_concurrency` takes them out first.

The metrics and probe endpoints' flags go by controller-runtime's, Cluster API's and kubebuilder's names. The metrics
are served as Cluster API's managers serve them: by default over HTTPS on `--diagnostics-address` (`:8443`) with
authentication and authorisation; `--insecure-diagnostics` makes that plain HTTP; the older `--metrics-bind-address`
serves plain HTTP on its address and wins over both (`0` turns the metrics off).

`--tls-min-version` and `--tls-cipher-suites` apply to the HTTPS endpoints: the metrics and the admission webhook
(`--webhook-port`, default 9443, 0 turns it off; certificate in `--webhook-cert-dir`, its files named by
`--webhook-cert-name` and `--webhook-key-name`). In Go's forms: a Cluster API manager reads them with Kubernetes
component-base: versions as `VersionTLS12`, cipher suites as the IANA names Go's crypto/tls gives them
(`TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256`). Here each suite name maps to its OpenSSL name for
`SSLContext.set_ciphers`. The TLS 1.3 suites are accepted, but, as in Go, they cannot be chosen: all three are always
on when TLS 1.3 is negotiated. TLS 1.0 and 1.1 are known names that are refused: OpenSSL 3 negotiates them only at
security level 0, and Python deprecates them.
"""

from __future__ import annotations

import argparse
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

from ipam_provider.runtime.serving.certificates import CERT_NAME, KEY_NAME, CertificateFiles, TlsOptions
from ipam_provider.runtime.serving.guard import CONNECTIONS, DEFAULT_LIMITS, HEADER_SECONDS, IDLE_SECONDS, Limits


class FlagError(ValueError):
    """A flag's value is invalid, or two flags contradict each other."""


# --- Go's value forms ------------------------------------------------------------------------------------------

_GO_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "false", "FALSE", "False"})


def go_bool(text: str) -> bool:
    """A boolean as Go's strconv.ParseBool (and so pflag) reads it."""
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (true or false)")


_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")


def go_duration(text: str) -> float:
    """A duration as Go's time.ParseDuration reads it ("15s", "1m30s", "500ms", "1.5h", "0"), in seconds."""
    sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.removeprefix("+"))
    if body == "0":
        return 0.0
    seconds, position = 0.0, 0
    while position == 0 or position < len(body):
        part = _DURATION_PART.match(body, position)
        if part is None or part.group(1) in ("", "."):
            raise argparse.ArgumentTypeError(f"{text!r} is not a duration (write it as 15s, 1m30s, 500ms or 1h)")
        seconds += float(part.group(1)) * _UNIT_SECONDS[part.group(2)]
        position = part.end()
    return sign * seconds


def positive_duration(text: str) -> float:
    seconds = go_duration(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the duration must be greater than zero")
    return seconds


def host_port(address: str) -> tuple[str, int] | None:
    """controller-runtime's bind-address form: ":8080", "127.0.0.1:8080", "[::]:8080", "[::1]:8080", or "0" to
    disable. IPv6 hosts come back without their brackets."""
    if address in ("", "0"):
        return None
    host, colon, port = address.rpartition(":")
    if not colon:
        raise ValueError(f"bind address {address!r}: write it as :8080, 127.0.0.1:8080 or [::]:8080 (0 turns it off)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"bind address {address!r}: put an IPv6 host in brackets, as in [::]:8080")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"bind address {address!r}: the port must be a number from 0 to 65535")
    return host or "0.0.0.0", int(port)


def bind_address(text: str) -> str:
    try:
        host_port(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def given(args: argparse.Namespace, *flags: str) -> list[str]:
    """`--flag=value` for each of `flags` that was given (its value, under the flag's name as its dest, not None)."""
    values = [(flag, getattr(args, flag[2:].replace("-", "_"))) for flag in flags]
    return [f"{flag}={value}" for flag, value in values if value is not None]


def split_list(values: Sequence[str] | None) -> list[str]:
    """Repeated and comma-separated values as one list: ["a,b", "c"] -> ["a", "b", "c"]."""
    return [part.strip() for value in values or [] for part in value.split(",") if part.strip()]


# --- `--<kind>-concurrency=N` ----------------------------------------------------------------------------------

# cluster-api-operator writes one flag per entry of the manager's groupKindConcurrency, lower-cased: the key is a
# kind ("Kind") or a kind with its group ("Kind.example.com").
_KIND_CONCURRENCY = re.compile(r"--([A-Za-z0-9][A-Za-z0-9.-]*?)-concurrency(?:=(.*))?", re.DOTALL)


def take_kind_concurrency(argv: Sequence[str], own: str) -> tuple[list[str], dict[str, int]]:
    """Take every `--<kind>-concurrency[=]N` out of `run`'s arguments: kind `own` (lower case) becomes
    `--<own>-concurrency=N` (a flag of its own, acted on); other kinds' come back as {kind: N}."""
    rest: list[str] = []
    others: dict[str, int] = {}
    in_run = False
    args = iter(argv)
    for arg in args:
        match = _KIND_CONCURRENCY.fullmatch(arg) if in_run else None
        if match is None:
            rest.append(arg)
            in_run = in_run or arg == "run"
            if arg == "--":
                rest.extend(args)  # the arguments after it, as they are
            continue
        kind, value = match.group(1).lower().split(".")[0], match.group(2)
        if value is None:
            value = next(args, None)
        if kind == own:
            rest.append(f"--{own}-concurrency" if value is None else f"--{own}-concurrency={value}")
            continue
        if value is None or not value.strip().isdigit():
            raise FlagError(f"argument {arg.split('=')[0]}: expected a whole number, got {value!r}")
        others[kind] = int(value)
    return rest, others


# --- the endpoints' flags --------------------------------------------------------------------------------------

DEFAULT_PROBES_ADDRESS = ":8081"
DEFAULT_DIAGNOSTICS_ADDRESS = ":8443"  # Cluster API's util/flags default
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
    """Where the admission webhook listens (`port` 0: it is off) and with which certificate; `limits` bound what
    a client may hold of it and of the metrics endpoint."""

    host: str
    port: int
    cert: CertificateFiles
    limits: Limits = DEFAULT_LIMITS

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
        help="the directory holding the webhook's certificate and key (default: %(default)s), re-read when they "
        "change; while both are absent a self-signed certificate is served, which the API server does not trust",
    )
    webhook.add_argument(
        "--webhook-cert-name", metavar="FILE", help=f"the certificate's file name in it (default: {CERT_NAME})"
    )
    webhook.add_argument("--webhook-key-name", metavar="FILE", help=f"the key's file name in it (default: {KEY_NAME})")
    limits = run.add_argument_group("HTTP servers' limits (the webhook, the metrics and the probes)")
    limits.add_argument(
        "--http-read-header-timeout",
        type=positive_duration,
        default=HEADER_SECONDS,
        metavar="DURATION",
        help="a connection whose TLS handshake or request headers take longer is dropped (default: 32s, "
        "controller-runtime's)",
    )
    limits.add_argument(
        "--http-idle-timeout",
        type=positive_duration,
        default=IDLE_SECONDS,
        metavar="DURATION",
        help="a connection idle this long between requests is closed (default: 90s, controller-runtime's)",
    )
    limits.add_argument(
        "--http-max-connections",
        type=_positive_int,
        default=CONNECTIONS,
        metavar="N",
        help="connections each server keeps open at once, handshakes included; one more is closed at once "
        "(default: %(default)s)",
    )


def _positive_int(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number over 0")
    return int(text)


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0 to 65535)")
    return int(text)


def webhook_serving(args: argparse.Namespace) -> WebhookServing:
    limits = Limits(args.http_read_header_timeout, args.http_idle_timeout, args.http_max_connections)
    cert = CertificateFiles(
        args.webhook_cert_dir or DEFAULT_WEBHOOK_CERT_DIR,  # "": controller-runtime's default, as in Go
        args.webhook_cert_name or CERT_NAME,
        args.webhook_key_name or KEY_NAME,
    )
    return WebhookServing(args.webhook_host, args.webhook_port, cert, limits)


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
        "--metrics-cert-name", metavar="FILE", help=f"the certificate's file name (default: {CERT_NAME})"
    )
    serving.add_argument("--metrics-cert-key", metavar="FILE", help=f"the key's file name (default: {KEY_NAME})")


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
    cert_flags = given(args, "--metrics-cert-path", "--metrics-cert-name", "--metrics-cert-key")
    tls_flags = given(args, "--tls-min-version", "--tls-cipher-suites")
    unused_suites: list[str] = []  # named only when an endpoint is HTTPS; plain HTTP names the flags themselves
    tls = tls_options(args.tls_min_version, args.tls_cipher_suites, unused_suites)  # checked in every mode, as CAPI
    if webhook:
        ignored += unused_suites
        unused_suites, tls_flags = [], []
    cert = CertificateFiles(
        args.metrics_cert_path, args.metrics_cert_name or CERT_NAME, args.metrics_cert_key or KEY_NAME
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


# --- TLS -------------------------------------------------------------------------------------------------------

DEFAULT_MIN_VERSION = "VersionTLS12"
MIN_VERSIONS = {"VersionTLS12": ssl.TLSVersion.TLSv1_2, "VersionTLS13": ssl.TLSVersion.TLSv1_3}
REFUSED_VERSIONS = ("VersionTLS10", "VersionTLS11")

# Go's crypto/tls.CipherSuites(): the suites without known weaknesses; TLS 1.3 ones map to None.
SECURE_SUITES: dict[str, str | None] = {
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    # The older names component-base still accepts.
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
}

LEGACY_NAMES = frozenset({"TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305", "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305"})

# Go's crypto/tls.InsecureCipherSuites(): accepted with a warning. This OpenSSL may not offer some (RC4, 3DES).
INSECURE_SUITES: dict[str, str] = {
    "TLS_RSA_WITH_RC4_128_SHA": "RC4-SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA": "DES-CBC3-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA": "ECDHE-ECDSA-RC4-SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA": "ECDHE-RSA-RC4-SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA": "ECDHE-RSA-DES-CBC3-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
}


def tls_options(min_version: str | None, cipher_suites: str | None, ignored: list[str]) -> TlsOptions:
    """Resolve the two flags (None or "": the default). Suites that change nothing are appended to `ignored`, with
    the reason. Raises FlagError for an unknown or refused version, an unknown suite name, or an empty list."""
    minimum = _min_version(min_version or DEFAULT_MIN_VERSION)
    if not cipher_suites:
        return TlsOptions(minimum)
    names = [name.strip() for name in cipher_suites.split(",") if name.strip()]
    unknown = [name for name in names if name not in SECURE_SUITES and name not in INSECURE_SUITES]
    if unknown or not names:
        raise FlagError(
            f"argument --tls-cipher-suites: unknown cipher suite {', '.join(unknown) or repr(cipher_suites)}; "
            "use Go's crypto/tls names, such as TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"
        )
    if minimum == ssl.TLSVersion.TLSv1_3:
        ignored.append(
            f"--tls-cipher-suites={cipher_suites} "
            "(--tls-min-version=VersionTLS13: the TLS 1.3 suites are not configurable)"
        )
        return TlsOptions(minimum)
    chosen: list[str] = []
    for name in names:
        openssl_name = SECURE_SUITES.get(name) or INSECURE_SUITES.get(name)
        if openssl_name is None:
            continue  # a TLS 1.3 suite: always on
        if not _available(openssl_name):
            ignored.append(f"--tls-cipher-suites: {name} (not offered by {ssl.OPENSSL_VERSION})")
        elif openssl_name not in chosen:
            chosen.append(openssl_name)
    insecure = tuple(name for name in names if name in INSECURE_SUITES and INSECURE_SUITES[name] in chosen)
    if not chosen:
        # No TLS 1.2 suite to agree on: TLS 1.2 clients fail, as they would with Go given only TLS 1.3 suites.
        return TlsOptions(ssl.TLSVersion.TLSv1_3)
    return TlsOptions(minimum, ":".join(chosen), insecure)


def _min_version(name: str) -> ssl.TLSVersion:
    if name in MIN_VERSIONS:
        return MIN_VERSIONS[name]
    if name in REFUSED_VERSIONS:
        raise FlagError(
            f"argument --tls-min-version: {name} is not served: TLS 1.0 and 1.1 are disabled in OpenSSL 3 and "
            "deprecated in Python; use VersionTLS12 or VersionTLS13"
        )
    raise FlagError(f"argument --tls-min-version: unknown TLS version {name!r}; use VersionTLS12 or VersionTLS13")


def _available(openssl_name: str) -> bool:
    """Whether this OpenSSL, at its configured security level, can negotiate the suite."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).set_ciphers(openssl_name)
    except ssl.SSLError:
        return False
    return True
