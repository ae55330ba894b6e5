"""The chaos run's NetBox: the real NetBox, a fault proxy in front of it, pools pointing at the proxy, and the truth
read from NetBox itself.

Contract (the `ChaosBackend` of benchmarks/chaos/backends.py, plus what is said here):
- Which NetBox: `NetboxChaos(url=..., token=..., run_dir=...)` attaches to that one; without `url`, NETBOX_URL and
  NETBOX_TOKEN (and NETBOX_RUN_DIR, as sourcing a run dir's netbox.env sets them) name it; without those, `start()`
  runs hack/netbox/install.sh and start.sh in the run dir `<workdir>/netbox` (a new temporary directory without
  `workdir`) and `stop()` runs stop.sh. An attached NetBox is never stopped. `netbox-restart` restarts gunicorn
  through hack/netbox/web.sh, so it needs a run dir: attached without one, it is left out of `fault_kinds`.
- `start()` prepares, directly in NetBox: the owner tag and the three custom fields, as the backend would create them;
  a user with the rights examples/netbox/10-secret.yaml lists (no rights on tags or custom fields) and a v2 token
  for the pools' Secret (deleted by `stop()`); and `max_pools` slots. Slot s is the network 10.77.s.0/24, holding
  the prefix 10.77.s.0/27 (gateway 10.77.s.1, recorded as an IP address as the backend requires) and the ip-range
  10.77.s.100-10.77.s.227 (prefixLength 24, same gateway): a pool fills its prefix first, then its range. Marked
  addresses an earlier run left in a slot (an attached NetBox) are deleted.
- `manifests(namespace, count)`: the Secret `chaos-netbox` (url: the proxy) and NetboxIPPools `chaos-netbox-<i>`,
  each on its own slot (slots are handed out in order of first use, across namespaces; more pools than
  `max_pools` raise ValueError).
- Faults, each ending by itself (what is queued and has not met a request within `fault_window` seconds is taken
  back): `netbox-5xx` answers the next 3-10 requests 502 or 503 from the proxy (NetBox does nothing);
  `netbox-timeout` holds the next request back `request_timeout` + 3 s (by default the backend's read timeout), at
  random before it reaches NetBox (NetBox carries it out after the client gave up) or after (the answer comes too
  late); `netbox-lost-reply` forwards the next POST (2 in 3) or DELETE (or, when none came within half the
  window, the next request of any kind), then closes the connection unanswered; `netbox-restart` stops gunicorn
  (its quick shutdown, or SIGKILL like a crash) and starts it again, returning once NetBox answers. `fired` counts
  the faults that met a request (or restarts done), by kind; one that met none is logged.
- `truth()`: per slot handed to a pool, every IP address with the owner tag whose address lies in the slot's
  network (`?tag=capi-ipam&parent=10.77.s.0/24`, 1000 a page, following `next`), mapped to that slot's pool;
  claim uid = the custom field capi_claim_uid, handle = the NetBox id. A pool allocates only from its own sources,
  so an address outside every slot is never one of ours. `truth()` and `delete_behind_back()` wait (up to 5
  minutes) for NetBox to answer, e.g. during a restart.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import random
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import requests
import structlog

from backends.netbox.calls import (
    CLAIM_REF_FIELD_BODY,
    CLAIM_UID_FIELD_BODY,
    CLUSTER_IDENTITY_FIELD_BODY,
    OWNER_TAG_BODY,
)
from backends.netbox.client import ClientSettings
from backends.netbox.spec import CLAIM_UID_FIELD, NETBOX_POOL, OWNER_TAG
from benchmarks.chaos.backends import TruthRecord
from tools.netbox_proxy import Fault, NetboxProxy
from tools.netbox_sessions import netbox_session

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "hack" / "netbox"
FAULT_KINDS = ("netbox-5xx", "netbox-timeout", "netbox-lost-reply", "netbox-restart")
SECRET_NAME = "chaos-netbox"
POOL_PREFIX = "chaos-netbox-"
USERNAME = "capi-ipam-chaos"
VIEW_TYPES = ("ipam.prefix", "ipam.iprange", "ipam.vrf", "tenancy.tenant", "extras.tag", "extras.customfield")
SERVING_TIMEOUT_S = 300.0
Object = dict[str, Any]
log = structlog.get_logger(__name__)


def slot_network(slot: int) -> str:
    """The /24 that slot `slot` owns (its prefix, range and gateway)."""
    return f"10.77.{slot}.0/24"


def run_script(name: str, *args: str, timeout: float = 600.0) -> str:
    """Runs hack/netbox/<name>; raises RuntimeError with its output's tail when it fails (it never prints the
    token)."""
    done = subprocess.run([str(SCRIPTS / name), *args], capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise RuntimeError(f"hack/netbox/{name} failed with exit code {done.returncode}:\n{tail}")
    return done.stdout


def read_env_file(path: Path) -> dict[str, str]:
    """The KEY=value lines start.sh wrote."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


