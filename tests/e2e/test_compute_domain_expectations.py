"""The compute-domain parts of the e2e format: `cluster: compute-domains`, `computeDomains` (status.status and the
node count) and container `deviceNodes`, loaded from the shipped scenarios, refused when wrong, and evaluated."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_sandbox.e2e.backend import ContainerView, PodView
from dra_sandbox.e2e.expect import Observation, evaluate
from dra_sandbox.e2e.loader import ScenarioError, load_scenario
from dra_sandbox.e2e.scenario import ComputeDomainExpect, ContainerExpect, Expectations, PodExpect

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "e2e" / "scenarios"
CHANNEL0 = "/dev/nvidia-caps-imex-channels/channel0"
CD_SCENARIOS = ("compute-domain-2node", "compute-domain-4node", "compute-domain-node-churn",
                "compute-domain-delete-while-running", "nvidia-imex-channel-injection",
                "nvidia-imex-channel-injection-all")


@pytest.mark.parametrize("name", CD_SCENARIOS)
def test_the_shipped_compute_domain_scenarios_load(name: str) -> None:
    scenario = load_scenario(SCENARIOS / name)
    assert scenario.cluster == "compute-domains"
    first = scenario.steps[0].expect
    assert first.compute_domains and first.compute_domains[0].status == "Ready"
    assert all(CHANNEL0 in c.device_nodes for p in first.pods for c in p.containers.values())


def test_mistakes_are_refused_with_their_paths(tmp_path: Path) -> None:
    directory = tmp_path / "cd-bad"
    directory.mkdir()
    (directory / "cd.yaml").write_text("apiVersion: gpu.dra.dev/v1beta1\nkind: ComputeDomain\nmetadata: {name: d}\n"
                                       "spec: {numNodes: 1, channel: {resourceClaimTemplate: {name: t}}}\n")
    (directory / "expect.yaml").write_text(
        "description: x\ncluster: compute-domain\nsteps:\n  - apply: [cd.yaml]\n"
        "    expect:\n      computeDomains:\n        d: {status: Ready, nodes: -1}\n        other: {status: Ready}\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(directory)
    text = str(info.value)
    assert "cluster" in text and "compute-domains" in text
    assert "computeDomains.d.nodes" in text
    assert "ComputeDomain 'other' is not defined" in text


def _observation(status: str, nodes: int, device_nodes: tuple[str, ...]) -> Observation:
    domain = {"metadata": {"name": "d"},
              "status": {"status": status, "nodes": [{"name": f"n{i}", "status": "Ready"} for i in range(nodes)]}}
    view = ContainerView(env={}, runtime="cdi-check", executed=False, device_nodes=device_nodes)
    pod = PodView("w", True, "Running", "n0", "gb200-a", "", {"ctr": view})
    return Observation(pods={"w": pod}, compute_domains={"d": domain})


def test_evaluation_reports_status_count_and_device_nodes() -> None:
    want = Expectations(
        pods=(PodExpect("w", "Running", containers={"ctr": ContainerExpect(device_nodes=(CHANNEL0,))}),),
        compute_domains=(ComputeDomainExpect("d", "Ready", 2),))
    assert evaluate(want, _observation("Ready", 2, (CHANNEL0,)), {}) == []
    failures = evaluate(want, _observation("NotReady", 1, ()), {})
    assert [f.what for f in failures] == ["pods.w.containers.ctr.deviceNodes", "computeDomains.d.status"]
    assert "n0=Ready" in failures[1].seen
    (count,) = evaluate(want, _observation("Ready", 1, (CHANNEL0,)), {})
    assert count.what == "computeDomains.d.nodes" and count.want == "2 node(s)"
