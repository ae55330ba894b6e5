"""100 claims created at once on one NetboxIPPool: every one fulfilled, no address twice, exactly one NetBox
address per claim; and all of them released again, leaving nothing of ours in NetBox (real API server, controller
and NetBox)."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import TYPE_CHECKING, Any

from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.cluster import wait_for
from tests.support.netbox_backend import (
    NB_POOLS,
    claim_uid_of,
    create_secret,
    nb_claim,
    netbox_pool,
    owned_addresses,
    prefix,
)

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer

CLAIM_COUNT = 100


async def test_hundred_concurrent_claims_all_unique(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Any
) -> None:
    netbox.create_prefix("10.70.0.0/24")
    netbox.api().ipam.ip_addresses.create(address="10.70.0.1/24", description="gateway, by hand")
    await create_secret(kube, namespace, netbox)
    await kube.create(NB_POOLS, netbox_pool("many", [prefix("10.70.0.0/24", gateway="10.70.0.1")]), namespace)
    names = [f"m-{i:03d}" for i in range(CLAIM_COUNT)]
    async with netbox_controller():
        started = time.monotonic()
        semaphore = asyncio.Semaphore(25)

        async def create(name: str) -> None:
            async with semaphore:
                await kube.create(CLAIMS, nb_claim(name, "many"), namespace)

        await asyncio.gather(*(create(n) for n in names))

        async def all_fulfilled() -> list[dict[str, Any]] | None:
            items, _ = await kube.list(ADDRESSES, namespace)
            return items if len(items) == CLAIM_COUNT else None

        addresses = await wait_for(all_fulfilled, timeout=240, message=f"{CLAIM_COUNT} IPAddresses")
        elapsed = time.monotonic() - started
        print(f"\n{CLAIM_COUNT} claims fulfilled from NetBox in {elapsed:.1f} s")
        values = [a["spec"]["address"] for a in addresses]
        duplicates = [a for a, n in collections.Counter(values).items() if n > 1]
        assert not duplicates, f"handed out twice: {duplicates}"
        assert "10.70.0.1" not in values
        claims = {c["metadata"]["name"]: c["metadata"]["uid"] for c in (await kube.list(CLAIMS, namespace))[0]}
        ours = owned_addresses(netbox, parent="10.70.0.0/24")
        assert len(ours) == CLAIM_COUNT, "a claim holds more than one NetBox address, or one leaked"
        in_netbox = {claim_uid_of(r): str(r.address).split("/")[0] for r in ours}
        assert in_netbox == {claims[a["spec"]["claimRef"]["name"]]: a["spec"]["address"] for a in addresses}

        await asyncio.gather(*(kube.delete(CLAIMS, n, namespace) for n in names))

        async def all_released() -> bool:
            claims_left, _ = await kube.list(CLAIMS, namespace)
            return not claims_left and not owned_addresses(netbox, parent="10.70.0.0/24")

        await wait_for(all_released, timeout=240, interval=1.0, message="every claim released in NetBox")
    assert [r.description for r in netbox.api().ipam.ip_addresses.filter(parent="10.70.0.0/24")] == ["gateway, by hand"]
