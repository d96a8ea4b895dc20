"""The node's NVLink clique from its GPUs' fabric info (NVIDIA's rules, problems instead of crashes), the label
helpers, and what `dra-driver inventory` shows."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from dra_driver.inventory import discover
from dra_driver.inventory.fabric import (
    CLIQUE_LABEL,
    NO_CLIQUE,
    NodeClique,
    clique_label_patch,
    clique_label_removal,
    clique_label_value,
    node_clique,
)
from dra_driver.nvml.fake.backend import FakeNvml, FakeSettings
from dra_driver.nvml.types import (
    Architecture,
    FabricHealth,
    FabricInfo,
    FabricState,
    GpuInfo,
    NvmlReturn,
)
from tests.narrow import present

CLUSTER = "5c3e7a1f-2b4d-4e8a-9f61-0d2c8b7a4e13"
OTHER = "0b9d1c2e-3f4a-4b5c-8d6e-7f8091a2b3c4"
ZERO = "00000000-0000-0000-0000-000000000000"
OK = FabricInfo(FabricState.COMPLETED, NvmlReturn.SUCCESS, 2, CLUSTER, FabricHealth.HEALTHY)


@dataclass(frozen=True)
class Gpu:
    info: GpuInfo
    fabric: FabricInfo | None


def gpus(*fabrics: FabricInfo | None) -> list[Gpu]:
    return [
        Gpu(
            GpuInfo(i, i, f"GPU-{i:08d}-0000-0000-0000-000000000000", "NVIDIA GB200", "Nvidia", Architecture.BLACKWELL,
                    (10, 0), None, f"0000:{i:02x}:00.0", 0x294110DE),
            fabric,
        )
        for i, fabric in enumerate(fabrics)
    ]


def test_gpus_that_agree_make_the_clique() -> None:
    assert node_clique(gpus(OK, OK, OK, OK)) == NodeClique(id=f"{CLUSTER}.2", problem=None)


@pytest.mark.parametrize(
    "fabrics",
    [
        (),  # a node without GPUs
        (None, None),  # no fabric (NOT_SUPPORTED)
        (replace(OK, state=FabricState.NOT_SUPPORTED),),
        (replace(OK, cluster_uuid=ZERO, clique_id=0),),  # HGX: a completed fabric that is not multi-node
    ],
)
def test_no_multi_node_fabric_is_no_clique_and_no_problem(fabrics: tuple[FabricInfo | None, ...]) -> None:
    assert node_clique(gpus(*fabrics)) == NO_CLIQUE


def test_gpus_without_fabric_do_not_count_against_the_others() -> None:
    # NVIDIA's rule: a GPU without fabric (or with a zero cluster UUID) is skipped, the rest decide.
    assert node_clique(gpus(None, OK, replace(OK, cluster_uuid=ZERO), OK)).id == f"{CLUSTER}.2"


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (replace(OK, state=FabricState.IN_PROGRESS), "GPU 1 (GPU-00000001-0000-0000-0000-000000000000): registration "
                                                      "IN_PROGRESS"),
        (replace(OK, state=FabricState.NOT_STARTED), "registration NOT_STARTED"),
        (replace(OK, status=NvmlReturn.NOT_READY), "registration failed with NVML_ERROR_NOT_READY"),
        # An unfinished registration is a problem even before the cluster UUID is known (NVIDIA checks state first).
        (replace(OK, state=FabricState.IN_PROGRESS, cluster_uuid=ZERO), "registration IN_PROGRESS"),
    ],
)
def test_an_unready_fabric_is_a_problem_naming_the_gpu_and_what_to_check(bad: FabricInfo, said: str) -> None:
    clique = node_clique(gpus(OK, bad, OK, OK))
    assert clique.id is None and not clique.degraded
    problem = present(clique.problem)
    assert said in problem
    assert "on 1 GPU(s)" in problem and "GPU 0 " not in problem
    assert "Fabric Manager" in problem and "NVLink switch trays" in problem


def test_every_gpu_at_fault_is_named() -> None:
    clique = node_clique(gpus(replace(OK, state=FabricState.IN_PROGRESS), OK, replace(OK, status=NvmlReturn.UNKNOWN)))
    problem = present(clique.problem)
    assert "on 2 GPU(s)" in problem and "GPU 0 " in problem and "GPU 2 " in problem and "GPU 1 " not in problem


@pytest.mark.parametrize(
    "other", [replace(OK, clique_id=3), replace(OK, cluster_uuid=OTHER)], ids=["clique", "cluster"]
)
def test_gpus_that_disagree_are_a_problem(other: FabricInfo) -> None:
    clique = node_clique(gpus(OK, OK, other))
    assert clique.id is None
    problem = present(clique.problem)
    assert "different NVLink cliques" in problem
    assert f"{CLUSTER}.2 on GPU 0 " in problem and other.clique is not None and other.clique in problem


@pytest.mark.parametrize("health", [FabricHealth.UNHEALTHY, FabricHealth.LIMITED_CAPACITY])
def test_a_degraded_fabric_keeps_the_clique_and_says_so(health: FabricHealth) -> None:
    clique = node_clique(gpus(OK, replace(OK, health_summary=health)))
    assert clique.id == f"{CLUSTER}.2" and clique.degraded
    assert f"GPU 1 (GPU-00000001-0000-0000-0000-000000000000): fabric health {health.name}" in present(clique.problem)


def test_no_health_summary_is_not_a_problem() -> None:
    assert node_clique(gpus(replace(OK, health_summary=FabricHealth.NOT_SUPPORTED))).problem is None


# --- the nvidia.com/gpu.clique label ---------------------------------------------------------------------------


def test_label_value_and_patches() -> None:
    good = NodeClique(id=f"{CLUSTER}.2", problem=None)
    assert CLIQUE_LABEL == "nvidia.com/gpu.clique"
    assert clique_label_value(good) == f"{CLUSTER}.2"
    assert clique_label_value(NodeClique(id=f"{CLUSTER}.2", problem="degraded")) == f"{CLUSTER}.2"
    assert clique_label_value(NodeClique(id=None, problem="not ready")) is None
    assert clique_label_patch(good, {}) == {"metadata": {"labels": {CLIQUE_LABEL: f"{CLUSTER}.2"}}}
    assert clique_label_patch(good, {CLIQUE_LABEL: f"{CLUSTER}.1"}) == {
        "metadata": {"labels": {CLIQUE_LABEL: f"{CLUSTER}.2"}}
    }
    assert clique_label_patch(good, {CLIQUE_LABEL: f"{CLUSTER}.2", "other": "x"}) is None
    # A node that lost its clique (fabric broke) loses the label, so selectors stop matching it.
    assert clique_label_patch(NodeClique(None, "not ready"), {CLIQUE_LABEL: f"{CLUSTER}.2"}) == {
        "metadata": {"labels": {CLIQUE_LABEL: None}}
    }
    assert clique_label_patch(NO_CLIQUE, None) is None
    assert clique_label_removal({CLIQUE_LABEL: "x"}) == {"metadata": {"labels": {CLIQUE_LABEL: None}}}
    assert clique_label_removal({"other": "x"}) is None


def test_an_invalid_label_value_is_never_sent() -> None:
    with pytest.raises(ValueError, match="not a valid label value"):
        clique_label_value(NodeClique(id="x" * 64, problem=None))


# --- discovery and the inventory command over the fake GB200 NVL72 tray -------------------------------------------


def test_discover_puts_fabric_on_every_gpu_and_the_clique_on_the_node() -> None:
    fake = FakeNvml.preset("gb200-nvl72", seed="tray-19", clique=1)
    fake.init()
    inv = discover(fake)
    assert inv.clique == NodeClique(id=f"{CLUSTER}.1", problem=None)
    assert all(present(g.fabric).health_summary is FabricHealth.HEALTHY for g in inv.gpus)
    assert discover(_started("hgx-h200")).clique == NO_CLIQUE  # completed, zero cluster UUID
    assert discover(_started("dgx-a100")).clique == NO_CLIQUE  # no fabric


def test_a_fabric_fault_becomes_a_problem_not_a_crash() -> None:
    fake = _started("gb200-nvl72")
    gpu = fake.gpus()[3].uuid
    fake.set_fabric(gpu, replace(present(fake.fabric_info(gpu)), state=FabricState.IN_PROGRESS))
    inv = discover(fake)
    assert inv.clique.id is None and f"GPU 3 ({gpu}): registration IN_PROGRESS" in present(inv.clique.problem)
    assert len(inv.gpus) == 4  # the GPUs are still inventoried


def _started(preset: str) -> FakeNvml:
    fake = FakeNvml.preset(preset)
    fake.init()
    return fake


def _inventory(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dra_driver.cli", "inventory", *args], capture_output=True,
                          text=True, timeout=60, check=False)


def test_the_inventory_command_shows_the_clique_and_the_fabric(tmp_path: Path) -> None:
    out = _inventory("--nvml", "fake:gb200-nvl72,clique=5", "-o", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["clique"] == {"id": f"{CLUSTER}.5", "problem": None}
    assert doc["gpus"][0]["fabric"] == {
        "state": "COMPLETED", "status": "SUCCESS", "cliqueId": 5, "clusterUuid": CLUSTER, "healthSummary": "HEALTHY",
    }
    assert out.stderr == ""
    assert json.loads(_inventory("--nvml", "fake:l4x2", "-o", "json").stdout)["clique"] == {"id": None, "problem": None}


def test_the_inventory_command_shows_a_fabric_problem_and_succeeds(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    fake = FakeNvml.preset("gb200-nvl72", settings=FakeSettings(state_path=state))
    fake.init()
    gpu = fake.gpus()[0].uuid
    fake.set_fabric(gpu, replace(present(fake.fabric_info(gpu)), status=NvmlReturn.UNKNOWN))
    out = _inventory("--nvml", f"fake:gb200-nvl72,state={state}", "-o", "json")
    assert out.returncode == 0, out.stderr
    clique = json.loads(out.stdout)["clique"]
    assert clique["id"] is None and "registration failed with NVML_ERROR_UNKNOWN" in clique["problem"]
    assert out.stderr.startswith("dra-driver inventory: warning: NVLink fabric not ready on 1 GPU(s)")
