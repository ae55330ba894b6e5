"""What the chaos runner needs from each backend it exercises (in-cluster, NetBox, Infoblox).

Contract of a `ChaosBackend`:
- `start()` starts the backend's external system (and any fault proxy in front of it) and `stop()` stops it; the
  in-cluster backend has none. Both are idempotent.
- `manifests(namespace, count)` answers the objects to apply for `count` pools of the backend in `namespace`
  (Secrets first, then pools), each pool pointing at the fault proxy rather than the system itself, and
  `pool_refs(namespace, count)` the pools' references as `Kind/namespace/name` (the `TruthRecord.pool` form).
- `fault_kinds` are the backend's own fault kinds (for example `netbox-5xx`); `inject(kind, rng)` injects one
  fault of that kind at once (it may last a few seconds, and must end by itself).
- `delete_behind_back(rng)` deletes one object the backend holds under the controller's mark directly in the
  external system (or the reservation, in-cluster), as an operator might; answers what it deleted ("" if nothing).
- `truth()` reads every object the backend holds under the controller's mark, fresh from the system itself (never
  through the fault proxy), as `TruthRecord`s.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class TruthRecord:
    """One allocation in the backend's own record: its pool (`Kind/namespace/name`, `Kind/name` for a
    cluster-scoped pool), address (canonical text), the claim uid recorded with it, and the record's handle."""

    pool: str
    address: str
    claim_uid: str
    handle: str


class ChaosBackend(Protocol):
    name: str
    fault_kinds: Sequence[str]

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def manifests(self, namespace: str, count: int) -> list[dict[str, Any]]: ...

    def pool_refs(self, namespace: str, count: int) -> list[str]: ...

    async def inject(self, kind: str, rng: random.Random) -> None: ...

    async def delete_behind_back(self, rng: random.Random) -> str: ...

    async def truth(self) -> list[TruthRecord]: ...
