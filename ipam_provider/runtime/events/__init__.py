"""Kubernetes Events: recorded without waiting (`recorder.py`), deduplicated and aggregated (`correlator.py`)."""

from ipam_provider.runtime.events.recorder import NORMAL, WARNING, EventRecorder

__all__ = ["NORMAL", "WARNING", "EventRecorder"]
