"""What the sandbox expects is no warning (issue 38): a conflict the scheduler stand-in retries, a pod applied before
its claim template, kopf running the controller in a thread, a plugin socket seen a moment before it listens, and
gRPC's own INFO lines. A warning is left for what is wrong. (`tests/e2e/test_cli.py` runs the whole demo and finds
no warning, error or gRPC line in what it prints.)"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping, Sequence
from typing import Any
from unittest import mock

import pytest
import structlog
from structlog.testing import capture_logs

from dra_driver.k8s.client import ApiError
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.cluster import _THREAD_SIGNALS
from dra_sandbox.scheduler import SandboxScheduler

KOPF = "kopf._core.reactor.running"


@pytest.fixture(autouse=True)
def _debug_lines_reach_the_capture() -> Any:
    """capture_logs swaps structlog's processors, not its level filter: a test that ran the CLI earlier in this
    worker left an INFO filter, which drops the debug lines these tests look for before any processor."""
    old = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    yield
    structlog.configure(**old)


def _levels(entries: Sequence[MutableMapping[str, Any]]) -> list[tuple[object, object]]:
    return [(e["log_level"], e["event"]) for e in entries]


def test_a_conflict_is_retried_with_a_debug_line_and_another_api_error_warns() -> None:
    with ApiServer() as srv:
        scheduler = SandboxScheduler(srv.rest(), resync_seconds=0.01)
        for status, level in ((409, "debug"), (500, "warning")):

            def fail(code: int = status) -> None:
                raise ApiError(code, "x", {"message": "the object has been modified"})

            with mock.patch.object(scheduler, "reconcile", fail), capture_logs() as logs:
                assert scheduler._pass() == 0.01  # one pass; the next one after the resync period
            assert [lvl for lvl, _ in _levels(logs)] == [level]


def test_a_missing_template_is_an_event_and_a_debug_line_only() -> None:
    with ApiServer() as srv:
        rest = srv.rest()
        rest.request("POST", "/api/v1/namespaces/default/pods", body={
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "early"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "later"}],
                     "containers": [{"name": "c", "image": "i", "resources": {"claims": [{"name": "gpu"}]}}]}})
        with capture_logs() as logs:
            SandboxScheduler(rest).reconcile()
        assert [e for e in logs if e["log_level"] not in ("debug", "info")] == []
        assert ("debug", "cannot create the pod's claim") in _levels(logs)
        events = rest.request("GET", "/api/v1/namespaces/default/events")["items"]
        assert [e["reason"] for e in events if e["involvedObject"]["name"] == "early"][:1] == [
            "FailedResourceClaimCreation"]


@pytest.mark.parametrize(("level", "shown"), [(logging.INFO, False), (logging.DEBUG, True)])
def test_kopfs_thread_warning_is_a_debug_line(level: int, shown: bool) -> None:
    logger = logging.getLogger(KOPF)
    record = logger.makeRecord(KOPF, logging.WARNING, __file__, 1,
                               "OS signals are ignored: running not in the main thread.", (), None)
    other = logger.makeRecord(KOPF, logging.WARNING, __file__, 1, "something else", (), None)
    old = logger.level
    logger.setLevel(level)
    try:
        assert _THREAD_SIGNALS.filter(record) is shown
        assert (record.levelno, record.levelname) == (logging.DEBUG, "DEBUG")
        assert _THREAD_SIGNALS.filter(other) is True and other.levelno == logging.WARNING
    finally:
        logger.setLevel(old)


def test_the_sandbox_command_keeps_grpcs_core_to_its_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from dra_sandbox.cli import main

    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)
    with pytest.raises(SystemExit):
        main(["--version"])
    assert os.environ["GRPC_VERBOSITY"] == "ERROR"
    monkeypatch.setenv("GRPC_VERBOSITY", "DEBUG")  # asked for: kept
    with pytest.raises(SystemExit):
        main(["--version"])
    assert os.environ["GRPC_VERBOSITY"] == "DEBUG"
