"""The `policies` expectation (a GpuSharingPolicy's Ready condition) and `applyFails` steps (refused at apply):
loading, validation mistakes with their paths, and evaluation against observed objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_sandbox.e2e.expect import Observation, evaluate
from dra_sandbox.e2e.loader import ScenarioError, load_scenario
from dra_sandbox.e2e.scenario import Expectations, ObjectRef, PolicyExpect

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "e2e" / "scenarios"

POLICY = """
apiVersion: gpu.dra.dev/v1beta1
kind: GpuSharingPolicy
metadata:
  name: e2e-x-policy
spec:
  devices: {type: gpu}
"""
CLAIM = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: bad
spec:
  devices:
    requests:
      - name: gpu
        exactly: {deviceClassName: gpu.dra.dev}
"""


def test_the_shipped_scenarios_use_both() -> None:
    not_ready = load_scenario(SCENARIOS / "policy-not-ready")
    assert not_ready.steps[0].expect.policies == (PolicyExpect(
        "e2e-policy-not-ready-bad-limit", "False", "^InvalidSpec$",
        r"spec\.sharing\.mpsConfig\.defaultPinnedDeviceMemoryLimit"),)
    assert not_ready.steps[1].expect.policies[0].reason == "^DeviceClassConflict$"
    refused = load_scenario(SCENARIOS / "webhook-refuses-bad-config")
    assert set(refused.steps[0].apply_fails) == {"bad-claim.yaml"}
    assert refused.steps[0].apply == () and refused.steps[0].expect == Expectations()
    # A refused file's objects are never live: `gone` may name them, and nothing deletes them.
    assert refused.steps[1].expect.gone == (ObjectRef("ResourceClaim", "too-many-threads", "e2e-webhook-refuses-bad-config"),)


def scenario(tmp_path: Path, expect: str) -> Path:
    directory = tmp_path / "x"
    directory.mkdir()
    (directory / "policy.yaml").write_text(POLICY)
    (directory / "claim.yaml").write_text(CLAIM)
    (directory / "expect.yaml").write_text(expect)
    return directory


@pytest.mark.parametrize(("steps", "expected"), [
    ("  - apply: [claim.yaml]\n    expect: {policies: {e2e-x-policy: {ready: 'False'}}}\n"
     "  - apply: [policy.yaml]\n    expect: {policies: {e2e-x-policy: {ready: 'True'}}}\n",
     "steps[0].expect.policies.e2e-x-policy: GpuSharingPolicy 'e2e-x-policy' is not present"),
    ("  - apply: [policy.yaml]\n    expect: {policies: {e2e-x-policy: {ready: 'Maybe'}}}\n"
     "  - applyFails: {claim.yaml: denied}\n",
     "steps[0].expect.policies.e2e-x-policy.ready"),
    ("  - apply: [policy.yaml]\n    expect: {policies: {e2e-x-policy: {ready: 'True', message: '('}}}\n"
     "  - applyFails: {claim.yaml: denied}\n",
     "invalid regular expression"),
    ("  - apply: [policy.yaml]\n    applyFails: {claim.yaml: denied}\n    expect: {gone: [ResourceClaim/bad]}\n",
     "needs exactly one of apply (files), delete (objects or files), applyFails (files) or nvidiaDriver"),
    ("  - apply: [policy.yaml, claim.yaml]\n",
     "needs expect (only an applyFails step may leave it out)"),
    ("  - apply: [policy.yaml]\n    expect: {policies: {e2e-x-policy: {ready: 'True'}}}\n"
     "  - applyFails: {nope.yaml: denied}\n  - applyFails: {claim.yaml: denied}\n",
     "steps[1].applyFails.nope.yaml"),
])
def test_mistakes_name_their_field(tmp_path: Path, steps: str, expected: str) -> None:
    directory = scenario(tmp_path, f"description: x\nsteps:\n{steps}")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(directory)
    assert any(expected in p for p in caught.value.problems), caught.value.problems


def policy(status: dict[str, Any] | None, generation: int = 2) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "p", "generation": generation}}
    if status is not None:
        obj["status"] = status
    return obj


def ready(status: str, reason: str, message: str, observed: int = 2) -> dict[str, Any]:
    return {"observedGeneration": observed,
            "conditions": [{"type": "Ready", "status": status, "reason": reason, "message": message}]}


@pytest.mark.parametrize(("seen", "failure"), [
    (None, "policies.p.ready: want False; saw no such policy"),
    (policy(None), "policies.p.ready: want False; saw no Ready condition for generation 2 yet"),
    (policy(ready("False", "InvalidSpec", "spec.x: bad", observed=1)),
     "policies.p.ready: want False; saw no Ready condition for generation 2 yet"),
    (policy(ready("True", "DeviceClassReady", "ok")), "policies.p.ready: want False; saw Ready=True"),
    (policy(ready("False", "DeviceClassConflict", "spec.x: bad")), "policies.p.reason: want a match for 'Invalid'"),
    (policy(ready("False", "InvalidSpec", "spec.y: bad")), r"policies.p.message: want a match for 'spec\\.x'"),
    (policy(ready("False", "InvalidSpec", "spec.x: bad")), None),
])
def test_policy_expectations_are_checked_against_the_condition(seen: dict[str, Any] | None,
                                                                failure: str | None) -> None:
    want = Expectations(policies=(PolicyExpect("p", "False", "Invalid", r"spec\.x"),))
    failures = [str(f) for f in evaluate(want, Observation(policies={"p": seen}), {})]
    if failure is None:
        assert failures == []
    else:
        assert len(failures) == 1 and failures[0].startswith(failure), failures
