"""HTTP basic authentication and the ``ibapauth`` session cookie.

Contract:

* a request with valid HTTP basic credentials is accepted, and the answer sets a fresh session cookie
  ``ibapauth="ip=<client>,client=API,group=admin-group,ctime=<t>,timeout=<s>,mtime=<t>,su=1,auth=LOCAL,
  user=<name>,<token>"; httponly; Path=/`` (the layout NIOS uses; infoblox-client reads ``ctime`` and
  ``timeout`` from it to decide when to log in again);
* a request without an ``Authorization`` header but with a live session cookie is accepted; a session lives
  ``timeout`` seconds after its last use;
* wrong credentials, an unknown or expired cookie, or nothing at all answer 401 (checked basic credentials
  win over a cookie when both are sent);
* sessions are kept in order of last use, so creating a session first forgets the expired ones from the
  oldest end (amortised O(1) per request: each session is forgotten once), and the session table stays as large
  as the live sessions plus one (every basic-auth request opens a session, as on NIOS);
* :meth:`Authenticator.expire_sessions` forgets every session, as a grid restart would.  Thread-safe.
"""

from __future__ import annotations

import base64
import binascii
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

COOKIE_NAME = "ibapauth"


@dataclass(frozen=True)
class AuthResult:
    """The outcome of authenticating one request."""

    ok: bool
    method: str  # "basic", "cookie" or "none"
    user: str | None = None
    set_cookie: str | None = None


class Authenticator:
    """Checks credentials and keeps sessions."""

    def __init__(
        self, users: dict[str, str], session_timeout: int = 600, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._users = dict(users)
        self._clock = clock  # seconds, monotonic; tests may pass their own
        self.session_timeout = session_timeout
        self._sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()  # token -> (user, last use), by use
        self._lock = threading.Lock()

    def add_user(self, username: str, password: str) -> None:
        """Allow another account."""
        with self._lock:
            self._users[username] = password

    def expire_sessions(self) -> None:
        """Forget every session; later cookie-only requests answer 401."""
        with self._lock:
            self._sessions.clear()

    @property
    def session_count(self) -> int:
        """How many sessions are open."""
        with self._lock:
            return len(self._sessions)

    def authenticate(self, authorization: str | None, cookie_header: str | None, client_ip: str) -> AuthResult:
        """Check one request's ``Authorization`` and ``Cookie`` headers."""
        if authorization:
            user = self._check_basic(authorization)
            if user is None:
                return AuthResult(False, "basic")
            return AuthResult(True, "basic", user, self._new_session(user, client_ip))
        token = _cookie_token(cookie_header)
        if token is not None:
            now = self._clock()
            with self._lock:
                session = self._sessions.get(token)
                if session is not None and now - session[1] <= self.session_timeout:
                    self._sessions[token] = (session[0], now)
                    self._sessions.move_to_end(token)
                    return AuthResult(True, "cookie", session[0])
                self._sessions.pop(token, None)
            return AuthResult(False, "cookie")
        return AuthResult(False, "none")

    def _check_basic(self, authorization: str) -> str | None:
        scheme, _, encoded = authorization.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, sep, password = decoded.partition(":")
        with self._lock:
            expected = self._users.get(user)
        if not sep or expected is None or not secrets.compare_digest(expected, password):
            return None
        return user

    def _new_session(self, user: str, client_ip: str) -> str:
        token = secrets.token_urlsafe(27)
        started = self._clock()
        with self._lock:
            self._prune(started)
            self._sessions[token] = (user, started)
        now = int(time.time())
        value = (
            f"ip={client_ip},client=API,group=admin-group,ctime={now},timeout={self.session_timeout},"
            f"mtime={now},su=1,auth=LOCAL,user={user},{token}"
        )
        return f'{COOKIE_NAME}="{value}"; httponly; Path=/'

    def _prune(self, now: float) -> None:
        """Forget expired sessions, oldest use first, stopping at the first live one (the caller holds the lock)."""
        while self._sessions:
            token, (_user, last_use) = next(iter(self._sessions.items()))
            if now - last_use <= self.session_timeout:
                return
            del self._sessions[token]


def _cookie_token(cookie_header: str | None) -> str | None:
    """The session token (last comma-separated part) of the ``ibapauth`` cookie, if sent."""
    if not cookie_header:
        return None
    for part in cookie_header.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name == COOKIE_NAME:
            return value.strip().strip('"').rsplit(",", 1)[-1] or None
    return None
