"""The cost of one repair pass's listing on NetBox: requests and seconds of `NetboxBackend.list_holdings` for N
addresses of ours in one pool, paced (the default 20 requests/s of `--repair-requests-per-second`) and unpaced.

For each N, the run creates a prefix just large enough and N IP addresses in it carrying both ownership marks,
with NetBox's bulk POST (500 per request, 4 at a time), then lists them: once to warm up, then unpaced, then paced. For
comparison it also pages the same addresses by `offset` (what a NetBox without cursor pagination answers), unpaced.
Requests are counted on the backend's client (`NetboxClient.requests_sent`).

Expected: pages = floor(N / page size) + 1 per VRF of the pool (cursor pagination; the last page is empty when N is
a multiple of the page size), and, paced, seconds >= (pages - 1) / rate (the first page goes at once), or the sum
of NetBox's answer times when that is longer.

NetBox: NETBOX_URL and NETBOX_TOKEN name a running one (the run adds prefixes 10.x.0.0/… that hold nothing yet
and deletes afterwards exactly the addresses and prefixes it created); otherwise one is started in a temporary
directory and stopped at the end.

Run from the repository root: `.venv/bin/python benchmarks/netbox_repair_cost.py [--sizes 1000,10000] [--rate 20]`.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import itertools
import math
import random
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pynetbox
import structlog

from backends.netbox import NetboxBackend, NetboxSettings, calls
from backends.netbox.repair import HOLDING_FIELDS
from backends.netbox.spec import CLAIM_REF_FIELD, CLAIM_UID_FIELD, OWNER_TAG
from benchmarks.netbox_throughput import SecretsOnly, netbox_instance, pool
from ipam_provider.backend.contract import BackendContext, PoolRef
from ipam_provider.repair.pacer import CountingPacer, RatePacer
from ipam_provider.runtime.kube.client import KubeClient

BULK = 500  # addresses per bulk POST
CREATORS = 4  # bulk POSTs at a time


@dataclass
class Row:
    addresses: int
    listed: int
    pages: int
    unpaced_seconds: float
    paced_seconds: float
    offset_pages: int
    offset_seconds: float


def free_prefix(api: Any, size: int) -> str:
    """A 10.x.0.0/len prefix with room for `size` addresses, of which NetBox holds nothing yet."""
    length = 32 - math.ceil(math.log2(size + 2))
    for _ in range(50):
        cidr = f"10.{random.randint(160, 250)}.0.0/{length}"
        if not api.ipam.prefixes.count(within_include=cidr) and not api.ipam.ip_addresses.count(parent=cidr):
            return cidr
    raise SystemExit(f"found no free /{length} under 10.160.0.0/11 in NetBox for the benchmark")


def create_marked(url: str, token: str, cidr: str, count: int) -> list[int]:
    """`count` IP addresses of ours in `cidr`, bulk-created (BULK per POST, CREATORS POSTs at a time); their ids."""
    api = pynetbox.api(url, token=token)
    tag = api.extras.tags.get(slug=OWNER_TAG)
    length = cidr.split("/")[1]
    hosts = list(itertools.islice(ipaddress.ip_network(cidr).hosts(), count))
    chunks = [hosts[start : start + BULK] for start in range(0, count, BULK)]

    def post(chunk: list[Any]) -> list[int]:
        body = []
        for host in chunk:
            uid = str(uuid.uuid4())
            custom = {CLAIM_UID_FIELD: uid, CLAIM_REF_FIELD: f"bench/claim-{uid[:8]}"}
            body.append({"address": f"{host}/{length}", "tags": [{"id": tag.id}], "custom_fields": custom})
        return [int(record.id) for record in pynetbox.api(url, token=token).ipam.ip_addresses.create(body)]

    with ThreadPoolExecutor(max_workers=CREATORS) as pool_:
        return [address_id for ids in pool_.map(post, chunks) for address_id in ids]


def delete_ids(api: Any, ids: list[int]) -> None:
    for start in range(0, len(ids), BULK):
        api.ipam.ip_addresses.delete(ids[start : start + BULK])


async def offset_listing(backend: NetboxBackend, body: dict[str, Any], cidr: str, size: int) -> int:
    """Pages the same addresses by `offset` (unpaced): the number of requests."""
    client = await backend.resolver.connections.client(backend.resolver.parse(PoolRef.from_object(body), body))
    filters = {"tag": OWNER_TAG, f"cf_{CLAIM_UID_FIELD}__empty": "false", "parent": [cidr], "vrf_id": "null"}
    filters["fields"] = HOLDING_FIELDS
    offset, pages = 0, 0
    while True:
        page = {"limit": size, "offset": offset}
        answer = await client.call("list", calls.list_page("ipam", "ip_addresses", filters, page))
        pages += 1
        offset += len(answer["results"])
        if not answer.get("next") or not answer["results"]:
            return pages


async def measure(url: str, token: str, count: int, rate: float, page_size: int) -> Row:
    api = pynetbox.api(url, token=token)
    settings = NetboxSettings(repair_page_size=page_size)
    backend = NetboxBackend(BackendContext(kube=cast(KubeClient, SecretsOnly(url, token))), settings)
    prefix: Any = None
    ids: list[int] = []
    try:
        cidr = free_prefix(api, count)
        prefix = api.ipam.prefixes.create(prefix=cidr, description="netbox_repair_cost benchmark")
        body = pool(f"repair-{count}", cidr)
        body["metadata"]["uid"] = str(uuid.uuid4())
        ref = PoolRef.from_object(body)
        await backend.report(ref, body, [])  # the ownership marks, and the pool's sources (cached)
        started = time.monotonic()
        ids = create_marked(url, token, cidr, count)
        print(f"{count} marked addresses created in {time.monotonic() - started:.1f} s", flush=True)
        await backend.list_holdings(ref, body, CountingPacer())  # warm-up
        client = await backend.resolver.connections.client(backend.resolver.parse(ref, body))
        figures = []
        for pacer in (CountingPacer(), RatePacer(rate)):
            sent, started = client.requests_sent, time.monotonic()
            holdings = await backend.list_holdings(ref, body, pacer)
            figures.append((len(holdings), client.requests_sent - sent, time.monotonic() - started))
        started = time.monotonic()
        offset_pages = await offset_listing(backend, body, cidr, page_size)
        offset_seconds = time.monotonic() - started
        (listed, pages, unpaced), (_, _, paced) = figures
        row = Row(count, listed, pages, unpaced, paced, offset_pages, offset_seconds)
        print(row, flush=True)  # before the clean-up, which takes as long as the creation
        return row
    finally:
        delete_ids(api, ids)
        if prefix is not None:
            prefix.delete()
        await backend.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000", help="comma-separated numbers of marked addresses")
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second of the paced listing")
    parser.add_argument("--page-size", type=int, default=NetboxSettings().repair_page_size)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with netbox_instance() as (url, token, _):
        for size in sizes:
            rows.append(asyncio.run(measure(url, token, size, args.rate, args.page_size)))
    print(f"\npage size {args.page_size}, paced at {args.rate:g} requests/s\n")
    print("| N addresses | listed | requests (pages) | unpaced s | paced s | pages / rate s | by offset: requests, s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [r.addresses, r.listed, r.pages, f"{r.unpaced_seconds:.2f}", f"{r.paced_seconds:.2f}"]
        cells += [f"{r.pages / args.rate:.2f}", f"{r.offset_pages}, {r.offset_seconds:.2f}"]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
