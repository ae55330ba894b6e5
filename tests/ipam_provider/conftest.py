"""Fixtures of the core's tests: the reconcilers against an in-memory API server and a fake backend."""

from __future__ import annotations

import pytest

from tests.ipam_provider.world import World, make_world


@pytest.fixture
def world() -> World:
    return make_world()
