"""What the NetBox backend keeps per pool and per claim belongs to one pool object and one address (no NetBox: the
client is a stand-in that answers the few calls these paths make)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import pytest

from backends.netbox import resolver as resolver_module
from backends.netbox.allocator import Allocator
from backends.netbox.ledger import Ledger
from backends.netbox.repair import NetboxRepair
from backends.netbox.resolver import Resolver
from backends.netbox.spec import CLAIM_REF_FIELD, CLAIM_UID_FIELD, OWNER_TAG, parse_pool
from ipam_provider.backend.contract import PoolRef
from ipam_provider.backend.repair import Holding
from tests.support.netbox_backend import pool_of, prefix

Object = dict[str, Any]


class StandIn:
    """A NetBox client for these paths: a GET by id answers `objects`, a delete answers True."""

    closed = False
    ownership: tuple[float, object] | None = None
    endpoint = SimpleNamespace(url="https://netbox.invalid")

    def __init__(self, objects: dict[int, Object] | None = None) -> None:
        self.objects = objects or {}

    async def call(self, what: str, fn: Callable[..., Any], *, idempotent: bool = True) -> Any:
        if what.startswith("GET address #"):
            return self.objects.get(int(what.removeprefix("GET address #")))
        assert what.startswith("delete address #"), what
        return True


async def test_a_pool_recreated_under_its_name_resolves_its_own_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[object] = []

    async def resolve_pool(client: Any, pool: Any, ownership: Any) -> object:
        answers.append(object())  # each resolution its own ids
        return answers[-1]

    async def ensure_ownership(client: Any) -> object:
        return object()

    monkeypatch.setattr(resolver_module, "resolve_pool", resolve_pool)
    monkeypatch.setattr(resolver_module, "ensure_ownership", ensure_ownership)
    resolver = Resolver(connections=None, ownership_seconds=60.0)  # type: ignore[arg-type]
    client: Any = StandIn()
    old = pool_of("ns", "zone-a", [prefix("10.0.0.0/24")])
    new = pool_of("ns", "zone-a", [prefix("10.0.1.0/24")])  # deleted and created again: generation 1 again
    ref = PoolRef.from_object(old)

    old_ids = await resolver.resolve(client, parse_pool(ref, old))
    assert await resolver.resolve(client, parse_pool(ref, old)) is old_ids, "cached for the same pool object"
    new_ids = await resolver.resolve(client, parse_pool(ref, new))

    assert new_ids is not old_ids, "the new pool must not allocate from the old pool's sources"
    assert len(answers) == 2


def leaked(uid: str, address_id: int, address: str) -> Object:
    custom = {CLAIM_UID_FIELD: uid, CLAIM_REF_FIELD: "ns/machine-0"}
    return {"id": address_id, "address": f"{address}/24", "tags": [{"slug": OWNER_TAG}], "custom_fields": custom}


def repair_with(ledger: Ledger, client: Any, pool: Object) -> NetboxRepair:
    resolver = Resolver(connections=None, ownership_seconds=60.0)  # type: ignore[arg-type]
    repair = NetboxRepair(resolver, ledger, Allocator.__new__(Allocator), page_size=50)

    @contextlib.asynccontextmanager
    async def lend(pool_ref: PoolRef, _pool: Object, doing: str, **_: Any) -> AsyncIterator[tuple[Any, Any]]:
        yield parse_pool(pool_ref, pool), client

    repair._netbox = lend  # type: ignore[method-assign,assignment]
    return repair


async def test_releasing_a_live_claims_other_address_keeps_what_it_holds() -> None:
    pool = pool_of("ns", "zone-a", [prefix("10.0.0.0/24")])
    ref = PoolRef.from_object(pool)
    uid = str(uuid.uuid4())
    ledger = Ledger()
    ledger.hold(ref, uid, 7, "10.0.0.7")  # the live claim holds #7; #9 is a second address of it (a suspect)
    repair = repair_with(ledger, StandIn({9: leaked(uid, 9, "10.0.0.9")}), pool)

    holding = Holding(address="10.0.0.9", claim="ns/machine-0", claim_uid=uid, handle="9")
    assert await repair.release_holding(ref, pool, holding) is True

    assert ledger.index(ref).by_claim == {uid: (7, "10.0.0.7")}, "the claim still holds #7: no second POST for it"


async def test_releasing_a_lost_posts_address_keeps_the_claim_looking_it_up() -> None:
    pool = pool_of("ns", "zone-a", [prefix("10.0.0.0/24")])
    ref = PoolRef.from_object(pool)
    uid = str(uuid.uuid4())
    ledger = Ledger()
    ledger.hold(ref, uid, 7, "10.0.0.7")
    ledger.index(ref).uncertain[uid] = 1.0  # a later POST of the claim's, outcome unknown
    repair = repair_with(ledger, StandIn({9: leaked(uid, 9, "10.0.0.9")}), pool)

    holding = Holding(address="10.0.0.9", claim="ns/machine-0", claim_uid=uid, handle="9")
    assert await repair.release_holding(ref, pool, holding) is True

    assert uid in ledger.index(ref).uncertain, "the claim's next attempt still looks its address up before a POST"


async def test_releasing_the_address_a_claim_is_remembered_holding_forgets_it() -> None:
    pool = pool_of("ns", "zone-a", [prefix("10.0.0.0/24")])
    ref = PoolRef.from_object(pool)
    uid = str(uuid.uuid4())
    ledger = Ledger()
    ledger.hold(ref, uid, 9, "10.0.0.9")
    repair = repair_with(ledger, StandIn({9: leaked(uid, 9, "10.0.0.9")}), pool)

    holding = Holding(address="10.0.0.9", claim="ns/machine-0", claim_uid=uid, handle="9")
    assert await repair.release_holding(ref, pool, holding) is True

    assert ledger.index(ref).by_claim == {}
