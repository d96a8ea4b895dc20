"""Suite-wide settings."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest
from _pytest.terminal import TerminalReporter
from hypothesis import HealthCheck, settings

# Property tests explore the same examples on every run (a failure in CI is reproducible locally); set
# DRA_TEST_FULL=1 (`make test-full`) to let hypothesis search freshly and harder.
settings.register_profile("ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("full", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("full" if os.environ.get("DRA_TEST_FULL") == "1" else "ci")

# Every request the product sends is recorded by the sandbox API servers and checked at the end of the session
# against docs/reference/api-requests.md (tests/apirequests/).
# tests/xdistgroups.py: `--dist loadgroup` honours the xdist_group marks again (pytest 9.2 with pytest-xdist 3.8.0).
pytest_plugins = ["tests.apirequests.plugin", "tests.xdistgroups"]


# ---- The image test's skip, said loudly (make test; docs/image.md) ---------------------------------------------
# tests/integration/test_plugin_image.py skips only when podman cannot run containers here (or IMAGE_TEST=0); a
# skip in the "N skipped" count would go unnoticed, so the summary repeats its reason in a banner.
IMAGE_TEST_SKIP_PREFIX = "IMAGE TEST NOT RUN:"
# tests/upstream skip only where upstream Kubernetes cannot be built or is not built (docs/upstream.md); said as loudly.
UPSTREAM_SKIP_PREFIX = "UPSTREAM KUBERNETES NOT TESTED:"


def pytest_terminal_summary(terminalreporter: TerminalReporter) -> None:
    _banner(terminalreporter, UPSTREAM_SKIP_PREFIX, "THE DRIVER WAS NOT TESTED ON UPSTREAM KUBERNETES",
            "(tests/upstream; docs/upstream.md says what it needs)")
    _banner(terminalreporter, IMAGE_TEST_SKIP_PREFIX, "THE PLUGIN WAS NOT TESTED FROM ITS CONTAINER IMAGE",
            "(tests/integration/test_plugin_image.py; docs/image.md says what it needs)")


def _banner(terminalreporter: TerminalReporter, prefix: str, title: str, where: str) -> None:
    """`title` in red, with each distinct reason of the skips whose reason carries `prefix`, and `where`."""
    reasons = set()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        if isinstance(longrepr, tuple) and prefix in str(longrepr[2]):
            reasons.add(str(longrepr[2]).removeprefix("Skipped: "))
    for reason in sorted(reasons):
        terminalreporter.write_sep("=", title, red=True, bold=True)
        terminalreporter.write_line(f"  {reason}", red=True, bold=True)
        terminalreporter.write_line(f"  {where}")


# ---- make test's phases (Makefile, README "Tests") -------------------------------------------------------------
# Every test is in exactly one phase: `upstream` (it runs upstream Kubernetes binaries: everything under
# tests/upstream, marked here, and the tests that carry the marker themselves), else `slow` (marked by the test:
# an end-to-end run, a soak, a benchmark in its short form), else the quick phase: `-m "not slow and not upstream"`.
_TESTS = Path(__file__).resolve().parent
_UPSTREAM_TESTS = _TESTS / "upstream"
# The tests a session collected before any -m/-k/--deselect took some away (the suite's size, below).
_COLLECTED = pytest.StashKey[int]()


@pytest.hookimpl(tryfirst=True)  # before -m deselects and before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    config.stash[_COLLECTED] = len(items)
    for item in items:
        if item.path.is_relative_to(_UPSTREAM_TESTS):
            item.add_marker(pytest.mark.upstream)
        if item.get_closest_marker("xdist_group") is None and _uses_a_module_fixture(item):
            # One test worker runs the whole module, so its module-scoped fixture (a sandbox, an API server, a
            # plugin) starts once, not once per worker.
            item.add_marker(pytest.mark.xdist_group(f"module:{item.path.relative_to(_TESTS)}"))


def _uses_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(d.scope == "module" and Path(inspect.getfile(d.func)).is_relative_to(_TESTS)
               for defs in info.name2fixturedefs.values() for d in defs)


# ---- The suite's size (README's figure, tests/test_docs_figures.py) ------------------------------------------------
# Set when this session collected the whole suite (each phase of `make test`: every test under tests/, some then
# deselected by -m), so the docs test compares the README's count with it instead of collecting the suite again.
WHOLE_SUITE = pytest.StashKey[int]()


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    here = config.invocation_params.dir
    roots = [(here / str(arg).split("::", 1)[0]).resolve() for arg in config.args] or [here.resolve()]
    whole = all(root == _TESTS or root in _TESTS.parents for root in roots)
    if whole and not config.option.ignore and not config.option.ignore_glob and _COLLECTED in config.stash:
        config.stash[WHOLE_SUITE] = config.stash[_COLLECTED]
