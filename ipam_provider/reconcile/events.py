"""The reconcilers' Event recorder, which lives in `ipam_provider.runtime.events`."""

from ipam_provider.runtime.events import NORMAL, WARNING, EventRecorder

__all__ = ["NORMAL", "WARNING", "EventRecorder"]
