"""The chaos run's Infoblox: the WAPI simulator (tools/wapi_simulator), with TLS and credentials, serving from the
runner's own process; pools pointing at it; faults injected through its fault rules; the truth read from its
store.

Contract (the `ChaosBackend` of benchmarks/chaos/backends.py, plus what is said here):
- `start()` starts a simulator (TLS with a throwaway CA, random credentials, WAPI 2.12) on a free 127.0.0.1 port in
  this process, with the CAPI-* extensible attribute definitions, and `max_pools` slots. Slot s holds the network
  10.78.s.0/27 (gateway 10.78.s.1, held on the grid by a fixed address that is not ours, so the grid never hands
  it out) and the network 10.78.s.128/25 with the DHCP range 10.78.s.130-10.78.s.250 (gateway 10.78.s.129,
  outside the range): a pool fills its subnet first, then its range. `stop()` stops the simulator.
- `manifests(namespace, count)`: the Secret `chaos-infoblox` (basic auth), the cluster-scoped InfobloxInstance
  `chaos-infoblox-<namespace>` naming it (the simulator's CA inline as caBundle), and InfobloxIPPools
  `chaos-infoblox-<i>` in fixedAddress mode, each on its own slot (handed out in order of first use, across
  namespaces; more pools than `max_pools` raise ValueError).
- Faults go through the simulator's fault rules (tools/wapi_simulator/faults.py), each ending by itself (a rule
  that has not fired fully within `fault_window` seconds is removed): `wapi-503` answers the next 3-10 requests
  503 unhandled; `wapi-dropped` closes the connection of the next 1-3 requests unhandled and unanswered;
  `wapi-lost-reply` carries out the next successful POST or DELETE (or, when none came within half the window, the
  next successful request of any kind), then closes the connection unanswered.
  `fired` counts the faults that met a request, by kind.
- `truth()`: every fixedaddress, ipv6fixedaddress and record:host in the simulator's store whose extensible
  attribute CAPI-Claim-UID is set and whose CAPI-Pool (`<namespace>/<name>`) names one of the harness's pools,
  mapped to that pool; handle = the object's reference. Objects with CAPI-Pool only (a gateway reservation of the
  backend's own, never made here since every gateway is held) are not claims' and are left out.
  `delete_behind_back()` deletes one of those directly in the store, as an administrator would.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import random
import secrets
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import structlog

from backends.infoblox.spec import EA_CLAIM_UID, EA_POOL, INFOBLOX_POOL, INSTANCES, OPTIONAL_EAS, OWNERSHIP_EAS
from benchmarks.chaos.backends import TruthRecord
from tools.wapi_simulator import FaultRule, WapiSimulator

FAULT_KINDS = ("wapi-503", "wapi-dropped", "wapi-lost-reply")
SECRET_NAME = "chaos-infoblox"
INSTANCE_PREFIX = "chaos-infoblox-"
POOL_PREFIX = "chaos-infoblox-"
OBJECT_TYPES = ("fixedaddress", "ipv6fixedaddress", "record:host")
Object = dict[str, Any]
log = structlog.get_logger(__name__)


def slot_base(slot: int) -> str:
    """The first three octets of slot `slot`'s addresses."""
    return f"10.78.{slot}"


def ea(obj: Object, name: str) -> str:
    """The value of one extensible attribute of a rendered object ("" when unset)."""
    return str(((obj.get("extattrs") or {}).get(name) or {}).get("value") or "")


def address_of(obj: Object) -> str:
    """The address a fixedaddress, ipv6fixedaddress or record:host holds (a host record's first)."""
    for field in ("ipv4addr", "ipv6addr"):
        if obj.get(field):
            return str(ipaddress.ip_address(obj[field]))
    for field, key in (("ipv4addrs", "ipv4addr"), ("ipv6addrs", "ipv6addr")):
        for entry in obj.get(field) or []:
            return str(ipaddress.ip_address(entry[key]))
    return ""