class NetboxApi:
    """Blocking calls to NetBox itself (never through the proxy), one at a time; run them in a thread."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        scheme = "Bearer" if token.startswith("nbt_") else "Token"
        self._headers = {"Authorization": f"{scheme} {token}", "Accept": "application/json"}
        self._session = netbox_session()
        self._lock = threading.Lock()

    def call(self, method: str, path: str, body: Object | None = None, **params: Any) -> Any:
        """`method` on /api/<path> (or a full URL); the decoded answer, None for 204 or a DELETE of what is gone."""
        url = path if path.startswith("http") else f"{self.url}/api/{path}"
        with self._lock:
            answer = self._session.request(method, url, json=body, params=params, headers=self._headers, timeout=60)
        if method == "DELETE" and answer.status_code == 404:
            return None
        if answer.status_code >= 400:  # NetBox's answer says why; it never holds the token
            raise requests.HTTPError(f"{method} {url}: {answer.status_code} {answer.text[:400]}", response=answer)
        return answer.json() if answer.content else None

    def list(self, path: str, **filters: Any) -> list[Object]:
        """Every object of the list `path` matching `filters`, page by page."""
        found: list[Object] = []
        page: Object | None = self.call("GET", path, limit=1000, **filters)
        while page is not None:
            found.extend(page["results"])
            page = self.call("GET", page["next"]) if page.get("next") else None
        return found

    def ensure(self, path: str, lookup: Object, body: Object) -> Object:
        """The object `lookup` finds in `path`, created from `body` when there is none."""
        found = self.list(path, **lookup)
        return found[0] if found else dict(self.call("POST", path, body))

    def serving(self) -> bool:
        try:
            self.call("GET", "status/")
        except requests.RequestException:
            return False
        return True

    def wait_serving(self, timeout: float = SERVING_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not self.serving():
            if time.monotonic() > deadline:
                raise RuntimeError(f"NetBox at {self.url} did not answer within {timeout:.0f} s")
            time.sleep(0.5)

    def close(self) -> None:
        self._session.close()


class NetboxChaos:
    """The NetBox `ChaosBackend` (see the module docstring)."""

    name = "netbox"

    def __init__(
        self,
        *,
        url: str | None = None,
        token: str | None = None,
        run_dir: Path | None = None,
        max_pools: int = 8,
        request_timeout: float = ClientSettings().read_timeout,
        fault_window: float = 20.0,
        workdir: Path | None = None,
    ) -> None:
        if url is None and os.environ.get("NETBOX_URL"):
            url, token = os.environ["NETBOX_URL"], os.environ.get("NETBOX_TOKEN", "")
            run_dir = Path(os.environ["NETBOX_RUN_DIR"]) if os.environ.get("NETBOX_RUN_DIR") else None
        if url is not None and not token:
            raise ValueError("a NetBox URL needs its token (NETBOX_TOKEN)")
        self._url, self._admin_token, self._run_dir = url, token or "", run_dir
        self._owned, self._workdir = url is None, workdir
        can_restart = self._owned or run_dir is not None
        self.fault_kinds: Sequence[str] = FAULT_KINDS if can_restart else FAULT_KINDS[:-1]
        self.max_pools, self.request_timeout, self.fault_window = max_pools, request_timeout, fault_window
        self.fired: Counter[str] = Counter()
        self._api: NetboxApi | None = None
        self._proxy: NetboxProxy | None = None
        self._token, self._token_id = "", 0
        self._slots: dict[str, int] = {}  # pool reference -> slot
        self._restarting = asyncio.Lock()

    # --- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._proxy is not None:
            return
        if self._owned and self._url is None:
            await asyncio.to_thread(self._start_own)
        assert self._url is not None
        self._api = NetboxApi(self._url, self._admin_token)
        await asyncio.to_thread(self._api.wait_serving)
        await asyncio.to_thread(self._prepare)
        self._proxy = NetboxProxy(self._url).__enter__()

    def _start_own(self) -> None:
        run_dir = self._workdir / "netbox" if self._workdir else Path(tempfile.mkdtemp(prefix="chaos-netbox-"))
        self._run_dir = run_dir  # from here on, stop() runs stop.sh (safe when nothing started)
        run_script("install.sh", timeout=1800)
        run_script("start.sh", str(run_dir))
        env = read_env_file(run_dir / "netbox.env")
        self._url, self._admin_token = env["NETBOX_URL"], env["NETBOX_TOKEN"]

    async def stop(self) -> None:
        if self._proxy is not None:
            self._proxy.__exit__(None, None, None)
            self._proxy = None
        if self._api is not None:
            api, self._api = self._api, None
            try:
                if self._token_id and not self._owned:  # an owned NetBox goes with its database
                    await asyncio.to_thread(api.call, "DELETE", f"users/tokens/{self._token_id}/")
            except requests.RequestException as error:
                log.warning("could not delete the chaos token in NetBox; delete it by hand", error=str(error))
            finally:
                self._token_id = 0
                api.close()
        if self._owned and self._run_dir is not None:
            await asyncio.to_thread(run_script, "stop.sh", str(self._run_dir))
            self._url, self._run_dir = None, None

    def _prepare(self) -> None:
        """Ownership marks, the pools' user and token, and every slot (see the module docstring)."""
        api = self._require_api()
        api.ensure("extras/tags/", {"slug": OWNER_TAG}, dict(OWNER_TAG_BODY))
        for body in (CLAIM_UID_FIELD_BODY, CLAIM_REF_FIELD_BODY, CLUSTER_IDENTITY_FIELD_BODY):
            api.ensure("extras/custom-fields/", {"name": body["name"]}, dict(body))
        self._prepare_token()
        for slot in range(self.max_pools):
            network = slot_network(slot)
            base = network.rsplit(".", 1)[0]
            api.ensure("ipam/prefixes/", {"prefix": f"{base}.0/27"}, {"prefix": f"{base}.0/27", "status": "active"})
            start, end = f"{base}.100/24", f"{base}.227/24"
            api.ensure("ipam/ip-ranges/", {"start_address": start}, {"start_address": start, "end_address": end})
            gateway = f"{base}.1/27"
            api.ensure("ipam/ip-addresses/", {"address": gateway}, {"address": gateway, "description": "gateway"})
            for left in api.list("ipam/ip-addresses/", tag=OWNER_TAG, parent=network):
                api.call("DELETE", f"ipam/ip-addresses/{left['id']}/")

    def _prepare_token(self) -> None:
        api = self._require_api()
        password = f"Chaos-{os.urandom(12).hex()}-1"
        user = api.ensure("users/users/", {"username": USERNAME}, {"username": USERNAME, "password": password})
        grants: list[tuple[str, Sequence[str], list[str]]] = [
            (f"{USERNAME}-view", VIEW_TYPES, ["view"]),
            (f"{USERNAME}-addresses", ("ipam.ipaddress",), ["view", "add", "change", "delete"]),
        ]
        for name, types, actions in grants:
            body = {"name": name, "object_types": list(types), "actions": actions, "users": [user["id"]]}
            api.ensure("users/permissions/", {"name": name}, body)
        made = api.call("POST", "users/tokens/", {"user": user["id"], "write_enabled": True, "version": 2})
        self._token, self._token_id = f"nbt_{made['key']}.{made['token']}", int(made["id"])

    def _require_api(self) -> NetboxApi:
        if self._api is None:
            raise RuntimeError("NetboxChaos.start() was not called")
        return self._api

    @property
    def proxy(self) -> NetboxProxy:
        """The fault proxy the pools talk to (its `url`, its request log)."""
        if self._proxy is None:
            raise RuntimeError("NetboxChaos.start() was not called")
        return self._proxy

    # --- pools ----------------------------------------------------------------------------------------------

    def pool_refs(self, namespace: str, count: int) -> list[str]:
        refs = [f"{NETBOX_POOL.kind}/{namespace}/{POOL_PREFIX}{index}" for index in range(count)]
        for ref in refs:
            if ref not in self._slots:
                if len(self._slots) >= self.max_pools:
                    raise ValueError(f"NetboxChaos prepared {self.max_pools} pool slots; {ref} needs one more")
                self._slots[ref] = len(self._slots)
        return refs

    def manifests(self, namespace: str, count: int) -> list[Object]:
        proxy = self.proxy
        secret: Object = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET_NAME, "namespace": namespace},
            "type": "Opaque",
            "stringData": {"url": proxy.url, "token": self._token},
        }
        return [secret, *(self._pool(ref) for ref in self.pool_refs(namespace, count))]

    def _pool(self, ref: str) -> Object:
        _, namespace, name = ref.split("/")
        base = slot_network(self._slots[ref]).rsplit(".", 1)[0]
        gateway = f"{base}.1"
        sources = [
            {"prefix": {"cidr": f"{base}.0/27"}, "gateway": gateway},
            {"ipRange": {"start": f"{base}.100", "end": f"{base}.227"}, "gateway": gateway, "prefixLength": 24},
        ]
        return {
            "apiVersion": NETBOX_POOL.api_version,
            "kind": NETBOX_POOL.kind,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"connection": {"secretRef": {"name": SECRET_NAME}}, "sources": sources},
        }

    # --- faults ---------------------------------------------------------------------------------------------

    async def inject(self, kind: str, rng: random.Random) -> None:
        if kind not in self.fault_kinds:
            raise ValueError(f"unknown NetBox fault kind {kind!r}; expected one of {', '.join(self.fault_kinds)}")
        proxy, window = self.proxy, self.fault_window
        if kind == "netbox-5xx":
            fired = await self._fire(proxy.answer_next(rng.choice((502, 503)), count=rng.randint(3, 10)), window)
        elif kind == "netbox-timeout":
            delay = self.request_timeout + 3.0
            fired = await self._fire(proxy.delay_next(None, "/api/", delay, before=rng.random() < 0.5), window)
        elif kind == "netbox-lost-reply":
            method = "POST" if rng.random() < 2 / 3 else "DELETE"
            fired = await self._fire(proxy.lose_next(method, "/api/ipam/"), window / 2)
            fired = fired or await self._fire(proxy.lose_next(None, "/api/"), window / 2)
        else:
            await self._restart(kill=rng.random() < 0.5)
            fired = True
        if fired:
            self.fired[kind] += 1
        else:
            log.warning("fault met no request", kind=kind, window=window)

    async def _fire(self, fault: Fault, window: float) -> bool:
        """Waits until `fault` met every request it was queued for or `window` seconds passed, then takes back what
        is left of it; answers whether it met at least one request."""
        proxy = self.proxy
        uses = proxy.pending(fault)
        deadline = time.monotonic() + window
        while time.monotonic() < deadline:  # the proxy's threads take the fault: poll, there is nothing to await
            if proxy.pending(fault) == 0:
                break
            await asyncio.sleep(0.1)
        return proxy.withdraw(fault) < uses

    async def _restart(self, *, kill: bool) -> None:
        """Stops NetBox's web server and starts it again on the same port and database (web.sh)."""
        if self._run_dir is None:
            raise RuntimeError("restarting NetBox needs its run dir (hack/netbox/start.sh)")
        async with self._restarting:
            await asyncio.to_thread(run_script, "web.sh", "kill" if kill else "stop", str(self._run_dir))
            await asyncio.to_thread(run_script, "web.sh", "start", str(self._run_dir))

    # --- the truth ------------------------------------------------------------------------------------------

    async def delete_behind_back(self, rng: random.Random) -> str:
        records = await self.truth()
        if not records:
            return ""
        record = rng.choice(records)
        await asyncio.to_thread(self._require_api().call, "DELETE", f"ipam/ip-addresses/{record.handle}/")
        return f"NetBox IP address #{record.handle} {record.address} of {record.pool}"

    async def truth(self) -> list[TruthRecord]:
        return await asyncio.to_thread(self._truth)

    def _truth(self) -> list[TruthRecord]:
        api = self._require_api()
        api.wait_serving()
        records: list[TruthRecord] = []
        for pool, slot in sorted(self._slots.items(), key=lambda item: item[1]):
            for obj in api.list("ipam/ip-addresses/", tag=OWNER_TAG, parent=slot_network(slot)):
                address = str(ipaddress.ip_interface(obj["address"]).ip)
                uid = str((obj.get("custom_fields") or {}).get(CLAIM_UID_FIELD) or "")
                records.append(TruthRecord(pool, address, uid, str(obj["id"])))
        return records
