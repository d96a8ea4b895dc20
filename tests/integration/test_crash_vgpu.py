"""SIGKILL the real plugin at each vGPU crash point (and around them) of a vGPU claim on a fake vGPU host; restart it;
startup recovery and the kubelet's retry must converge: the claim prepared once with exactly one vGPU of its type on
its GPU, and once it is unprepared no vGPU left, none destroyed twice (the fake refuses nothing twice: a second
destroy of a VF without a type is a no-op, a second create of a typed VF EBUSY) (docs/vgpu.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dra_driver.nvml.fake.state import read_fake_state
from dra_driver.plugin.checkpoint import ClaimState
from dra_sandbox.cluster import NodeSpec, SandboxCluster
from dra_sandbox.kubelet.draclient import ClaimRef
from tests.integration.conftest import NODE, allocated_claim, checkpoint, sandbox, spec_files
from tests.integration.test_crash import crash_in_prepare_then_retry, crash_in_unprepare_then_retry

TYPE_20C = 904  # the fake's quarter of a GPU (docs/fake-nvml.md, "vGPU")
# One GPU per case: cases must not step on each other inside the module's cluster.
GPUS = iter(range(8))


@pytest.fixture(scope="module")
def cluster() -> Iterator[SandboxCluster]:
    node = NodeSpec(NODE, "fake:dgx-h100,mig=off,vgpu=true", mig_mode="static", plugin_env={"DRA_DRIVER_VGPU": "all"})
    with sandbox("dra-vg-", [node]) as c:
        yield c


def _typed(cluster: SandboxCluster) -> dict[str, int]:
    return dict(read_fake_state(cluster.plugins[NODE].state_file).vgpu)


def _prepared(cluster: SandboxCluster, ref: ClaimRef, device: str) -> None:
    record = checkpoint(cluster).claims[ref.uid]
    assert record.state is ClaimState.PREPARE_COMPLETED
    [prepared] = record.devices
    assert prepared.device == device and prepared.vgpu is not None and prepared.vgpu.vf is not None
    assert len(spec_files(cluster, ref.uid)) == 1
    typed = _typed(cluster)
    assert typed.get(prepared.vgpu.vf) == TYPE_20C
    assert sum(1 for vf in typed if vf.startswith(prepared.vgpu.vf.rsplit(":", 1)[0])) == 1  # one vGPU on the GPU


def _released(cluster: SandboxCluster, ref: ClaimRef, before: dict[str, int]) -> None:
    assert ref.uid not in checkpoint(cluster).claims
    assert spec_files(cluster, ref.uid) == []
    assert _typed(cluster) == before  # nothing of this claim's left, nothing of another's gone


# The vGPU points only: each case restarts the plugin three times (about 25 s on 2 cores); the engine's own points
# around them are killed in-process for vGPU claims by tests/vgpu/test_effect.py.
@pytest.mark.parametrize("point", ["vgpu:after-record", "vgpu:after-create"])
def test_crash_during_a_vgpu_prepare_converges(cluster: SandboxCluster, point: str) -> None:
    device = f"gpu-{next(GPUS)}-vgpu-h100-20c-0"
    before = _typed(cluster)
    ref = allocated_claim(cluster, [device])
    crash_in_prepare_then_retry(cluster, point, ref, prepared=lambda: _prepared(cluster, ref, device),
                                released=lambda: _released(cluster, ref, before))  # fmt: skip


@pytest.mark.parametrize("point", ["vgpu:after-destroy"])
def test_crash_during_a_vgpu_unprepare_converges(cluster: SandboxCluster, point: str) -> None:
    device = f"gpu-{next(GPUS)}-vgpu-h100-20c-0"
    before = _typed(cluster)
    ref = allocated_claim(cluster, [device])
    crash_in_unprepare_then_retry(cluster, point, ref, prepared=lambda: _prepared(cluster, ref, device),
                                  released=lambda: _released(cluster, ref, before))  # fmt: skip
