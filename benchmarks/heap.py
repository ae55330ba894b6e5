"""Our controller under tracemalloc, for `benchmarks/soak.py --heap DIR`: heap snapshots on demand, and their
difference by allocation site.

`python -m benchmarks.heap DIR <ipam-provider arguments>` starts tracemalloc keeping FRAMES frames per allocation,
then runs the normal command-line entry point (`ipam_provider.cli.main`) with the arguments after DIR. Each SIGUSR2
writes `tracemalloc.take_snapshot()` to `DIR/heap-<n>.snapshot` (n = 1, 2, …), written under a temporary name and
renamed, so a file that exists is complete. Tracing costs memory and CPU: RSS and CPU of a traced run are not the
controller's figures.

`top_sites(before, after)` compares two snapshots by whole traceback and groups the differences by the first frame
(from the allocation outwards) inside our own code (`ipam_provider/` or `backends/`), so that an allocation made
deep in a library is charged to the line of ours that asked for it.
"""

from __future__ import annotations

import collections
import itertools
import os
import signal
import sys
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

FRAMES = 25
OWN_CODE = ("/ipam_provider/", "/backends/")
IGNORED = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>", "<unknown>", tracemalloc.__file__)


def snapshot_path(directory: Path, number: int) -> Path:
    return directory / f"heap-{number}.snapshot"


def install_dumper(directory: Path) -> None:
    """On each SIGUSR2, the next numbered snapshot into `directory`."""
    numbers = itertools.count(1)

    def dump(_signum: int, _frame: FrameType | None) -> None:
        target = snapshot_path(directory, next(numbers))
        partial = target.with_suffix(".partial")
        tracemalloc.take_snapshot().dump(str(partial))
        os.replace(partial, target)

    signal.signal(signal.SIGUSR2, dump)


@dataclass
class Site:
    """One of our lines and what the allocations made below it grew by; `leaf`: where the largest of them was
    made (the allocation's own frame, in a library or ours); `callers`: the bytes by the chain of our frames that
    called `own` (which says who keeps what was allocated)."""

    own: str
    size_diff: int = 0
    count_diff: int = 0
    leaf: str = ""
    leaf_size: int = 0
    callers: collections.Counter[str] = field(default_factory=collections.Counter)  # `via` chain -> bytes

    @property
    def via(self) -> str:
        """The chain of our callers (outwards) that the most of the growth came through."""
        return self.callers.most_common(1)[0][0] if self.callers else ""


def short(filename: str, lineno: int) -> str:
    """A frame as `path:line`, the path from our package or the library's top directory on."""
    for marker in (*OWN_CODE, "/site-packages/"):
        if marker in filename:
            tail = filename.rsplit(marker, 1)[1]
            return f"{marker.strip('/') + '/' + tail if marker in OWN_CODE else tail}:{lineno}"
    if "/lib/python3" in filename:  # the standard library: from below its versioned directory
        filename = filename.rsplit("/lib/python3", 1)[1].partition("/")[2]
    return f"{filename}:{lineno}"


def own_frames(traceback: tracemalloc.Traceback) -> list[str]:
    """The frames in our own code, from the allocation outwards."""
    return [short(f.filename, f.lineno) for f in reversed(list(traceback)) if any(p in f.filename for p in OWN_CODE)]


def own_frame(traceback: tracemalloc.Traceback) -> str:
    """The frame nearest the allocation that is in our own code, else the allocation's own frame marked."""
    if frames := own_frames(traceback):
        return frames[0]
    leaf = traceback[-1]  # the most recent frame
    return f"(no frame of ours) {short(leaf.filename, leaf.lineno)}"


def via(traceback: tracemalloc.Traceback, own: str, depth: int = 3) -> str:
    """Up to `depth` of our frames that called `own`, outwards, each line once."""
    chain: list[str] = []
    for frame in own_frames(traceback):
        if frame != own and frame not in chain:
            chain.append(frame)
    return " <- ".join(chain[:depth])


def top_sites(before: Path, after: Path, limit: int = 25) -> tuple[list[Site], int, int]:
    """The `limit` sites of ours whose allocations grew most from `before` to `after` (by bytes), and the total
    traced bytes and blocks grown."""
    filters = [tracemalloc.Filter(False, pattern) for pattern in IGNORED]
    old = tracemalloc.Snapshot.load(str(before)).filter_traces(filters)
    new = tracemalloc.Snapshot.load(str(after)).filter_traces(filters)
    sites: dict[str, Site] = {}
    size_total = count_total = 0
    for diff in new.compare_to(old, "traceback"):
        key = own_frame(diff.traceback)
        site = sites.setdefault(key, Site(key))
        site.size_diff += diff.size_diff
        site.count_diff += diff.count_diff
        size_total += diff.size_diff
        count_total += diff.count_diff
        site.callers[via(diff.traceback, key)] += diff.size_diff
        if diff.size_diff > site.leaf_size:
            leaf = list(diff.traceback)[-1]
            site.leaf, site.leaf_size = short(leaf.filename, leaf.lineno), diff.size_diff
    ranked = sorted(sites.values(), key=lambda site: site.size_diff, reverse=True)
    return ranked[:limit], size_total, count_total


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: python -m benchmarks.heap DIR <ipam-provider arguments>", file=sys.stderr)
        return 2
    directory = Path(sys.argv[1])
    directory.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(FRAMES)
    install_dumper(directory)
    from ipam_provider.cli import main as cli_main  # imported under tracing, so its module state is traced too

    return cli_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
