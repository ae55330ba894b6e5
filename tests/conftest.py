"""Test-suite wiring: the real control plane, the fakes and the shared fixtures are pytest plugins under
tests/support.

Every test is marked by the environment it needs, from its fixtures (never from its folder or file name), so that
`pytest -m "not apiserver and not netbox"` runs the tests that need neither server (the fast lane):

- `apiserver`: the test uses, directly or through other fixtures, `kubeconfig` (tests/support/cluster.py), which
  starts the real kube-apiserver and etcd. Every fixture that talks to the API server depends on it: `kube`,
  `namespace`, `controller_factory`, `in_process_controller` and the fixtures of tests/support/netbox_backend.py and
  tests/support/infoblox.py built on them.
- `netbox`: the test uses `netbox_server` (tests/support/netbox.py), which starts the real NetBox; `netbox`
  depends on it.
- `clusterctl`, `prometheus`, `providers`, `capi_core`: the test uses `clusterctl` (tests/support/clusterctl.py),
  `prometheus_bins` (tests/support/prometheus.py), `provider_harness` (tests/support/providers.py) or
  `capi_core_manager` (tests/support/capi_core.py), each built with Go on first use. The prometheus, providers and
  capi_core tests carry `apiserver` too; three clusterctl tests need no API server and run in the fast lane.
- `image`: the image build (tests/system/test_image.py), marked by hand with `apiserver`, whose cold build takes
  minutes.

`item.fixturenames` is the transitive closure of a test's fixtures, so these roots are enough. A test that starts a
control plane without these fixtures (tests/tools/controlplane/test_cluster.py) carries the `apiserver` mark by hand
(an unmarked test that starts one fails, saying so).
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from tests.support.properties import SUITE
from tools.controlplane.cluster import LocalControlPlane

settings.load_profile(SUITE)  # `pytest --hypothesis-profile=fast` then replaces it (tests/support/properties.py)

pytest_plugins = [
    "pytester",
    "tests.support.capi_core",
    "tests.support.cluster",
    "tests.support.clusterctl",
    "tests.support.controller",
    "tests.support.infoblox",
    "tests.support.metrics",
    "tests.support.netbox",
    "tests.support.netbox_backend",
    "tests.support.order",
    "tests.support.prometheus",
    "tests.support.providers",
    "tests.support.world",
    "tools.wapi_simulator.fixtures",
]

# The fixtures that start a real server, by the marker a test using them (at any depth) gets.
NEEDS: dict[str, frozenset[str]] = {
    "apiserver": frozenset({"kubeconfig"}),
    "netbox": frozenset({"netbox_server"}),
    "clusterctl": frozenset({"clusterctl"}),
    "prometheus": frozenset({"prometheus_bins"}),
    "providers": frozenset({"provider_harness"}),
    "capi_core": frozenset({"capi_core_manager"}),
    "image": frozenset(),
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        for marker, roots in NEEDS.items():
            if fixtures & roots and item.get_closest_marker(marker) is None:
                item.add_marker(marker)


@pytest.fixture(autouse=True)
def _only_marked_tests_start_a_control_plane(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test without the `apiserver` mark that starts a control plane fails, saying so: the fast lane must
    never start one."""
    if request.node.get_closest_marker("apiserver") is not None:
        return

    def refuse(*_: object, **__: object) -> None:
        pytest.fail(f"{request.node.nodeid} starts a control plane: mark it @pytest.mark.apiserver", pytrace=False)

    monkeypatch.setattr(LocalControlPlane, "start", refuse)
