"""Why a NetBox pool cannot serve claims: a reason for the pool's Ready condition and a message saying what to do.

A `Problem` becomes `Ready=False` with its reason on the pool (report), and PoolNotReadyError with its message
on the claims (allocate). Messages never contain the token.
"""

from __future__ import annotations

from backends.netbox.client import ClientClosedError, HTTPError, NetboxError, UnreachableError

READY = "PoolReady"
INVALID = "InvalidConfiguration"
SECRET_NOT_FOUND = "SecretNotFound"
INVALID_SECRET = "InvalidSecret"
AUTH_FAILED = "AuthenticationFailed"
UNREACHABLE = "NetBoxUnreachable"
TLS_FAILED = "TLSVerificationFailed"
SOURCE_NOT_FOUND = "SourceNotFound"
CUSTOM_FIELD_MISSING = "CustomFieldMissing"
CUSTOM_FIELD_INVALID = "CustomFieldInvalid"
TAG_MISSING = "TagMissing"
GATEWAY_NOT_RECORDED = "GatewayNotRecorded"  # a gateway inside a source that NetBox could hand out
OBJECT_NOT_FOUND = "ReferenceNotFound"  # a tenant, tag or VRF the spec names
NETBOX_ERROR = "NetBoxError"

RETRY_UNREACHABLE = 10.0  # claims on an unreachable NetBox are tried again this soon

# What a NetBox operation raises besides Problem: a failed call, or NetBox data the backend cannot use.
FAILURES = (NetboxError, ValueError, KeyError, TypeError)


class Problem(Exception):
    """A pool-level failure: `reason` (CamelCase) and `message` (for people)."""

    def __init__(self, reason: str, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


def from_netbox(error: NetboxError, context: str) -> Problem:
    """The Problem for a failed NetBox call made while `context` ("checking NetboxIPPool/ns/p")."""
    if isinstance(error, UnreachableError):
        if error.tls:
            return Problem(TLS_FAILED, f"{context}: {error.message}")
        if error.status is not None and error.status not in (502, 503, 504):  # not a gateway's "NetBox is down"
            return Problem(
                NETBOX_ERROR, f"{context}: {error.message}; NetBox failed on its side, see its logs", retry_after=5.0
            )
        return Problem(
            UNREACHABLE,
            f"{context}: {error.message}; check that NetBox is running and reachable from the controller at the "
            "`url` of the pool's Secret (spec.connection.secretRef)",
            retry_after=RETRY_UNREACHABLE,
        )
    if isinstance(error, ClientClosedError):
        return Problem(NETBOX_ERROR, f"{context}: {error.message}", retry_after=1.0)
    if isinstance(error, HTTPError) and error.auth:
        return Problem(
            AUTH_FAILED,
            f"{context}: {error.message}; put a valid NetBox API token with write permission on IP addresses "
            "in the Secret's `token` key",
        )
    return Problem(NETBOX_ERROR, f"{context}: {error.message}")


def from_failure(error: Exception, context: str, scrub: str | None) -> Problem:
    """The Problem for one of `FAILURES` raised while `context`: `from_netbox` for a failed call, else `from_data`."""
    if isinstance(error, NetboxError):
        return from_netbox(error, context)
    return from_data(error, context, scrub)


def from_data(error: Exception, context: str, scrub: str | None = None) -> Problem:
    """The Problem for NetBox data the backend could not use (a ValueError, KeyError or TypeError while reading an
    answer): never let such an error escape as something other than a backend error. `scrub` is removed."""
    text = str(error)[:200]
    if scrub:
        text = text.replace(scrub, "***")
    return Problem(
        NETBOX_ERROR,
        f"{context}: NetBox answered data this provider cannot use ({type(error).__name__}: "
        f"{text}); check the NetBox objects the pool names",
        retry_after=5.0,
    )
