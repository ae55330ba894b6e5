"""`ipam-provider status [claims|pools] [-o table|json]`: what the controller did, read from the API server.

The claims view lists every IPAddressClaim with its pool, address and Ready reason; the pools view every pool of
the installed backends' kinds with its Ready condition, `status.ipAddresses` counts and waiting claims (a kind
whose CRD is missing or may not be listed is skipped, with a note on stderr). `-o json`'s field names are stable:
- `{"claims": [{"namespace", "name", "pool": {"apiGroup", "kind", "name"}, "address" ("10.0.0.1/24" or null),
  "ready" (true, false, or null: absent or Unknown), "reason"}]}`
- `{"pools": [{"apiGroup", "kind", "namespace" ("": cluster-scoped), "name", "ready", "reason", "total", "used",
  "free", "outOfRange" (null: not reported), "waiting"}], "skipped": [{"apiGroup", "kind", "reason"}]}`
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from ipam_provider.api.capi import ADDRESSES, CLAIMS, names_pool
from ipam_provider.backend.contract import STATUS_COUNTS_FIELD, BackendContext, PoolKind
from ipam_provider.backend.registry import load_registry
from ipam_provider.common import Object
from ipam_provider.reconcile.context import pool_resource
from ipam_provider.runtime.flagforms import split_list
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError

CLAIM_COLUMNS: tuple[str, ...] = ("NAMESPACE", "CLAIM", "POOL", "ADDRESS", "READY")
POOL_COLUMNS: tuple[str, ...] = ("KIND", "NAMESPACE", "NAME", "READY", "REASON", "TOTAL", "USED", "FREE", "WAITING")


async def status(args: argparse.Namespace) -> int:
    """Print the view `args` asks for; 0 on success."""
    kube = await KubeClient.from_kubeconfig(args.kubeconfig)
    try:
        namespaces: list[str | None] = [*split_list(args.namespace)] or [None]
        if args.pools or args.view == "pools":
            registry = load_registry(BackendContext(kube=kube))
            try:
                pools, skipped = await pool_rows(kube, registry.kinds, namespaces)
            finally:
                await registry.close()
            for entry in skipped:
                print(f"note: {entry['kind']}.{entry['apiGroup']} skipped: {entry['reason']}", file=sys.stderr)
            document, table = {"pools": pools, "skipped": skipped}, (POOL_COLUMNS, [_pool_cells(r) for r in pools])
        else:
            claims = await claim_rows(kube, namespaces)
            document, table = {"claims": claims}, (CLAIM_COLUMNS, [_claim_cells(row) for row in claims])
    finally:
        await kube.close()
    if args.output == "json":
        print(json.dumps(document, indent=2, sort_keys=False))
    else:
        _print_table(*table)
    return 0


async def claim_rows(kube: KubeClient, namespaces: Sequence[str | None]) -> list[Object]:
    """The claims view's JSON rows: every claim of `namespaces` (None: all namespaces)."""
    rows: list[Object] = []
    for namespace in namespaces:
        claims, _ = await kube.list(CLAIMS, namespace)
        addresses, _ = await kube.list(ADDRESSES, namespace)
        by_name = {(a["metadata"]["namespace"], a["metadata"]["name"]): a for a in addresses}
        for claim in claims:
            meta = claim["metadata"]
            ref = ((claim.get("status") or {}).get("addressRef") or {}).get("name")
            address = by_name.get((meta["namespace"], ref)) if ref else None
            pool = claim["spec"]["poolRef"]
            ready, reason = _ready(claim)
            rows.append(
                {
                    "namespace": meta["namespace"],
                    "name": meta["name"],
                    "pool": {"apiGroup": pool.get("apiGroup", ""), "kind": pool["kind"], "name": pool["name"]},
                    "address": f"{address['spec']['address']}/{address['spec']['prefix']}" if address else None,
                    "ready": ready,
                    "reason": reason,
                }
            )
    return rows


async def pool_rows(
    kube: KubeClient, kinds: Iterable[PoolKind], namespaces: Sequence[str | None]
) -> tuple[list[Object], list[Object]]:
    """The pools view's JSON rows, and the kinds skipped (CRD not installed, or listing forbidden) with why."""
    claims = [claim for namespace in namespaces for claim in (await kube.list(CLAIMS, namespace))[0]]
    rows: list[Object] = []
    skipped: list[Object] = []
    for kind in kinds:
        try:
            pools = [
                pool
                for namespace in (namespaces if kind.namespaced else [None])
                for pool in (await kube.list(pool_resource(kind), namespace))[0]
            ]
        except ApiError as error:
            if not (error.not_found or error.status == 403):
                raise
            why = "its CRD is not installed" if error.not_found else f"listing it is forbidden ({error.message})"
            skipped.append({"apiGroup": kind.group, "kind": kind.kind, "reason": why})
            continue
        rows += [_pool_row(kind, pool, claims) for pool in pools]
    return rows, skipped


def _pool_row(kind: PoolKind, pool: Object, claims: Iterable[Object]) -> Object:
    meta = pool["metadata"]
    namespace = meta.get("namespace", "") if kind.namespaced else ""
    counts = (pool.get("status") or {}).get(STATUS_COUNTS_FIELD) or {}
    ready, reason = _ready(pool)
    waiting = sum(
        1
        for claim in claims
        if names_pool(claim, kind.ref(namespace, meta["name"]))
        and not claim["metadata"].get("deletionTimestamp")  # as ipam_provider_waiting_claims counts them
        and not ((claim.get("status") or {}).get("addressRef") or {}).get("name")
    )
    return {
        "apiGroup": kind.group,
        "kind": kind.kind,
        "namespace": namespace,
        "name": meta["name"],
        "ready": ready,
        "reason": reason,
        "total": counts.get("total"),
        "used": counts.get("used"),
        "free": counts.get("free"),
        "outOfRange": counts.get("outOfRange"),
        "waiting": waiting,
    }


def _ready(obj: Object) -> tuple[bool | None, str | None]:
    """The object's Ready condition as (true/false/None when absent or Unknown, its reason or None)."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    ready: dict[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
    value = {"True": True, "False": False}.get(str(ready.get("status")))
    return value, ready.get("reason") or None


def _claim_cells(row: Object) -> tuple[str, ...]:
    pool = row["pool"]
    return row["namespace"], row["name"], f"{pool['kind']}/{pool['name']}", row["address"] or "-", row["reason"] or "-"


def _pool_cells(row: Object) -> tuple[str, ...]:
    ready = {True: "True", False: "False", None: "Unknown"}[row["ready"]]
    counts = tuple("-" if row[field] is None else str(row[field]) for field in ("total", "used", "free"))
    return row["kind"], row["namespace"] or "-", row["name"], ready, row["reason"] or "-", *counts, str(row["waiting"])


def _print_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in [columns, *rows]) for i in range(len(columns))]
    for row in [columns, *rows]:
        print("  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip())
