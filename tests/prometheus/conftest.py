"""Fixtures of tests/prometheus: the real promtool and Prometheus server of PROMETHEUS_VERSION.

Nothing here skips: if they cannot be built (Go and the Go module proxy are needed, or PROMETHEUS_BIN_DIR), the
fixture fails with the build's output."""

from __future__ import annotations

import pytest

from tools.prometheus import PrometheusBinaries, PrometheusUnavailable, prometheus_binaries


@pytest.fixture(scope="session")
def prometheus_bins() -> PrometheusBinaries:
    try:
        return prometheus_binaries()
    except PrometheusUnavailable as error:
        pytest.fail(str(error), pytrace=False)
