"""The {machine} of a NetBox pool's templates is the Machine that owns the claim, read and its uid checked (on an
in-memory API server, without NetBox): a claim cannot stamp a name it merely supplies.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from backends.netbox import NetboxBackend
from backends.netbox.spec import render
from ipam_provider.api.capi import MACHINES
from ipam_provider.backend.contract import AllocationFailedError, BackendContext, ClaimContext, PoolRef
from tests.support.fake_kube import FakeKube
from tests.support.netbox_backend import fast_settings, pool_of, prefix

Object = dict[str, Any]
TEMPLATES = {"dnsName": "{machine}.nodes.example.com"}


def machine_ref(name: str, uid: str) -> Object:
    return {"apiVersion": MACHINES.api_version, "kind": "Machine", "name": name, "uid": uid, "controller": True}


def claim_owned_by(*owners: Object) -> ClaimContext:
    return ClaimContext("team-a", "c", str(uuid.uuid4()), owner_references=owners)


@pytest.fixture
def kube() -> FakeKube:
    kube = FakeKube()
    kube.put(MACHINES, {"metadata": {"name": "md-0-abc", "namespace": "team-a", "uid": "machine-uid"}})
    return kube


async def test_the_machine_name_is_the_machine_read(kube: FakeKube) -> None:
    backend = NetboxBackend(BackendContext(kube), fast_settings())
    pool = backend.resolver.parse(
        PoolRef.from_object(body := pool_of("team-a", "p", [prefix("10.0.0.0/24")], addressFields=TEMPLATES)), body
    )
    seen = await backend._machine_read(pool, claim_owned_by(machine_ref("md-0-abc", "machine-uid")))
    assert render(TEMPLATES["dnsName"], seen) == "md-0-abc.nodes.example.com"
    await backend.close()


@pytest.mark.parametrize(
    "owner",
    [
        machine_ref("the-victims-name", "any-uid"),  # no such Machine
        machine_ref("md-0-abc", "another-uid"),  # the Machine, but not the one the reference names
    ],
)
async def test_a_claim_cannot_stamp_a_machine_name_it_supplies(kube: FakeKube, owner: Object) -> None:
    backend = NetboxBackend(BackendContext(kube), fast_settings())
    body = pool_of("team-a", "p", [prefix("10.0.0.0/24")], addressFields=TEMPLATES)
    try:
        with pytest.raises(AllocationFailedError, match="Machine") as refused:
            await backend.allocate(PoolRef.from_object(body), body, claim_owned_by(owner))
        assert "{machine}" in str(refused.value)
    finally:
        await backend.close()
