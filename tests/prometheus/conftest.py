"""Fixtures of tests/prometheus: the real promtool and Prometheus server of PROMETHEUS_VERSION.

Nothing here skips: if they cannot be built (Go and the Go module proxy are needed, or PROMETHEUS_BIN_DIR), the
fixture fails with the build's output.

Tests that use them carry support.BUILT_WITH_GO, the `apiserver` mark by hand (as tests/image does): like the control
plane's binaries they are built with Go on first use, which the fast lane (`-m "not apiserver and not netbox"`)
never needs."""

from __future__ import annotations

import pytest

from tools.prometheus import PrometheusBinaries, PrometheusUnavailable, prometheus_binaries


@pytest.fixture(scope="session")
def prometheus_bins() -> PrometheusBinaries:
    try:
        return prometheus_binaries()
    except PrometheusUnavailable as error:
        pytest.fail(str(error), pytrace=False)
