"""The repair loop (see `loop.py`; the backends' side is `ipam_provider.backend.repair`, the docs docs/repair.md)."""

from ipam_provider.repair.loop import RepairLoop
from ipam_provider.repair.pool import RepairSettings

__all__ = ["RepairLoop", "RepairSettings"]
