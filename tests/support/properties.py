"""The property tests' Hypothesis profiles, and how many examples a test draws under each.

`suite` (loaded by tests/conftest.py, so every run uses it) turns off Hypothesis' timing checks: the per-example
deadline and the too-slow-to-generate health check measure the machine, not the code, and on a shared, loaded
machine they fail at random. `fast` (`pytest --hypothesis-profile=fast`, which `make test-fast` passes) is `suite`
drawing a third of the examples: the fast lane is the edit-test loop, `make test` draws them all.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

SUITE, FAST = "suite", "fast"
SUITE_EXAMPLES = 100  # Hypothesis' default max_examples, which `suite` keeps
settings.register_profile(SUITE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(FAST, parent=settings.get_profile(SUITE), max_examples=SUITE_EXAMPLES // 3)


def examples(full: int) -> int:
    """A test's `max_examples`: `full` under `suite`, scaled like the loaded profile's default under another (at
    least 10). Read when the test module is imported, after pytest has loaded the profile."""
    loaded = settings.default
    assert loaded is not None, "a Hypothesis profile is loaded (tests/conftest.py)"
    return max(10, full * loaded.max_examples // SUITE_EXAMPLES)
