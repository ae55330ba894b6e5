"""A real NetBox for the test suite: pytest fixtures over the scripts in ``hack/netbox/``.

Use it with ``pytest_plugins = ["tests.support.netbox"]`` (top-level conftest, or a test module).

Fixtures
--------
``netbox_server`` (session scope)
    A :class:`NetBoxServer`. When ``NETBOX_URL`` and ``NETBOX_TOKEN`` are both set, that NetBox is used and
    never stopped; if ``NETBOX_RUN_DIR`` names the run dir ``hack/netbox/start.sh`` wrote (sourcing its
    ``netbox.env`` sets all three), the harness may also reset its database and stop/start its web server.
    Otherwise the fixture runs ``install.sh`` (idempotent; a few seconds when warm, but ~10 minutes on a cold
    machine, so CI runs it first) and ``start.sh``, and stops that NetBox with ``stop.sh`` at session end.
    Anything missing or broken fails the test loudly (``pytest.fail``); nothing is ever skipped.

``netbox`` (module scope)
    The same :class:`NetBoxServer`, after giving it a fresh database and making sure its web server runs.
    Every test module that uses it starts from an empty NetBox (migrated; the admin user and token only).
    Tests inside one module share that database, so they should use distinct prefixes and names, or call
    :meth:`NetBoxServer.reset_database` themselves.

    With a NetBox from NETBOX_URL/NETBOX_TOKEN alone (no NETBOX_RUN_DIR: a shared NetBox the harness does not
    manage) there is no reset: the database is shared by every module and run. Modules then use their own
    prefixes and unique names (or get-or-create names the examples fix), and the fixture deletes, at the end of
    the module, every object created meanwhile by the token's user or by users the module created (read from
    NetBox's change log; newest first; objects others made are never touched). Tests that must reset the
    database or stop/start NetBox call :meth:`NetBoxServer.require_harness` first and fail with a message saying
    they need a harness-started NetBox.

Isolation: how and why
----------------------
Per module the harness drops the instance's database (``WITH (FORCE)``) and re-creates it from the template under
the same name while gunicorn keeps running (``hack/netbox/reset-db.sh``, 0.2-0.6 s). Safe because
``CONN_MAX_AGE = 0`` and NetBox 4.7 caches no rows between requests. Restarting gunicorn (12-15 s) and deleting
through the API (slower, misses object types, moves sequences) were rejected; see docs/netbox-harness.md.

Stopping NetBox mid-test
------------------------
``await server.stop_web()`` stops gunicorn (≈4.5 s; ``kill=True``: SIGKILL, like a crash, ≈0.2 s); ``await
server.start_web()`` brings it back on the same URL and database once ``GET /api/status/`` answers 200 (8-10 s).
Blocking twins: ``stop_web_sync``/``start_web_sync``. Harness-managed instances only (else the test fails).

Time limits: the session fixture's set-up counts against the first test's pytest-timeout (600 s), so a
cold install (≈8-12 min) must run before pytest; see docs/netbox-harness.md.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pynetbox
import pytest
import requests

from tools.netbox_sessions import netbox_session

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = REPO_ROOT / "hack" / "netbox"
VERSIONS_FILE = REPO_ROOT / "hack" / "versions.env"

# Longest a script may take in the fixture. install.sh is minutes only on a cold machine.
INSTALL_TIMEOUT_S = 1800.0
START_TIMEOUT_S = 300.0
STEP_TIMEOUT_S = 120.0

T = TypeVar("T")


class NetBoxHarnessError(RuntimeError):
    """A harness script failed; the message says which and ends with its output."""


def netbox_version() -> str:
    """The NetBox version pinned as ``NETBOX_VERSION`` in ``hack/versions.env``."""
    match = re.search(r"^NETBOX_VERSION=(\S+)$", VERSIONS_FILE.read_text(), re.MULTILINE)
    if match is None:
        raise NetBoxHarnessError(f"NETBOX_VERSION is not set in {VERSIONS_FILE}")
    return match.group(1)


def read_env_file(path: Path) -> dict[str, str]:
    """Parses the ``KEY=value`` lines of an env file written by ``start.sh``."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def run_script(name: str, *args: str, timeout: float = STEP_TIMEOUT_S) -> str:
    """Runs ``hack/netbox/<name>`` and returns its stdout.

    Raises :class:`NetBoxHarnessError` carrying the script's output when it fails or times out. The scripts
    never print the token, so the output is safe to show.
    """
    command = [str(SCRIPTS / name), *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as error:
        raise NetBoxHarnessError(f"{name} did not finish within {timeout:.0f} s") from error
    except OSError as error:
        raise NetBoxHarnessError(f"cannot run {command[0]}: {error}") from error
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip().splitlines()[-40:]
        raise NetBoxHarnessError(f"{name} failed with exit code {done.returncode}:\n" + "\n".join(output))
    return done.stdout


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-") or "x"


@dataclass
class NetBoxServer:
    """One NetBox the tests talk to.

    ``url`` and ``token`` (a v2 ``nbt_<key>.<secret>`` token with write rights) are always set. ``run_dir``
    is the directory ``start.sh`` wrote; it is ``None`` for a NetBox the harness does not manage, which
    then supports neither :meth:`reset_database` nor :meth:`stop_web`/:meth:`start_web`. ``owned`` is
    true when this session started the instance and must stop it.
    """

    url: str
    token: str = field(repr=False)
    run_dir: Path | None = None
    owned: bool = False
    last_reset_s: float | None = None

    @property
    def pinned_version(self) -> str:
        """``NETBOX_VERSION`` from ``hack/versions.env`` (what a harness-started NetBox runs)."""
        return netbox_version()

    # --- clients ------------------------------------------------------------------------------------------

    def api(self) -> Any:
        """A new pynetbox client (pynetbox sends ``Authorization: Bearer`` for ``nbt_`` tokens).

        A new client per call: a ``requests.Session`` is not documented as thread-safe, so give each thread
        its own client. Its session keeps connections open between calls; an idempotent request whose reused
        connection the server closed under it is sent once more, nothing else is retried (see
        :mod:`tools.netbox_sessions`).
        """
        api = pynetbox.api(self.url, token=self.token)
        api.http_session = netbox_session()
        return api

    def status(self, timeout: float = 5.0) -> dict[str, Any]:
        """``GET /api/status/`` with the token; raises ``requests`` exceptions when NetBox is not serving."""
        response = requests.get(
            f"{self.url}/api/status/",
            headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"},
            timeout=timeout,
        )
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def is_serving(self) -> bool:
        """True when ``GET /api/status/`` answers 200 right now."""
        try:
            self.status(timeout=2.0)
        except requests.RequestException:
            return False
        return True

    # --- lifecycle (harness-managed instances only) -------------------------------------------------------

    @property
    def managed(self) -> bool:
        """True when the harness may reset this NetBox's database and stop/start its web server."""
        return self.run_dir is not None

    def require_harness(self, what: str) -> Path:
        """Fails the test unless this NetBox was started by the harness (``start.sh``); returns its run dir."""
        return self._require_run_dir(what)

    def _require_run_dir(self, what: str) -> Path:
        if self.run_dir is None:
            pytest.fail(
                f"{what} needs a NetBox started by hack/netbox/start.sh: this one ({self.url}) came from "
                "NETBOX_URL/NETBOX_TOKEN without NETBOX_RUN_DIR. Source the run dir's netbox.env, or unset "
                "NETBOX_URL and NETBOX_TOKEN to let the harness start its own.",
                pytrace=False,
            )
        return self.run_dir

    # --- a shared NetBox: clean up what a module created -------------------------------------------------

    def _get(self, url: str) -> dict[str, Any]:
        response = requests.get(url, headers=self._headers(), timeout=30)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def _headers(self) -> dict[str, str]:
        scheme = "Bearer" if self.token.startswith("nbt_") else "Token"
        return {"Authorization": f"{scheme} {self.token}", "Accept": "application/json"}

    def last_change_id(self) -> int:
        """The id of NetBox's newest change-log entry (0 if none)."""
        page = self._get(f"{self.url}/api/core/object-changes/?ordering=-id&limit=1&brief=1")
        return int(page["results"][0]["id"]) if page["results"] else 0

    def delete_created_since(self, change_id: int) -> int:
        """Deletes, newest first, every object that still exists and was created after change ``change_id`` by
        the token's user or by a user created meanwhile by them; returns how many were deleted."""
        me = int(self._get(f"{self.url}/api/authentication-check/")["id"])
        url: str | None = f"{self.url}/api/core/object-changes/?id__gt={change_id}&action=create&ordering=id&limit=500"
        created: list[dict[str, Any]] = []
        while url:
            page = self._get(url)
            created.extend(page["results"])
            url = page.get("next")
        users = {me}
        for change in created:  # in creation order: a user is created before it creates anything
            if (change.get("user") or {}).get("id") in users and change["changed_object_type"] == "users.user":
                users.add(int(change["changed_object_id"]))
        deleted = 0
        for change in reversed(created):
            target = change.get("changed_object") or {}
            if (change.get("user") or {}).get("id") not in users or not target.get("url"):
                continue
            answer = requests.delete(target["url"], headers=self._headers(), timeout=30)
            if answer.status_code not in (204, 404):
                answer.raise_for_status()
            deleted += answer.status_code == 204
        return deleted

    def reset_database(self) -> float:
        """Replaces this instance's database with a fresh copy of the template; returns the seconds taken.

        Afterwards NetBox holds only the migrations' data plus the admin user and this token. Web server
        state is untouched (a stopped server stays stopped).
        """
        run_dir = self._require_run_dir("reset_database()")
        started = time.perf_counter()
        _fail_on_error(lambda: run_script("reset-db.sh", str(run_dir)))
        self.last_reset_s = time.perf_counter() - started
        return self.last_reset_s

    def web_running(self) -> bool:
        """True when this instance's gunicorn master is alive (it may still be starting)."""
        run_dir = self._require_run_dir("web_running()")
        command = [str(SCRIPTS / "web.sh"), "status", str(run_dir)]
        return subprocess.run(command, capture_output=True, check=False).returncode == 0

    def stop_web_sync(self, *, kill: bool = False) -> None:
        """Stops gunicorn, master and every worker; returns when none is left and the port is closed.

        ``kill=False``: gunicorn's quick shutdown (SIGQUIT, ~5 s). ``kill=True``: SIGKILL to the process
        group, like a crash (~0.1 s). The database stays; :meth:`start_web_sync` reuses the same port.
        """
        run_dir = self._require_run_dir("stop_web()")
        _fail_on_error(lambda: run_script("web.sh", "kill" if kill else "stop", str(run_dir)))

    def start_web_sync(self) -> None:
        """Starts gunicorn on the same port; returns once ``GET /api/status/`` answers 200."""
        run_dir = self._require_run_dir("start_web()")
        _fail_on_error(lambda: run_script("web.sh", "start", str(run_dir), timeout=START_TIMEOUT_S))

    async def stop_web(self, *, kill: bool = False) -> None:
        """Async :meth:`stop_web_sync` (runs in a thread, the event loop keeps going)."""
        await asyncio.to_thread(self.stop_web_sync, kill=kill)

    async def start_web(self) -> None:
        """Async :meth:`start_web_sync` (runs in a thread, the event loop keeps going)."""
        await asyncio.to_thread(self.start_web_sync)

    def ensure_web(self) -> None:
        """Starts the web server if a test left it stopped."""
        if not self.is_serving():
            self.start_web_sync()

    # --- object helpers -----------------------------------------------------------------------------------

    def create_tenant(self, name: str, *, slug: str | None = None, **fields: Any) -> Any:
        """Creates a tenant; the slug defaults to a slugified name."""
        return self.api().tenancy.tenants.create(name=name, slug=slug or _slug(name), **fields)

    def create_tag(self, name: str, *, slug: str | None = None, **fields: Any) -> Any:
        """Creates a tag (it must exist before objects or filters can use it)."""
        return self.api().extras.tags.create(name=name, slug=slug or _slug(name), **fields)

    def create_custom_field(
        self,
        name: str,
        *,
        object_types: Sequence[str] = ("ipam.ipaddress",),
        type: str = "text",
        **fields: Any,
    ) -> Any:
        """Creates a custom field; objects are then filtered with ``cf_<name>=<value>``."""
        return self.api().extras.custom_fields.create(name=name, type=type, object_types=list(object_types), **fields)

    def create_prefix(
        self,
        prefix: str,
        *,
        tenant: Any = None,
        tags: Sequence[str] = (),
        is_pool: bool = False,
        **fields: Any,
    ) -> Any:
        """Creates a prefix (``tenant``: a record or an id; ``tags``: slugs of existing tags)."""
        return self.api().ipam.prefixes.create(
            prefix=prefix,
            is_pool=is_pool,
            tenant=_ref(tenant),
            tags=[{"slug": slug} for slug in tags],
            **fields,
        )

    def create_ip_range(self, start_address: str, end_address: str, *, tags: Sequence[str] = (), **fields: Any) -> Any:
        """Creates an ip-range; both ends carry the mask, e.g. ``"10.0.0.10/24"``, ``"10.0.0.20/24"``."""
        return self.api().ipam.ip_ranges.create(
            start_address=start_address,
            end_address=end_address,
            tags=[{"slug": slug} for slug in tags],
            **fields,
        )


def _ref(obj: Any) -> Any:
    """A record, an id or None, as NetBox's API accepts it for a foreign key."""
    return getattr(obj, "id", obj)


def _fail_on_error(step: Callable[[], T]) -> T:
    """Runs a harness step; a :class:`NetBoxHarnessError` fails the current test with its message."""
    try:
        return step()
    except NetBoxHarnessError as error:
        message = f"NetBox harness: {error}"
    pytest.fail(message, pytrace=False)  # outside the except: no exception chain in the report


def _server_from_environment() -> NetBoxServer | None:
    """The NetBox named by NETBOX_URL/NETBOX_TOKEN (and optionally NETBOX_RUN_DIR), or None."""
    url, token = os.environ.get("NETBOX_URL", ""), os.environ.get("NETBOX_TOKEN", "")
    if not url and not token:
        return None
    if not (url and token):
        missing = "NETBOX_TOKEN" if url else "NETBOX_URL"
        pytest.fail(f"NETBOX_URL and NETBOX_TOKEN must be set together; {missing} is missing", pytrace=False)
    run_dir_value = os.environ.get("NETBOX_RUN_DIR", "")
    run_dir = Path(run_dir_value) if run_dir_value else None
    if run_dir is not None and not (run_dir / "netbox.env").is_file():
        pytest.fail(f"NETBOX_RUN_DIR={run_dir} holds no netbox.env written by start.sh", pytrace=False)
    server = NetBoxServer(url=url.rstrip("/"), token=token, run_dir=run_dir, owned=False)
    try:
        server.status(timeout=10.0)
    except requests.RequestException as error:
        message = f"NETBOX_URL={server.url} with NETBOX_TOKEN did not answer GET /api/status/ with 200: {error}"
    else:
        return server
    pytest.fail(message, pytrace=False)


def _start_own_server(run_dir: Path) -> NetBoxServer:
    """Runs install.sh and start.sh in ``run_dir``; the caller stops the server with ``stop.sh``."""
    run_script("install.sh", timeout=INSTALL_TIMEOUT_S)
    run_script("start.sh", str(run_dir), timeout=START_TIMEOUT_S)
    env = read_env_file(run_dir / "netbox.env")
    return NetBoxServer(url=env["NETBOX_URL"], token=env["NETBOX_TOKEN"], run_dir=run_dir, owned=True)


@pytest.fixture(scope="session")
def netbox_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetBoxServer]:
    """The session's NetBox (see the module docstring); fails loudly when it cannot be had."""
    server = _server_from_environment()
    if server is None:
        run_dir = tmp_path_factory.mktemp("netbox-run")
        failure = ""
        try:
            server = _start_own_server(run_dir)
        except NetBoxHarnessError as error:
            failure = str(error)
        if server is None:
            run_script_quietly("stop.sh", str(run_dir))
            pytest.fail(
                f"could not start a real NetBox {netbox_version()} for the tests: {failure}\n"
                "Run hack/netbox/install.sh once (needs root for apt, Python 3.12, PyPI access), or point "
                "NETBOX_URL and NETBOX_TOKEN at a running NetBox.",
                pytrace=False,
            )
    try:
        yield server
    finally:
        if server.owned and server.run_dir is not None:
            run_script_quietly("stop.sh", str(server.run_dir))
        elif server.run_dir is not None and not server.is_serving():
            # Leave a NetBox we were lent the way we found it: serving.
            run_script_quietly("web.sh", "start", str(server.run_dir), timeout=START_TIMEOUT_S)


def run_script_quietly(name: str, *args: str, timeout: float = STEP_TIMEOUT_S) -> None:
    """Like :func:`run_script` for clean-up paths: reports a failure as a warning instead of raising."""
    try:
        run_script(name, *args, timeout=timeout)
    except NetBoxHarnessError as error:
        warnings.warn(f"NetBox harness clean-up: {error}", stacklevel=2)


@pytest.fixture(scope="module")
def netbox(netbox_server: NetBoxServer) -> Iterator[NetBoxServer]:
    """``netbox_server`` with a fresh database for this test module and its web server running; on a shared
    NetBox (no run dir), no reset, and what the module created is deleted afterwards (see the module docstring)."""
    if not netbox_server.managed:
        if not netbox_server.is_serving():
            pytest.fail(f"the NetBox at {netbox_server.url} (NETBOX_URL) does not answer", pytrace=False)
        start = netbox_server.last_change_id()
        yield netbox_server
        if netbox_server.is_serving():
            netbox_server.delete_created_since(start)
        return
    netbox_server.reset_database()
    netbox_server.ensure_web()
    yield netbox_server
