"""The fake's NVLink fabric: node files set it per node, per group or per GPU; faults are set at run time in the
state (file) and seen by another process; bad fabric fields are named in the error."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from dra_driver.nvml.fake.backend import FakeNvml, FakeSettings
from dra_driver.nvml.fake.nodefile import SpecError, parse_node_text
from dra_driver.nvml.fake.state import FakeStateError, read_fake_state
from dra_driver.nvml.types import FabricHealth, FabricInfo, FabricState, NvmlReturn
from tests.narrow import present

CLUSTER = "5c3e7a1f-2b4d-4e8a-9f61-0d2c8b7a4e13"

NODE = f"""
name: tray
nvlink: nvswitch
fabric: {{state: completed, clique_id: 4, cluster_uuid: "{CLUSTER.upper()}", health: healthy}}
gpus:
  - model: H100-SXM5-80GB
    count: 2
  - model: H100-SXM5-80GB
    count: 2
    fabric:
      - {{state: in_progress}}
      - {{state: completed, status: not_ready, clique_id: 4, cluster_uuid: "{CLUSTER}", health: unhealthy}}
  - model: H100-SXM5-80GB
    fabric: none
  - model: H100-SXM5-80GB
    fabric: {{state: not_supported}}
"""


def _fake(text: str = NODE, **settings: object) -> FakeNvml:
    fake = FakeNvml(parse_node_text(text), FakeSettings(**settings))  # type: ignore[arg-type]
    fake.init()
    return fake


def test_node_group_and_per_gpu_fabric() -> None:
    fake = _fake()
    got = [fake.fabric_info(g.uuid) for g in fake.gpus()]
    node_wide = FabricInfo(FabricState.COMPLETED, NvmlReturn.SUCCESS, 4, CLUSTER, FabricHealth.HEALTHY)
    assert got[:2] == [node_wide, node_wide]  # the cluster UUID is written lower-case, as NVML's text is
    assert got[2] == FabricInfo(FabricState.IN_PROGRESS, NvmlReturn.SUCCESS, 0, "00000000-0000-0000-0000-000000000000")
    assert got[3] == FabricInfo(FabricState.COMPLETED, NvmlReturn.NOT_READY, 4, CLUSTER, FabricHealth.UNHEALTHY)
    assert got[4] is None  # "none": no fabric at all
    assert got[5] is None  # state NOT_SUPPORTED answers None, as the real backend does
    assert present(got[0]).clique == f"{CLUSTER}.4" and present(got[3]).clique is None


@pytest.mark.parametrize(
    ("fabric", "message"),
    [
        ("fabric: [{state: completed}]", "gpus[0].fabric: has 1 entries but count is 2; give one per GPU"),
        ("fabric: {state: done}", "gpus[0].fabric.state: must be one of not_supported, not_started, in_progress"),
        ("fabric: {state: completed, health: fine}", "gpus[0].fabric.health: must be one of not_supported, healthy"),
        ("fabric: {state: completed, cluster_uuid: rack-1}", "gpus[0].fabric.cluster_uuid: not a UUID: 'rack-1'"),
        ("fabric: {state: completed, clique_id: -1}", "gpus[0].fabric.clique_id"),
        ("fabric: {state: completed, status: fine}", "gpus[0].fabric.status: must be one of success"),
        ("fabric: {state: completed, colour: red}", "gpus[0].fabric.colour"),
    ],
)
def test_bad_fabric_fields_are_named(fabric: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_node_text(f"gpus:\n  - model: H100-SXM5-80GB\n    count: 2\n    {fabric}\n")
    assert message in str(err.value)


def test_a_fault_set_at_run_time_is_seen_by_another_process(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    fake = FakeNvml.preset("gb200-nvl72", seed="tray-0", settings=FakeSettings(state_path=state))
    fake.init()
    gpu = fake.gpus()[2].uuid
    healthy = present(fake.fabric_info(gpu))
    fake.set_fabric(gpu, replace(healthy, state=FabricState.IN_PROGRESS))
    assert read_fake_state(state).fabric_of(gpu) == replace(healthy, state=FabricState.IN_PROGRESS)
    assert json.loads(state.read_text())["fabric"][gpu]["state"] == "in_progress"
    # Another process with the same node and state file (a kubelet plugin) reads the fault.
    script = (
        "from dra_driver.nvml.fake.backend import FakeNvml, FakeSettings\n"
        "from pathlib import Path\n"
        f"f = FakeNvml.preset('gb200-nvl72', seed='tray-0', settings=FakeSettings(state_path=Path({str(state)!r})))\n"
        "f.init()\n"
        "print(';'.join(str(f.fabric_info(g.uuid).state.name) for g in f.gpus()))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "COMPLETED;COMPLETED;IN_PROGRESS;COMPLETED"
    # A second fault replaces the first; None goes back to the node description.
    fake.set_fabric(gpu, replace(healthy, health_summary=FabricHealth.UNHEALTHY, status=NvmlReturn.UNKNOWN))
    assert present(fake.fabric_info(gpu)).status is NvmlReturn.UNKNOWN
    fake.set_fabric(gpu, None)
    assert fake.fabric_info(gpu) == healthy
    assert "fabric" in json.loads(state.read_text()) and read_fake_state(state).fabric == ()


def test_set_fabric_refuses_an_unknown_gpu() -> None:
    fake = _fake()
    with pytest.raises(ValueError, match="set_fabric: unknown GPU uuid 'GPU-nope'"):
        fake.set_fabric("GPU-nope", None)


def test_a_state_file_without_fabric_reads_as_the_node_description(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    fake = FakeNvml.preset("gb200-nvl72", settings=FakeSettings(state_path=state))
    fake.init()
    doc = json.loads(state.read_text())
    del doc["fabric"]
    state.write_text(json.dumps(doc))
    assert present(fake.fabric_info(fake.gpus()[0].uuid)).state is FabricState.COMPLETED


def test_a_bad_fabric_entry_in_the_state_file_is_a_clear_error(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    fake = FakeNvml.preset("gb200-nvl72", settings=FakeSettings(state_path=state))
    fake.init()
    gpu = fake.gpus()[0].uuid
    doc = json.loads(state.read_text())
    doc["fabric"] = {gpu: {"state": "sideways"}}
    state.write_text(json.dumps(doc))
    with pytest.raises(FakeStateError, match=r"fabric\..*state: must be one of"):
        fake.fabric_info(gpu)
