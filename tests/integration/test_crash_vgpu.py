"""SIGKILL the real plugin at each vGPU crash point of a vGPU claim on a fake vGPU host (SR-IOV VFs, and mediated
devices); restart it; startup recovery and the kubelet's retry must converge: the claim prepared once with exactly one
vGPU of its type, and once it is unprepared no vGPU of it left and none of anyone else's gone (docs/vgpu.md)."""

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
# The vGPU points only (about 4 s a case on a quiet 2-core machine): the engine's own points around them are killed
# in-process for vGPU claims by tests/vgpu. One GPU per case: cases must not step on each other in a cluster.
PREPARE_POINTS = ("vgpu:after-record", "vgpu:after-create")
GPUS = {"sriov": iter(range(8)), "mdev": iter(range(8))}


@pytest.fixture(scope="module", params=["sriov", "mdev"])
def host(request: pytest.FixtureRequest) -> Iterator[tuple[str, SandboxCluster]]:
    mdev = ",vgpu_mdev=true" if request.param == "mdev" else ""
    node = NodeSpec(NODE, f"fake:dgx-h100,mig=off,vgpu=true{mdev}", mig_mode="static",
                    plugin_env={"DRA_DRIVER_VGPU": "all"})  # fmt: skip
    with sandbox("dra-vg-", [node]) as c:
        yield request.param, c


def _typed(cluster: SandboxCluster) -> dict[str, int]:
    """Every vGPU of the node, by VF address or mdev UUID (the fake's state on disk)."""
    state = read_fake_state(cluster.plugins[NODE].state_file)
    return {**dict(state.vgpu), **{u: t for u, _, t, _ in state.mdevs}}


def _prepared(cluster: SandboxCluster, ref: ClaimRef, device: str, before: dict[str, int]) -> None:
    record = checkpoint(cluster).claims[ref.uid]
    assert record.state is ClaimState.PREPARE_COMPLETED
    [prepared] = record.devices
    assert prepared.device == device and prepared.vgpu is not None and prepared.vgpu.started
    assert len(spec_files(cluster, ref.uid)) == 1
    new = {k: t for k, t in _typed(cluster).items() if k not in before}
    assert new == {prepared.vgpu.vf or prepared.vgpu.mdev: TYPE_20C}  # exactly this claim's one vGPU


def _released(cluster: SandboxCluster, ref: ClaimRef, before: dict[str, int]) -> None:
    assert ref.uid not in checkpoint(cluster).claims
    assert spec_files(cluster, ref.uid) == []
    assert _typed(cluster) == before  # nothing of this claim's left, nothing of another's gone


@pytest.mark.parametrize("point", PREPARE_POINTS)
def test_crash_during_a_vgpu_prepare_converges(host: tuple[str, SandboxCluster], point: str) -> None:
    kind, cluster = host
    device = f"gpu-{next(GPUS[kind])}-vgpu-h100-20c-0"
    before = _typed(cluster)
    ref = allocated_claim(cluster, [device])
    crash_in_prepare_then_retry(cluster, point, ref, prepared=lambda: _prepared(cluster, ref, device, before),
                                released=lambda: _released(cluster, ref, before))  # fmt: skip


def test_crash_during_a_vgpu_unprepare_converges(host: tuple[str, SandboxCluster]) -> None:
    kind, cluster = host
    device = f"gpu-{next(GPUS[kind])}-vgpu-h100-20c-0"
    before = _typed(cluster)
    ref = allocated_claim(cluster, [device])
    crash_in_unprepare_then_retry(cluster, "vgpu:after-destroy", ref,
                                  prepared=lambda: _prepared(cluster, ref, device, before),
                                  released=lambda: _released(cluster, ref, before))  # fmt: skip
