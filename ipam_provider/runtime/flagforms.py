"""The values of a Cluster API manager's flags, in the forms Go writes them.

pflag reads booleans as Go's strconv.ParseBool does and durations as time.ParseDuration does; controller-runtime
takes bind addresses as ":8080" or "[::]:8080"; cluster-api-operator writes per-kind concurrency as
`--<kind>-concurrency=N`, a flag name argparse cannot declare, so `take_kind_concurrency` takes them out first.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

CLAIM_KIND = "ipaddressclaim"


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


def split_list(values: Sequence[str] | None) -> list[str]:
    """Repeated and comma-separated values as one list: ["a,b", "c"] -> ["a", "b", "c"]."""
    return [part.strip() for value in values or [] for part in value.split(",") if part.strip()]


# --- `--<kind>-concurrency=N` ----------------------------------------------------------------------------------

# cluster-api-operator writes one flag per entry of the manager's groupKindConcurrency, lower-cased: the key is a
# kind ("IPAddressClaim") or a kind with its group ("IPAddressClaim.ipam.cluster.x-k8s.io").
_KIND_CONCURRENCY = re.compile(r"--([A-Za-z0-9][A-Za-z0-9.-]*?)-concurrency(?:=(.*))?", re.DOTALL)


def take_kind_concurrency(argv: Sequence[str]) -> tuple[list[str], dict[str, int]]:
    """Take every `--<kind>-concurrency[=]N` out of `run`'s arguments: the claim kind's becomes
    `--ipaddressclaim-concurrency=N` (a flag of its own, acted on); other kinds' come back as {kind: N}."""
    rest: list[str] = []
    others: dict[str, int] = {}
    in_run = False
    index = 0
    while index < len(argv):
        arg = argv[index]
        index += 1
        match = _KIND_CONCURRENCY.fullmatch(arg) if in_run else None
        if match is None:
            rest.append(arg)
            in_run = in_run or arg == "run"
            if arg == "--":
                rest.extend(argv[index:])
                break
            continue
        kind, value = match.group(1).lower().split(".")[0], match.group(2)
        if value is None and index < len(argv):
            value, index = argv[index], index + 1
        if kind == CLAIM_KIND:
            rest.append(f"--{CLAIM_KIND}-concurrency" if value is None else f"--{CLAIM_KIND}-concurrency={value}")
            continue
        if value is None or not value.strip().isdigit():
            raise FlagError(f"argument {arg.split('=')[0]}: expected a whole number, got {value!r}")
        others[kind] = int(value)
    return rest, others
