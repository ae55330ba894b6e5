"""The reconcilers' Event recorder, which lives in `ipam_provider.events`."""

from ipam_provider.events import NORMAL, WARNING, EventRecorder

__all__ = ["NORMAL", "WARNING", "EventRecorder"]
