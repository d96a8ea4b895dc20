"""Every log line about a claim carries its namespace, name and UID — also lines logged deep in MIG code."""

from __future__ import annotations

import io
import json
from pathlib import Path

from dra_driver.inventory.catalog import MigPolicy
from dra_driver.observability.logging import configure_logging
from tests.plugin.conftest import EngineRig


def test_claim_fields_on_every_line(tmp_path: Path) -> None:
    stream = io.StringIO()
    configure_logging("debug", "json", stream=stream)
    rig = EngineRig(tmp_path, policy=MigPolicy.DYNAMIC)
    try:
        ref = rig.claims.add("train", ["gpu-0-mig-1g10gb-19-6"], namespace="ml")
        assert rig.engine.prepare([ref])[ref.uid].error == ""
        assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    finally:
        rig.engine.close()
        configure_logging("warning", "text")
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{")]
    events = {line["event"] for line in lines}
    assert {"MIG device created", "claim prepared", "claim unprepared"} <= events
    for line in lines:
        assert (line["claim_namespace"], line["claim_name"], line["claim_uid"]) == ("ml", "train", ref.uid), line
        assert "status" not in line and "spec" not in line  # no objects dumped
