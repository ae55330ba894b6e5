"""Tests are marked `apiserver` / `netbox` by what they need, from their fixtures (tests/conftest.py), so that
`-m "not apiserver and not netbox"` selects exactly the tests that need neither server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import NEEDS

REPO = Path(__file__).resolve().parents[1]


def needs(item: pytest.Item) -> set[str]:
    return {marker.name for marker in item.iter_markers() if marker.name in NEEDS}


def test_fixtures_at_any_depth_mark_a_test(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\nmarkers =\n    apiserver: x\n    netbox: y\n"
    )
    pytester.makeconftest(
        """
        import pytest

        from tests.conftest import pytest_collection_modifyitems  # the hook under test


        @pytest.fixture
        def kubeconfig(): ...

        @pytest.fixture
        def kube(kubeconfig): ...

        @pytest.fixture
        def netbox_server(): ...

        @pytest.fixture
        def netbox(netbox_server): ...
        """
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.fixture
        def controller(kube): ...

        @pytest.fixture
        def both(controller, netbox): ...

        def test_pure(tmp_path): ...

        def test_root(kubeconfig): ...

        def test_deep(controller): ...

        def test_netbox(netbox): ...

        def test_both(both): ...

        @pytest.mark.usefixtures("kube")
        def test_used(): ...

        @pytest.mark.apiserver
        def test_by_hand(): ...

        @pytest.mark.parametrize("value", [1, 2])
        def test_parametrized(value, kube): ...
        """
    )
    items, _ = pytester.inline_genitems()
    assert {item.name: needs(item) for item in items} == {
        "test_pure": set(),
        "test_root": {"apiserver"},
        "test_deep": {"apiserver"},
        "test_netbox": {"netbox"},
        "test_both": {"apiserver", "netbox"},
        "test_used": {"apiserver"},
        "test_by_hand": {"apiserver"},
        "test_parametrized[1]": {"apiserver"},
        "test_parametrized[2]": {"apiserver"},
    }
    by_hand = next(item for item in items if item.name == "test_by_hand")
    assert [m.name for m in by_hand.iter_markers() if m.name == "apiserver"] == ["apiserver"], "marked once"


def test_the_suite_is_marked_by_need(pytester: pytest.Pytester) -> None:
    """The real wiring: tests through the support fixtures and the backends' conftest fixtures, and tests that
    start a control plane of their own, are marked; pure tests are not."""
    files = [
        "tests/system/test_rbac.py",  # a module fixture on kubeconfig
        "tests/system/infoblox/test_backend.py",  # tests/support/infoblox.py fixtures
        "tests/system/netbox/test_harness.py",  # netbox only
        "tests/backends/netbox/test_spec.py",  # the CRD (kube) and the parser (pure)
        "tests/tools/controlplane/test_cluster.py",  # starts control planes without a fixture
        "tests/backends/incluster/test_intervals.py",  # pure
        "tests/system/test_image.py",  # marked by hand: the image build
        "tests/system/test_capv.py",  # provider_harness
        "tests/system/test_dashboard.py",  # prometheus_bins
        "tests/system/test_clusterctl_release.py",  # clusterctl
        "tests/system/endpoints/test_topology.py",  # capi_core_manager and in_process_controller
    ]
    items, _ = pytester.inline_genitems(
        *(str(REPO / name) for name in files), f"--rootdir={REPO}", "-c", str(REPO / "pyproject.toml")
    )
    marks = {item.nodeid: needs(item) for item in items}

    def of(prefix: str) -> list[set[str]]:
        found = [value for nodeid, value in marks.items() if nodeid.startswith(prefix)]
        assert found, f"no test collected under {prefix}"
        return found

    assert of("tests/system/test_rbac.py::") == [{"apiserver"}]
    assert all(value == {"apiserver"} for value in of("tests/system/infoblox/test_backend.py::"))
    assert all(value == {"netbox"} for value in of("tests/system/netbox/test_harness.py::"))
    assert all(value == {"apiserver"} for value in of("tests/backends/netbox/test_spec.py::test_the_crd"))
    assert all(value == set() for value in of("tests/backends/netbox/test_spec.py::test_parse_pool_refuses"))
    assert of("tests/tools/controlplane/test_cluster.py::test_two_instances") == [{"apiserver"}]
    assert of("tests/tools/controlplane/test_cluster.py::test_kubebuilder_assets") == [set()]
    assert all(value == set() for value in of("tests/backends/incluster/test_intervals.py::"))
    assert all(value == {"apiserver", "image"} for value in of("tests/system/test_image.py::"))
    assert all({"apiserver", "providers"} <= value for value in of("tests/system/test_capv.py::test_"))
    assert of("tests/system/test_dashboard.py::test_every_panel_draws") == [{"apiserver", "prometheus"}]
    assert of("tests/system/test_clusterctl_release.py::test_clusterctl_describes_the_provider") == [{"clusterctl"}]
    assert of("tests/system/endpoints/test_topology.py::") == [{"apiserver", "capi_core"}]