class InfobloxChaos:
    """The Infoblox `ChaosBackend` (see the module docstring)."""

    name = "infoblox"
    fault_kinds: Sequence[str] = FAULT_KINDS

    def __init__(self, *, max_pools: int = 8, fault_window: float = 20.0, seed: int = 0) -> None:
        self.max_pools, self.fault_window, self.seed = max_pools, fault_window, seed
        self.fired: Counter[str] = Counter()
        self._sim: WapiSimulator | None = None
        self._slots: dict[str, int] = {}  # pool reference -> slot

    # --- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._sim is not None:
            return
        sim = WapiSimulator(password=secrets.token_urlsafe(18), seed=self.seed).start()
        for name in (*OWNERSHIP_EAS, *OPTIONAL_EAS):
            sim.state.add_ea_definition(name)
        for slot in range(self.max_pools):
            base = slot_base(slot)
            sim.state.add_network(f"{base}.0/27")
            sim.state.add_fixed_address(f"{base}.1", comment="gateway")
            sim.state.add_network(f"{base}.128/25")
            sim.state.add_range(f"{base}.130", f"{base}.250")
        self._sim = sim

    async def stop(self) -> None:
        if self._sim is not None:
            sim, self._sim = self._sim, None
            await asyncio.to_thread(sim.stop)

    @property
    def simulator(self) -> WapiSimulator:
        """The running simulator (its state, fault rules and request log)."""
        if self._sim is None:
            raise RuntimeError("InfobloxChaos.start() was not called")
        return self._sim

    # --- pools ----------------------------------------------------------------------------------------------

    def pool_refs(self, namespace: str, count: int) -> list[str]:
        refs = [f"{INFOBLOX_POOL.kind}/{namespace}/{POOL_PREFIX}{index}" for index in range(count)]
        for ref in refs:
            if ref not in self._slots:
                if len(self._slots) >= self.max_pools:
                    raise ValueError(f"InfobloxChaos prepared {self.max_pools} pool slots; {ref} needs one more")
                self._slots[ref] = len(self._slots)
        return refs

    def manifests(self, namespace: str, count: int) -> list[Object]:
        sim = self.simulator
        assert sim.ca_path is not None  # the simulator always serves TLS here
        credentials = {"username": sim.username, "password": sim.password}
        secret: Object = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET_NAME, "namespace": namespace},
            "type": "kubernetes.io/basic-auth",
            "data": {key: base64.b64encode(value.encode()).decode() for key, value in credentials.items()},
        }
        instance: Object = {
            "apiVersion": INSTANCES.api_version,
            "kind": INSTANCES.kind,
            "metadata": {"name": INSTANCE_PREFIX + namespace},
            "spec": {
                "host": sim.host,
                "port": sim.port,
                "wapiVersion": sim.wapi_version,
                "credentialsSecretRef": {"name": SECRET_NAME, "namespace": namespace},
                "caBundle": sim.ca_path.read_text(),
                "allowedNamespaces": {"list": [namespace]},
            },
        }
        return [secret, instance, *(self._pool(ref) for ref in self.pool_refs(namespace, count))]

    def _pool(self, ref: str) -> Object:
        _, namespace, name = ref.split("/")
        base = slot_base(self._slots[ref])
        return {
            "apiVersion": INFOBLOX_POOL.api_version,
            "kind": INFOBLOX_POOL.kind,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "instanceRef": {"name": INSTANCE_PREFIX + namespace},
                "subnets": [{"cidr": f"{base}.0/27", "gateway": f"{base}.1"}],
                "ranges": [{"start": f"{base}.130", "end": f"{base}.250", "prefix": 25, "gateway": f"{base}.129"}],
                "mode": "fixedAddress",
            },
        }

    # --- faults ---------------------------------------------------------------------------------------------

    async def inject(self, kind: str, rng: random.Random) -> None:
        if kind not in self.fault_kinds:
            raise ValueError(f"unknown Infoblox fault kind {kind!r}; expected one of {', '.join(self.fault_kinds)}")
        faults, window = self.simulator.faults, self.fault_window
        if kind == "wapi-503":
            fired = await self._fire(faults.fail_next(rng.randint(3, 10)), window)
        elif kind == "wapi-dropped":
            fired = await self._fire(faults.drop_next(rng.randint(1, 3)), window)
        else:
            fired = await self._fire(faults.drop_reply_after_commit(1, methods=["POST", "DELETE"]), window / 2)
            fired = fired or await self._fire(faults.drop_reply_after_commit(1), window / 2)
        if fired:
            self.fired[kind] += 1
        else:
            log.warning("fault met no request", kind=kind, window=window)

    async def _fire(self, rule: FaultRule, window: float) -> bool:
        """Waits until `rule` fired fully or `window` seconds passed, then removes it; answers whether it fired."""
        deadline = time.monotonic() + window
        while time.monotonic() < deadline:  # the simulator's threads fire the rule: poll, there is nothing to await
            if rule.count is not None and rule.fired >= rule.count:
                break
            await asyncio.sleep(0.1)
        self.simulator.faults.remove(rule)
        return rule.fired > 0

    # --- the truth ------------------------------------------------------------------------------------------

    async def delete_behind_back(self, rng: random.Random) -> str:
        records = await self.truth()
        if not records:
            return ""
        record = rng.choice(records)
        await asyncio.to_thread(self.simulator.state.delete, record.handle)
        return f"Infoblox object {record.handle} ({record.address}) of {record.pool}"

    async def truth(self) -> list[TruthRecord]:
        return await asyncio.to_thread(self._truth)

    def _truth(self) -> list[TruthRecord]:
        pools = {"/".join(ref.split("/")[1:]): ref for ref in self._slots}  # the CAPI-Pool value -> the reference
        records: list[TruthRecord] = []
        for obj_type in OBJECT_TYPES:
            for obj in self.simulator.state.objects(obj_type):
                pool, uid = pools.get(ea(obj, EA_POOL)), ea(obj, EA_CLAIM_UID)
                if pool is not None and uid:
                    records.append(TruthRecord(pool, address_of(obj), uid, str(obj["_ref"])))
        return records
