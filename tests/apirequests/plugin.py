"""pytest plugin: collect the request shapes of every sandbox API server the session starts, and fail the session
when the product sent one that is not in the table (tests/apirequests/table.py, docs/reference/api-requests.md).

Works under pytest-xdist: the controller makes one directory and puts it in DRA_SANDBOX_REQUEST_SHAPES before the
workers start (they, and every process a test starts, inherit it); each API server writes its own file there;
the controller reads them all when the session ends. `DRA_REQUEST_SHAPES=off` turns the check off (e.g. to
bisect a failure); a directory already in DRA_SANDBOX_REQUEST_SHAPES is used and left in place.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_sandbox.apiserver.shapes import RECORD_ENV
from tests.apirequests.check import check_directory
from tests.apirequests.origin import marking_all_origins

SWITCH_ENV = "DRA_REQUEST_SHAPES"
_DIR_KEY = pytest.StashKey[Path]()
_OWNED_KEY = pytest.StashKey[bool]()
_REPORT_KEY = pytest.StashKey[str]()
_CHECKED_KEY = pytest.StashKey[int]()


def _enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "on") != "off"


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if not _enabled() or _is_worker(config):
        return
    existing = os.environ.get(RECORD_ENV)
    directory = Path(existing) if existing else Path(tempfile.mkdtemp(prefix="dra-request-shapes-"))
    os.environ[RECORD_ENV] = str(directory)
    config.stash[_DIR_KEY] = directory
    config.stash[_OWNED_KEY] = not existing


@pytest.fixture(scope="session", autouse=True)
def _mark_request_origins() -> Iterator[None]:
    if not _enabled():
        yield
        return
    with marking_all_origins():
        yield


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    directory = config.stash.get(_DIR_KEY, None)
    if directory is None:
        return
    try:
        checked, report = check_directory(directory)
    finally:
        if config.stash.get(_OWNED_KEY, False):
            shutil.rmtree(directory, ignore_errors=True)
    config.stash[_CHECKED_KEY] = checked
    if report:
        config.stash[_REPORT_KEY] = report
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    report = config.stash.get(_REPORT_KEY, "")
    if report:
        terminalreporter.section("requests a real API server or the chart's RBAC would refuse", red=True)
        terminalreporter.line(report)
    elif config.stash.get(_CHECKED_KEY, 0):
        terminalreporter.line(f"product API requests: {config.stash[_CHECKED_KEY]} distinct shapes recorded, each one a "
                              "real API server (1.34-1.37) serves and the chart's RBAC grants")
