"""tests/support/order.py names modules that exist, and only moves tests."""

from __future__ import annotations

from tests.support.order import LONG_FIRST, REPO


def test_every_long_first_module_exists_once() -> None:
    assert len(set(LONG_FIRST)) == len(LONG_FIRST)
    assert [module for module in LONG_FIRST if not (REPO / module).is_file()] == []
