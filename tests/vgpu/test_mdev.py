"""vGPUs as mediated devices (GPUs before Ampere and older vGPU releases; the fake's `vgpu_mdev=true`): the fake's
mdev rules, a claim's vGPU made under a UUID of its own (recorded first) and removed after, the refusals, a lost
checkpoint's rebuild adopting it by that UUID, and a crash at every vGPU point (docs/vgpu.md)."""

from __future__ import annotations

import errno
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.pci.model import PciError
from dra_driver.plugin.checkpoint import ClaimState
from dra_driver.plugin.vgpu import mdev_uuid
from tests.plugin.vfiorig import Crashed, SnapshotFaults
from tests.vgpu.vgpurig import VgpuRig

SMALL = "gpu-0-vgpu-h100-20c-0"  # type 904
BIG = "gpu-0-vgpu-h100-40c-0"  # type 902


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[VgpuRig]:
    r = VgpuRig(tmp_path, mdev=True)
    yield r
    r.engine.close()


def test_the_fakes_mdev_rules(rig: VgpuRig) -> None:
    gpu = rig.nvml.node.gpus[0].bus_id
    sysfs = rig.vgpu
    assert sysfs.virtual_functions(gpu) == ()
    assert {t.type_dir: t.available for t in sysfs.mdev_types(gpu)} == {
        "nvidia-901": 1, "nvidia-902": 2, "nvidia-904": 4, "nvidia-908": 8,
    }
    sysfs.create_mdev(gpu, "nvidia-904", "11111111-2222-3333-4444-555555555555")
    assert {t.type_dir: t.available for t in sysfs.mdev_types(gpu)} == {
        "nvidia-901": 0, "nvidia-902": 0, "nvidia-904": 3, "nvidia-908": 0,
    }
    made = sysfs.mdev("11111111-2222-3333-4444-555555555555")
    assert made is not None and (made.parent, made.type_dir, made.iommu_group) == (gpu, "nvidia-904", 400)
    for type_dir, uuid, code in [("nvidia-904", "11111111-2222-3333-4444-555555555555", errno.EEXIST),
                                 ("nvidia-902", "21111111-2222-3333-4444-555555555555", errno.EINVAL),
                                 ("nvidia-999", "31111111-2222-3333-4444-555555555555", errno.ENOENT)]:
        with pytest.raises(PciError) as refused:
            sysfs.create_mdev(gpu, type_dir, uuid)
        assert refused.value.errno == code
    sysfs.remove_mdev("11111111-2222-3333-4444-555555555555")
    with pytest.raises(PciError) as gone:
        sysfs.remove_mdev("11111111-2222-3333-4444-555555555555")
    assert gone.value.errno == errno.ENOENT
    assert rig.typed() == {}


def test_prepare_makes_a_mediated_device_of_the_claims_uuid_and_unprepare_removes_it(rig: VgpuRig) -> None:
    ref = rig.claims.add("vm", [SMALL])
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    name = mdev_uuid(ref.uid, SMALL)
    assert rig.typed() == {name: 904}
    vgpu = rig.checkpoint.load().claims[ref.uid].devices[0].vgpu
    assert vgpu is not None and (vgpu.mdev, vgpu.vf, vgpu.group) == (name, None, 400)
    spec = json.loads(rig.spec_path(ref.uid).read_bytes())
    device = spec["devices"][0]["containerEdits"]
    assert device["deviceNodes"] == [{"path": "/dev/vfio/400", "hostPath": "/dev/null"}]
    assert f"DRA_DEVICE_GPU_0_VGPU_H100_20C_0_MDEV_UUID={name}" in device["env"]
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    assert rig.typed() == {} and rig.checkpoint.load().claims == {}


def test_a_type_the_gpu_cannot_create_is_refused_before_anything_is_recorded(rig: VgpuRig) -> None:
    admins = "51111111-2222-3333-4444-555555555555"
    rig.vgpu.create_mdev(rig.nvml.node.gpus[0].bus_id, "nvidia-902", admins)  # a 40C no record names
    ref = rig.claims.add("vm", [SMALL])
    error = rig.engine.prepare([ref])[ref.uid].error
    assert "has no instance of vGPU type NVIDIA H100-20C available (nvidia-904/available_instances 0)" in error, error
    assert ref.uid not in rig.checkpoint.load().claims and rig.typed() == {admins: 902}


def test_a_lost_checkpoint_is_rebuilt_with_the_claims_mediated_device(rig: VgpuRig) -> None:
    ref = rig.claims.add("vm", [SMALL])
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    other = "41111111-2222-3333-4444-555555555555"
    rig.vgpu.create_mdev(rig.nvml.node.gpus[0].bus_id, "nvidia-904", other)  # an admin's, no record names it
    rig.engine.close()
    rig.checkpoint_path.unlink()  # lost
    engine = rig.restart()
    engine.recovery.recover()
    record = rig.checkpoint.load().claims[ref.uid]
    assert record.state is ClaimState.PREPARE_COMPLETED
    assert record.devices[0].vgpu is not None and record.devices[0].vgpu.mdev == mdev_uuid(ref.uid, SMALL)
    assert engine.unprepare([ref]) == {ref.uid: ""}
    assert rig.typed() == {other: 904}  # ours removed by its record, the admin's kept


@pytest.mark.parametrize("point", ["vgpu:after-record", "vgpu:after-create", "prepare:after-devices"])
def test_a_crash_in_prepare_is_recovered(rig: VgpuRig, point: str) -> None:
    ref = rig.claims.add("vm", [SMALL])
    faults = SnapshotFaults(rig, point)
    rig.engine.close()
    engine = rig.restart(faults)
    with pytest.raises(Crashed):
        engine.prepare([ref])
    engine.close()
    faults.restore()
    engine = rig.restart()
    engine.recovery.recover()
    if ref.uid not in rig.checkpoint.load().claims:
        assert rig.typed() == {}
    assert engine.prepare([ref])[ref.uid].error == ""
    assert rig.typed() == {mdev_uuid(ref.uid, SMALL): 904}
    assert engine.unprepare([ref]) == {ref.uid: ""}
    assert rig.typed() == {}


@pytest.mark.parametrize("point", ["vgpu:after-destroy", "unprepare:after-devices"])
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
    assert engine.unprepare([ref]) == {ref.uid: ""}
    assert rig.typed() == {} and rig.checkpoint.load().claims == {}


def test_a_mediated_device_left_by_a_lost_record_is_taken_up_by_its_claims_prepare(rig: VgpuRig) -> None:
    ref = rig.claims.add("vm", [SMALL])
    name = mdev_uuid(ref.uid, SMALL)
    rig.vgpu.create_mdev(rig.nvml.node.gpus[0].bus_id, "nvidia-904", name)  # made, then the record was lost
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    vgpu = rig.checkpoint.load().claims[ref.uid].devices[0].vgpu
    assert vgpu is not None and vgpu.mdev == name and rig.typed() == {name: 904}
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    assert rig.typed() == {}
