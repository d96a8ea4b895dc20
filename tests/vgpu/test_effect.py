"""The vGPU effect, step by step, on a fake vGPU host: a claim gets a vGPU of its type on a free VF (recorded before
it is made), its CDI spec names the VF's VFIO node, unprepare destroys it; the refusals (one type per GPU, a GPU in
other use, MIG mode, vGPU off) leave nothing made; a vGPU another tool made is never touched; and a crash at every
point of prepare and unprepare is recovered with no vGPU leaked or destroyed twice."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.plugin.checkpoint import ClaimState
from dra_driver.plugin.faults import PREPARE_POINTS, UNPREPARE_POINTS, VGPU_POINTS
from tests.plugin.vfiorig import Crashed, SnapshotFaults, vfio_config
from tests.vgpu.vgpurig import VgpuRig

SMALL = "gpu-0-vgpu-h100-20c-0"  # type 904, four per GPU
SMALL_2 = "gpu-0-vgpu-h100-20c-1"
BIG = "gpu-0-vgpu-h100-40c-0"  # type 902, two per GPU
WHOLE = "gpu-0"
GPU0_VF0, GPU0_VF1 = "0000:18:00.4", "0000:18:00.5"


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[VgpuRig]:
    r = VgpuRig(tmp_path)
    yield r
    r.engine.close()


def test_prepare_makes_the_vgpu_on_a_free_vf_and_unprepare_destroys_it(rig: VgpuRig) -> None:
    ref = rig.claims.add("vm", [SMALL], config=vfio_config("PreferIommuFD"))
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    assert rig.typed() == {GPU0_VF0: 904}
    record = rig.checkpoint.load().claims[ref.uid]
    assert record.state is ClaimState.PREPARE_COMPLETED
    vgpu = record.devices[0].vgpu
    assert vgpu is not None and (vgpu.vf, vgpu.type_id, vgpu.type_name) == (GPU0_VF0, 904, "NVIDIA H100-20C")
    assert vgpu.group is not None and vgpu.vfio_dev is not None
    spec = json.loads(rig.spec_path(ref.uid).read_bytes())
    device = spec["devices"][0]["containerEdits"]
    assert device["deviceNodes"] == [{"path": f"/dev/vfio/devices/{vgpu.vfio_dev}", "hostPath": "/dev/null"}]
    assert f"DRA_DEVICE_GPU_0_VGPU_H100_20C_0_PCI_BUS_ID={GPU0_VF0}" in device["env"]
    assert "DRA_DEVICE_GPU_0_VGPU_H100_20C_0_VGPU_TYPE=NVIDIA H100-20C" in device["env"]
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]  # the VM's container gets no GPU
    assert rig.rediscoveries == 1  # the GPU now offers its vGPU type alone

    raw = rig.spec_path(ref.uid).read_bytes()
    assert rig.engine.prepare([ref])[ref.uid].error == ""  # repeated: verified, nothing made again
    assert rig.typed() == {GPU0_VF0: 904} and rig.spec_path(ref.uid).read_bytes() == raw

    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    assert rig.typed() == {}
    assert rig.checkpoint.load().claims == {} and not rig.spec_path(ref.uid).exists()
    assert rig.rediscoveries == 2


def test_the_group_node_without_iommufd(rig: VgpuRig) -> None:
    ref = rig.claims.add("vm", [SMALL], config=vfio_config("LegacyOnly", api_device=True))
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    vgpu = rig.checkpoint.load().claims[ref.uid].devices[0].vgpu
    assert vgpu is not None
    spec = json.loads(rig.spec_path(ref.uid).read_bytes())
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": f"/dev/vfio/{vgpu.group}",
                                                                    "hostPath": "/dev/null"}]  # fmt: skip
    assert spec["containerEdits"]["deviceNodes"] == [{"path": "/dev/vfio/vfio", "hostPath": "/dev/null"}]


def test_two_claims_of_one_type_take_two_vfs(rig: VgpuRig) -> None:
    a = rig.claims.add("vm-a", [SMALL])
    b = rig.claims.add("vm-b", [SMALL_2])
    assert rig.engine.prepare([a])[a.uid].error == "" and rig.engine.prepare([b])[b.uid].error == ""
    assert rig.typed() == {GPU0_VF0: 904, GPU0_VF1: 904}
    assert rig.engine.unprepare([a]) == {a.uid: ""}
    assert rig.typed() == {GPU0_VF1: 904}  # b's vGPU stays


def _refused(rig: VgpuRig, name: str, devices: list[str], text: str) -> None:
    before = rig.typed()
    ref = rig.claims.add(name, devices)
    error = rig.engine.prepare([ref])[ref.uid].error
    assert text in error, error
    assert rig.typed() == before  # nothing made
    assert ref.uid not in rig.checkpoint.load().claims and not rig.spec_path(ref.uid).exists()


def test_another_type_on_the_gpu_is_refused(rig: VgpuRig) -> None:
    ref = rig.claims.add("vm", [SMALL])
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    _refused(rig, "vm-big", [BIG], "hosts one vGPU type at a time")


def test_a_container_claim_on_the_gpu_and_a_vgpu_exclude_each_other(rig: VgpuRig) -> None:
    ref = rig.claims.add("vm", [SMALL])
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    _refused(rig, "pod", [WHOLE], "is already prepared for claim default/vm")  # the engine's overlap check
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    pod = rig.claims.add("pod2", [WHOLE])
    assert rig.engine.prepare([pod])[pod.uid].error == ""
    _refused(rig, "vm2", [SMALL], "is already prepared for claim default/pod2")


def test_mixing_a_vgpu_with_container_devices_in_one_claim_is_refused(rig: VgpuRig) -> None:
    _refused(rig, "mixed", [SMALL, "gpu-1"], "mixes vGPU devices")


def test_a_gpu_in_mig_mode_creates_nothing(rig: VgpuRig) -> None:
    rig.nvml.set_mig_mode(rig.devices[SMALL].gpu.uuid, True)
    _refused(rig, "vm", [SMALL], "can create vGPU type NVIDIA H100-20C (904)")


def test_a_vgpu_another_tool_made_is_never_touched(rig: VgpuRig) -> None:
    rig.vgpu.set_vgpu_type(GPU0_VF0, 902)  # an admin's 40C on the first VF
    _refused(rig, "vm", [SMALL], "holds vGPUs of type id 902")
    ref = rig.claims.add("vm-big", [BIG])
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    assert rig.typed() == {GPU0_VF0: 902, GPU0_VF1: 902}  # ours on the next free VF
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    rig.engine.close()
    rig.restart().recovery.recover()  # startup with no record naming the admin's vGPU: kept
    assert rig.typed() == {GPU0_VF0: 902}


def test_without_vgpu_enabled_a_vgpu_device_is_refused(tmp_path: Path) -> None:
    rig = VgpuRig(tmp_path, enabled=False)
    _refused(rig, "vm", [SMALL], "does not make vGPUs (--vgpu none)")
    rig.engine.close()


# --- crashes -------------------------------------------------------------------------------------

PREPARE_CRASHES = [*PREPARE_POINTS, "vgpu:after-record", "vgpu:after-create"]
UNPREPARE_CRASHES = [*UNPREPARE_POINTS, "vgpu:after-destroy"]


def test_every_vgpu_point_is_exercised() -> None:
    assert set(PREPARE_CRASHES + UNPREPARE_CRASHES) >= set(VGPU_POINTS)


@pytest.mark.parametrize("point", PREPARE_CRASHES)
def test_a_crash_in_prepare_is_recovered(rig: VgpuRig, point: str) -> None:
    ref = rig.claims.add("vm", [SMALL])
    faults = SnapshotFaults(rig, point)
    rig.engine.close()
    engine = rig.restart(faults)
    with pytest.raises(Crashed):
        engine.prepare([ref])
    engine.close()
    faults.restore()  # the node as the SIGKILL left it
    engine = rig.restart()
    engine.recovery.recover()  # a PrepareStarted record is rolled back (its vGPU destroyed), a completed one kept
    record = rig.checkpoint.load().claims.get(ref.uid)
    if record is None:
        assert rig.typed() == {}  # nothing leaked
    assert engine.prepare([ref])[ref.uid].error == ""  # the kubelet's retry
    assert list(rig.typed().values()) == [904]  # exactly one vGPU
    assert engine.unprepare([ref]) == {ref.uid: ""}
    assert rig.typed() == {} and rig.checkpoint.load().claims == {}


@pytest.mark.parametrize("point", UNPREPARE_CRASHES)
def test_a_crash_in_unprepare_is_finished(rig: VgpuRig, point: str) -> None:
    ref = rig.claims.add("vm", [SMALL])
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    faults = SnapshotFaults(rig, point)
    rig.engine.close()
    engine = rig.restart(faults)
    with pytest.raises(Crashed):
        engine.unprepare([ref])
    engine.close()
    faults.restore()
    engine = rig.restart()
    engine.recovery.recover()
    assert engine.unprepare([ref]) == {ref.uid: ""}  # the kubelet's retry
    assert rig.typed() == {}
    assert rig.checkpoint.load().claims == {} and not rig.spec_path(ref.uid).exists()
