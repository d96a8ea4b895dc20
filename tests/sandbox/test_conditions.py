"""dra_sandbox.conditions: the status condition of a type, as the e2e checks, the demo and the taint evictor read it."""

from __future__ import annotations

from dra_sandbox.conditions import status_condition


def test_the_first_condition_of_the_type_or_none() -> None:
    ready = {"type": "Ready", "status": "True"}
    obj = {"status": {"conditions": ["junk", {"type": "Other"}, ready, {"type": "Ready", "status": "False"}]}}
    assert status_condition(obj, "Ready") is ready
    assert status_condition(obj, "Missing") is None
    assert status_condition({"status": {}}, "Ready") is None
    assert status_condition({}, "Ready") is None
    assert status_condition(None, "Ready") is None
