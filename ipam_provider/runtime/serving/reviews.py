"""Authentication and authorisation of a request by the API server, as Kubernetes' delegated auth does it.

A bearer token is authenticated with a TokenReview; the user it names is authorised with a SubjectAccessReview of
a non-resource URL and verb (e.g. `get` `/metrics`). Answers are cached for a few seconds, in a bounded cache, so
that a burst of scrapes costs one review per token; tokens are kept only as their SHA-256 and never logged.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import aiohttp

from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import Resource

TOKEN_REVIEWS = Resource("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False)
ACCESS_REVIEWS = Resource("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False)
CACHE_SECONDS = 10.0
CACHE_ENTRIES = 1024
REVIEW_TIMEOUT = 10.0
CONCURRENT_REVIEWS = 4

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ReviewUnavailable(Exception):
    """The API server did not answer a review (`unanswered`: unreachable, timed out) or refused to make it (an
    error status, e.g. 403 when this process may not create reviews)."""

    def __init__(self, message: str, *, unanswered: bool) -> None:
        super().__init__(message)
        self.unanswered = unanswered


@dataclass(frozen=True)
class User:
    """Who a token belongs to, as the TokenReview says."""

    name: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]


class TtlCache(Generic[K, V]):
    """At most `size` entries, each forgotten `seconds` after it was stored; the oldest go first when full."""

    def __init__(self, seconds: float, size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds, self.size, self._clock = seconds, size, clock
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K) -> tuple[bool, V | None]:
        """(True, value) for a live entry, else (False, None)."""
        entry = self._entries.get(key)
        if entry is None:
            return False, None
        if entry[0] <= self._clock():
            del self._entries[key]
            return False, None
        return True, entry[1]

    def put(self, key: K, value: V) -> None:
        self._entries.pop(key, None)
        self._entries[key] = (self._clock() + self.seconds, value)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class Reviewer:
    """TokenReviews and SubjectAccessReviews through `kube`, cached, at most CONCURRENT_REVIEWS at a time."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        cache_seconds: float = CACHE_SECONDS,
        cache_entries: int = CACHE_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._users: TtlCache[str, User | None] = TtlCache(cache_seconds, cache_entries, clock)
        self._decisions: TtlCache[tuple[User, str, str], bool] = TtlCache(cache_seconds, cache_entries, clock)
        self._slots = asyncio.Semaphore(CONCURRENT_REVIEWS)
        self.reviews = 0  # reviews sent to the API server (the cache's misses)

    async def authenticate(self, token: str) -> User | None:
        """The token's user, or None when the API server does not authenticate it. Raises ReviewUnavailable."""
        digest = hashlib.sha256(token.encode()).hexdigest()
        cached, user = self._users.get(digest)
        if cached:
            return user
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        status = (await self._review(TOKEN_REVIEWS, body)).get("status") or {}
        user = _user(status["user"]) if status.get("authenticated") and status.get("user") else None
        self._users.put(digest, user)
        return user

    async def authorize(self, user: User, path: str, verb: str) -> bool:
        """Whether `user` may `verb` the non-resource URL `path`. Raises ReviewUnavailable."""
        key = (user, path, verb)
        cached, allowed = self._decisions.get(key)
        if cached:
            return bool(allowed)
        spec: dict[str, Any] = {
            "user": user.name,
            "uid": user.uid,
            "groups": list(user.groups),
            "extra": {name: list(values) for name, values in user.extra},
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        status = (await self._review(ACCESS_REVIEWS, body)).get("status") or {}
        allowed = bool(status.get("allowed")) and not status.get("denied")
        self._decisions.put(key, allowed)
        return allowed

    async def _review(self, resource: Resource, body: dict[str, Any]) -> dict[str, Any]:
        async with self._slots:
            self.reviews += 1
            try:
                return await asyncio.wait_for(self._kube.create(resource, body), REVIEW_TIMEOUT)
            except ApiError as error:
                message = f"the API server refused the {resource.kind}: {error}"
                raise ReviewUnavailable(message, unanswered=False) from None
            except (aiohttp.ClientError, OSError, TimeoutError) as error:
                reason = str(error) or type(error).__name__
                message = f"the API server did not answer the {resource.kind}: {reason}"
                raise ReviewUnavailable(message, unanswered=True) from None


def _user(info: dict[str, Any]) -> User:
    extra = info.get("extra") or {}
    return User(
        name=str(info.get("username", "")),
        uid=str(info.get("uid", "")),
        groups=tuple(info.get("groups") or ()),
        extra=tuple(sorted((str(k), tuple(v or ())) for k, v in extra.items())),
    )
