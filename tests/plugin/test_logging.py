"""Every log line about a claim carries its namespace, name and UID — also lines logged deep in MIG code."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from dra_driver.inventory.catalog import MigOffering
from dra_driver.observability.logging import configure_logging
from tests.plugin.conftest import EngineRig


def test_claim_fields_on_every_line(tmp_path: Path) -> None:
    stream = io.StringIO()
    configure_logging("debug", "json", stream=stream)
    rig = EngineRig(tmp_path, policy=MigOffering.DYNAMIC)
    try:
        ref = rig.claims.add("train", ["gpu-0-mig-1g10gb-19-6"], namespace="ml")
        assert rig.engine.prepare([ref])[ref.uid].error == ""
        assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    finally:
        rig.engine.close()
        configure_logging("warning", "text")
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{")]
    events = {line["msg"] for line in lines}
    assert {"MIG device created", "claim prepared", "claim unprepared"} <= events
    for line in lines:
        assert (line["claim_namespace"], line["claim_name"], line["claim_uid"]) == ("ml", "train", ref.uid), line
        assert "status" not in line and "spec" not in line  # no objects dumped


def test_a_real_json_line_follows_the_documented_schema(tmp_path: Path) -> None:
    """docs/operations.md "Log schema": ts (RFC 3339 UTC), level, logger, msg first; the line's fields after."""
    stream = io.StringIO()
    configure_logging("info", "json", stream=stream)
    rig = EngineRig(tmp_path)
    try:
        ref = rig.claims.add("train", ["gpu-0"], namespace="ml")
        assert rig.engine.prepare([ref])[ref.uid].error == ""
        logging.getLogger("grpc.test").warning("a library line")
    finally:
        rig.engine.close()
        configure_logging("warning", "text")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    prepared = next(line for line in lines if line["msg"] == "claim prepared")
    assert list(prepared)[:4] == ["ts", "level", "logger", "msg"]
    stamp = datetime.fromisoformat(prepared["ts"].replace("Z", "+00:00"))
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", prepared["ts"]) and stamp.utcoffset() == timedelta(
        0
    )
    assert prepared["level"] == "info" and prepared["logger"] == "dra_driver.plugin.engine"
    assert prepared["claim_uid"] == ref.uid and prepared["devices"] == ["gpu-0"]
    assert "event" not in prepared and "timestamp" not in prepared
    library = next(line for line in lines if line["msg"] == "a library line")
    assert (library["level"], library["logger"]) == ("warning", "grpc.test") and library["ts"].endswith("Z")


def test_lines_go_to_the_stderr_of_the_moment_not_one_closed_since(monkeypatch: pytest.MonkeyPatch) -> None:
    """Configured without a stream, logging writes to whatever sys.stderr is then: a stderr replaced and closed after
    configuring (a test's capture, a daemon's redirect) must not make every later line raise in its thread."""
    import structlog

    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    try:
        configure_logging("info", "json")
        first.close()
        monkeypatch.setattr(sys, "stderr", second)
        structlog.get_logger("t").info("after the swap")
        logging.getLogger("lib").warning("a library's line")
    finally:
        configure_logging("warning", "text")
    lines = [json.loads(line) for line in second.getvalue().splitlines()]
    assert [line["msg"] for line in lines] == ["after the swap", "a library's line"]
