"""Test-suite wiring: the real control plane and shared helpers are pytest plugins under tests/support."""

pytest_plugins = [
    "tests.support.cluster",
    "tests.support.clusterctl",
    "tests.support.controller",
    "tests.support.netbox",
    "tools.wapi_simulator.fixtures",
]
