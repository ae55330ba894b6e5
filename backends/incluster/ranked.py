"""A sorted set of integers with positional search in O(log n): a zone's used addresses, for Random's exact choice.

Points are kept in sorted blocks of about `LOAD`, the blocks' first points in a list and their sizes in a Fenwick
tree: `add`/`discard` cost O(log n) plus a block's memmove (a split or an emptied block rebuilds the tree, amortised
O(n / LOAD²)); `count_leading(predicate)`, for a predicate monotone over the points, evaluates it O(log n) times.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable

LOAD = 512


class RankedPoints:
    def __init__(self, points: Iterable[int] = ()) -> None:
        ordered = sorted(set(points))
        self._blocks = [ordered[start : start + LOAD] for start in range(0, len(ordered), LOAD)]
        self._size = len(ordered)
        self._reindex()

    def _reindex(self) -> None:
        self._firsts = [block[0] for block in self._blocks]
        tree = [0] * (len(self._blocks) + 1)  # 1-based Fenwick tree of the blocks' sizes
        for position, block in enumerate(self._blocks, start=1):
            tree[position] += len(block)
            parent = position + (position & -position)
            if parent < len(tree):
                tree[parent] += tree[position]
        self._tree = tree

    def _bump(self, block: int, delta: int) -> None:
        position = block + 1
        while position < len(self._tree):
            self._tree[position] += delta
            position += position & -position

    def __len__(self) -> int:
        return self._size

    def _block_of(self, value: int) -> int:
        return max(bisect_right(self._firsts, value) - 1, 0)

    def add(self, value: int) -> None:
        if not self._blocks:
            self._blocks = [[value]]
            self._size = 1
            self._reindex()
            return
        index = self._block_of(value)
        block = self._blocks[index]
        at = bisect_left(block, value)
        if at < len(block) and block[at] == value:
            return
        insort(block, value)
        self._size += 1
        if len(block) > 2 * LOAD:
            self._blocks[index : index + 1] = [block[:LOAD], block[LOAD:]]
            self._reindex()
        else:
            self._firsts[index] = block[0]
            self._bump(index, 1)

    def discard(self, value: int) -> None:
        if not self._blocks:
            return
        index = self._block_of(value)
        block = self._blocks[index]
        at = bisect_left(block, value)
        if at == len(block) or block[at] != value:
            return
        del block[at]
        self._size -= 1
        if not block:
            del self._blocks[index]
            self._reindex()
        else:
            self._firsts[index] = block[0]
            self._bump(index, -1)

    def count_leading(self, predicate: Callable[[int, int], bool]) -> int:
        """How many leading points satisfy `predicate(point, position)`, which must be true for a prefix of the
        points (in ascending order, `position` counting from 0) and false after it."""
        blocks, firsts, tree = self._blocks, self._firsts, self._tree
        if not blocks or not predicate(firsts[0], 0):
            return 0
        # Fenwick descent: the last block whose first point satisfies the predicate. `block` blocks hold `before`
        # points; block `candidate` (0-based) starts after tree[candidate] more, as `block` is a multiple of 2*step.
        block, before = 0, 0
        step = 1 << (len(blocks).bit_length() - 1)
        while step:
            candidate = block + step
            if candidate < len(blocks) and predicate(firsts[candidate], before + tree[candidate]):
                block, before = candidate, before + tree[candidate]
            step >>= 1
        points = blocks[block]
        low, high = 1, len(points)  # points[0] satisfies it: the last satisfying one is in points[0 .. high-1]
        while low < high:
            middle = (low + high) // 2
            if predicate(points[middle], before + middle):
                low = middle + 1
            else:
                high = middle
        return before + low
