"""Why a NetBox pool cannot serve claims: `PoolUnusableError`, a reason for the pool's Ready condition and a message
saying what to do. It becomes `Ready=False` with its reason on the pool (report), and PoolNotReadyError (or, for
NETBOX_ERROR, AllocationFailedError) with its message on the claims. Messages never contain the token.
"""

from __future__ import annotations

from backends.netbox.client import ClientClosedError, HTTPError, NetboxClient, NetboxError, UnreachableError
from ipam_provider.backend.contract import BackendError

READY = "PoolReady"
INVALID = "InvalidConfiguration"
SECRET_NOT_FOUND = "SecretNotFound"
SECRET_NOT_ALLOWED = "SecretNotAllowed"  # the pool may not read the Secret it names (ipam_provider.backend.tenancy)
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

# What a NetBox operation raises besides PoolUnusableError: a failed call, or NetBox data the backend cannot use.
CAUGHT = (NetboxError, ValueError, KeyError, TypeError)


class PoolUnusableError(Exception):
    """A pool-level failure: `reason` (CamelCase, for the pool's Ready condition) and `message` (for people)."""

    def __init__(self, reason: str, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


def of_failure(error: Exception, context: str, scrub: str | None) -> PoolUnusableError:
    """The PoolUnusableError for one of `CAUGHT` raised while `context` ("checking NetboxIPPool/ns/p"): a failed
    NetBox call, or NetBox data the backend could not use (never let such an error escape as something other than a
    backend error). `scrub` (the token) is removed from the latter's text."""
    if isinstance(error, UnreachableError):
        if error.tls:
            return PoolUnusableError(TLS_FAILED, f"{context}: {error.message}")
        if error.status is not None and error.status not in (502, 503, 504):  # not a gateway's "NetBox is down"
            message = f"{context}: {error.message}; NetBox failed on its side, see its logs"
            return PoolUnusableError(NETBOX_ERROR, message, retry_after=5.0)
        return PoolUnusableError(
            UNREACHABLE,
            f"{context}: {error.message}; check that NetBox is running and reachable from the controller at the "
            "`url` of the pool's Secret (spec.connection.secretRef)",
            retry_after=RETRY_UNREACHABLE,
        )
    if isinstance(error, ClientClosedError):
        return PoolUnusableError(NETBOX_ERROR, f"{context}: {error.message}", retry_after=1.0)
    if isinstance(error, HTTPError) and error.auth:
        return PoolUnusableError(
            AUTH_FAILED,
            f"{context}: {error.message}; put a valid NetBox API token with write permission on IP addresses "
            "in the Secret's `token` key",
        )
    if isinstance(error, NetboxError):
        return PoolUnusableError(NETBOX_ERROR, f"{context}: {error.message}")
    text = str(error)[:200]
    if scrub:
        text = text.replace(scrub, "***")
    return PoolUnusableError(
        NETBOX_ERROR,
        f"{context}: NetBox answered data this provider cannot use ({type(error).__name__}: {text}); check the "
        "NetBox objects the pool names",
        retry_after=5.0,
    )


def for_claims(message: str, client: NetboxClient | None) -> str:
    """A pool-level `message` as a claim shows it: the NetBox URL (from the pool's Secret, which for a Global pool is
    the lending namespace's, not the claim's) is replaced with "the pool's NetBox"; only the pool's own condition
    names it."""
    if client is None:
        return message
    shown = client.endpoint.display_url
    for url in (f"NetBox at {shown}", shown, client.endpoint.url):
        message = message.replace(url, "the pool's NetBox")
    return message


def shown_to_claims(error: BackendError, client: NetboxClient | None) -> BackendError:
    """`error`, its message changed in place by `for_claims` (its type and retry stay)."""
    error.message = for_claims(error.message, client)
    error.args = (error.message,)
    return error
