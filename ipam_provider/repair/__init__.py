"""The repair loop (`loop.py`; the backends' side is `ipam_provider.backend.repair`; docs/repair.md)."""

from ipam_provider.repair.loop import RepairLoop as RepairLoop
from ipam_provider.repair.pool import RepairSettings as RepairSettings
