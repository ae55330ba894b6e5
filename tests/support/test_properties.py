"""`make test` draws every example of a property test, and the fast lane's profile a third of them."""

from __future__ import annotations

import pytest

from tests.support.order import REPO

CONFTEST = """
from hypothesis import settings
from tests.support.properties import SUITE
settings.load_profile(SUITE)
"""
PROBE = """
from tests.support.properties import examples

def test_count():
    print("examples:", examples(300))
"""


@pytest.mark.parametrize(("options", "drawn"), [((), 300), (("--hypothesis-profile=fast",), 99)])
def test_the_profile_sets_how_many_examples_a_test_draws(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, options: tuple[str, ...], drawn: int
) -> None:
    """The suite's conftest loads `suite`, as tests/conftest.py does; `--hypothesis-profile` replaces it."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makepyfile(test_probe=PROBE)
    pytester.makeconftest(CONFTEST)
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", *options)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*examples: {drawn}*"])
