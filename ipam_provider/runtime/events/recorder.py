"""The Event recorder: reconcilers hand it Events and go on; a writer task sends them to the API server.

`record()` never blocks, never raises and never waits for the API server: it counts the occurrence into the
correlator (`correlator.py`: dedup, aggregation, a bounded buffer) and wakes the writer. The writer task runs from
`start()` (the controller calls it when it starts) until `close()`; it writes one Event at a time, each Event at
most once per second. Without `start()`, Events wait until `flush()` writes them. A failed write is logged at
warning level and never raised; a PATCH answered 404 (the Event expired or was deleted) creates the Event again.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from ipam_provider.runtime.events.correlator import DROPPED, EventCorrelator, Series
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import EVENTS, Object
from ipam_provider.runtime.telemetry.clients import count_event

log = structlog.get_logger(__name__)
NORMAL = "Normal"
WARNING = "Warning"
CLOSE_TIMEOUT = 5.0


class EventRecorder:
    """Records core/v1 Events for one source component (see the module's docstring for the contract)."""

    def __init__(self, kube: KubeClient, component: str, correlator: EventCorrelator | None = None) -> None:
        self.kube = kube
        self.component = component
        self.correlator = correlator or EventCorrelator(component)
        self._task: asyncio.Task[None] | None = None
        self._background = False  # started: the writer stays when there is nothing to write
        self._forcing = 0  # flushes under way: the writer ignores the per-Event write interval
        self._writing = False  # the writer holds Events it took and has not written yet
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._full_reported = False

    def record(self, obj: Object, type: str, reason: str, message: str, *, related: Object | None = None) -> None:
        """Record an Event about `obj` (`related`: a second object it concerns, under which bursts of similar Events
        are combined). Returns at once; never raises."""
        try:
            outcome = self.correlator.observe(obj, type, reason, message, related)
            count_event(type, outcome)
        except Exception as error:  # a malformed object must not fail a reconcile
            log.warning("event not recorded", reason=reason, error=str(error), error_type=type_name(error))
            return
        if outcome == DROPPED and not self._full_reported:
            self._full_reported = True
            log.warning("event buffer full; events dropped until it drains", reason=reason, capacity=self.capacity)
        self._wake.set()

    def forget(self, kind: str, namespace: str | None, name: str) -> None:
        """The object is gone: what the correlator keeps for it goes (`EventCorrelator.forget`)."""
        self.correlator.forget(kind, namespace, name)

    @property
    def capacity(self) -> int:
        return self.correlator.capacity

    def start(self) -> None:
        """Write Events in the background on the running loop, from now until `close()`. Idempotent."""
        self._background = True
        self._ensure_writer()

    async def flush(self) -> None:
        """Return once every Event recorded before or during the call has been written (or its write failed),
        without waiting out the per-Event write interval."""
        self._forcing += 1
        try:
            while self.correlator.pending or self._writing:
                self._drained.clear()
                self._ensure_writer()
                self._wake.set()
                await self._drained.wait()
        finally:
            self._forcing -= 1

    async def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Flush for at most `timeout` seconds, then stop the writer. What is still unwritten then is lost."""
        self._background = False
        try:
            await asyncio.wait_for(self.flush(), timeout)
        except TimeoutError:
            log.warning("events not written before shutdown", pending=self.correlator.pending, timeout=timeout)
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _ensure_writer(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="event-writer")

    async def _run(self) -> None:
        """Write due Events until none waits; then, when started, sleep until one is recorded or due."""
        try:
            while True:
                self._wake.clear()
                batch = self.correlator.due(force=self._forcing > 0)
                if batch:
                    self._writing = True
                    try:
                        for series in batch:
                            await self._write(series)
                    finally:
                        self._writing = False
                    continue
                if not self.correlator.pending:
                    self._full_reported = False
                    self._drained.set()
                    if not self._background:
                        return
                await self._sleep(self.correlator.next_due())
        finally:
            self._drained.set()  # a flush waiting on a writer that stops looks again

    async def _sleep(self, delay: float | None) -> None:
        """Until an Event is recorded (or a flush begins), or for `delay` seconds at most."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), delay)

    async def _write(self, series: Series) -> None:
        """Create the Event, or patch its count, message and lastTimestamp; logged, never raised, when it fails."""
        count = series.count
        try:
            if series.written:
                try:
                    await self.kube.patch(EVENTS, series.name, series.update(), series.namespace)
                except ApiError as error:
                    if not error.not_found:
                        raise
                    await self.kube.create(EVENTS, series.creation(), series.namespace)
            else:
                await self.kube.create(EVENTS, series.creation(), series.namespace)
        except Exception as error:
            involved = series.body["involvedObject"]
            log.warning(
                "event not written",
                reason=series.body["reason"],
                involved=f"{involved.get('kind')} {involved.get('namespace') or ''}/{involved.get('name')}",
                count=count,
                error=error.message if isinstance(error, ApiError) else str(error),
                error_type=type_name(error),
            )
            return
        series.written = count


def type_name(error: BaseException) -> str:
    return type(error).__name__
