"""The ``requests`` sessions the tests and benchmarks use for their own calls to NetBox (pynetbox clients, the
fault proxy).

Contract of :func:`netbox_session`: a request is sent again, once and on a new connection, only when its connection
was reset or closed before any answer came, and only for methods that are idempotent by definition (GET, HEAD,
PUT, DELETE, OPTIONS). Nothing else is retried:

- never POST or PATCH: NetBox may have carried the request out, and the test must see that it cannot know;
- never a timeout: a slow NetBox is a finding;
- never a refused connection: NetBox is down, and the test must see that;
- never an HTTP status: NetBox's answer is the test's to judge.

Why: HTTP/1.1 lets a server close an idle keep-alive connection at any time (RFC 9112, section 9.3.1). A session
reuses its pooled connection and checks first that the server has not closed it, but a close that comes just after
that check meets the request on the wire: the server drops the unread request and the kernel answers with a reset,
so the client gets ``ConnectionResetError`` although nothing went wrong. The NetBox the harness starts never
closes idle connections (``hack/netbox/web.sh`` runs gunicorn with ``--keep-alive 3600 --max-requests 0``); a
NetBox given by NETBOX_URL may (gunicorn's default is after 2 s, nginx's after 75 s). The controller's own client
(backends/netbox/client.py) handles the same case with its own retries.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

import requests
from requests.adapters import HTTPAdapter
from urllib3.connectionpool import ConnectionPool
from urllib3.exceptions import ReadTimeoutError
from urllib3.response import BaseHTTPResponse
from urllib3.util.retry import Retry

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


class _ResetRetry(Retry):
    """urllib3's read-error retry without its retry of read timeouts: a timeout is raised at once."""

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: BaseHTTPResponse | None = None,
        error: Exception | None = None,
        _pool: ConnectionPool | None = None,
        _stacktrace: TracebackType | None = None,
    ) -> Self:
        if isinstance(error, ReadTimeoutError):
            raise error.with_traceback(_stacktrace)
        return super().increment(method, url, response, error, _pool, _stacktrace)


def reset_retry() -> Retry:
    """One more try for an idempotent request whose connection was reset or closed before an answer came."""
    return _ResetRetry(
        total=1,
        connect=0,  # refused: NetBox is down (as without retries: raised as requests.ConnectionError)
        read=1,  # reset or closed after the request was sent: only for IDEMPOTENT_METHODS (urllib3 checks)
        status=0,
        other=0,
        redirect=0,
        allowed_methods=IDEMPOTENT_METHODS,
        status_forcelist=(),
        respect_retry_after_header=False,
        raise_on_status=False,
        backoff_factor=0,
    )


def netbox_session() -> requests.Session:
    """A new session whose requests follow the module's contract; one per thread (sessions are not documented
    as thread-safe)."""
    session = requests.Session()
    adapter = HTTPAdapter(max_retries=reset_retry())
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
