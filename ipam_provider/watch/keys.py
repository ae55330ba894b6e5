"""The keys of the work queue: one per claim and one per pool. A key names an object; the reconciler reads the
object's current state from the caches when the key comes up."""

from __future__ import annotations

from dataclasses import dataclass

from ipam_provider.backend.contract import PoolRef


@dataclass(frozen=True)
class ClaimKey:
    """An IPAddressClaim, reconciled by the claim reconciler."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"claim/{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PoolKey:
    """A pool, reconciled by the pool reconciler."""

    ref: PoolRef

    def __str__(self) -> str:
        return f"pool/{self.ref}"


QueueKey = ClaimKey | PoolKey

Shard = PoolRef | None
"""The queue shard of a key: the pool it concerns. The queue serves shards in turn, so that a pool with a backlog
cannot starve another; None is the shard of claims whose pool cannot be known (they are ignored by the
reconciler)."""
