"""Pytest fixtures for the WAPI simulator.

Use them from a test module (or from the root ``tests/conftest.py``) with::

    pytest_plugins = ["tools.wapi_simulator.fixtures"]

Fixtures:

* ``wapi_simulator`` -- a fresh, running, TLS-enabled simulator per test (admin / infoblox, WAPI 2.12); use
  ``.connector()`` for a real infoblox-client Connector that verifies the simulator's CA;
* ``wapi_simulator_factory`` -- call it with :class:`~tools.wapi_simulator.server.WapiSimulator` keyword
  arguments (``tls=False``, ``username=...``, ``session_timeout=...``, ``seed=...``) to start more or
  differently configured simulators; every one is stopped after the test;
* ``wapi_tls_material`` -- the session-wide throwaway CA and server certificate the simulators share.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .server import WapiSimulator
from .tls import TlsMaterial, make_tls_material


@pytest.fixture(scope="session")
def wapi_tls_material(tmp_path_factory: pytest.TempPathFactory) -> TlsMaterial:
    """A throwaway CA + server certificate for 127.0.0.1, shared by the session's simulators."""
    return make_tls_material(tmp_path_factory.mktemp("wapi-simulator-tls"))


@pytest.fixture
def wapi_simulator_factory(wapi_tls_material: TlsMaterial) -> Iterator[Callable[..., WapiSimulator]]:
    """Start simulators on free ports; all are stopped at teardown."""
    started: list[WapiSimulator] = []

    def start(**kwargs: Any) -> WapiSimulator:
        if kwargs.get("tls", True):
            kwargs.setdefault("tls_material", wapi_tls_material)
        simulator = WapiSimulator(**kwargs).start()
        started.append(simulator)
        return simulator

    yield start
    for simulator in started:
        simulator.stop()


@pytest.fixture
def wapi_simulator(wapi_simulator_factory: Callable[..., WapiSimulator]) -> WapiSimulator:
    """A fresh TLS simulator for one test."""
    return wapi_simulator_factory()
