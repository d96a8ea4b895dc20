"""Repair of a prepared Fabric Manager partition (plugin/fmpartition.py `repair`): FM restarted in shared NVSwitch
mode lists the partition inactive though its VM still runs; the plugin's verify sees it, and its repair (a repeated
prepare, or the startup recovery) activates it again; a member GPU moved off vfio-pci goes back first; a
re-activation FM refuses is reported and nothing is torn down."""

from __future__ import annotations

import pytest

from dra_driver.nvml.fabricmanager import FabricManagerError, FmReturn
from dra_driver.nvml.fake.fmpartitions import FakeFabricManager
from tests.fmpartition.fmrig import GPU0, GPU1, PAIR, FmRig


def _fm(rig: FmRig) -> FakeFabricManager:
    assert isinstance(rig.fm, FakeFabricManager)
    return rig.fm


def _damage(rig: FmRig, uid: str) -> list[str]:
    checkpoint = rig.checkpoint.load()
    return rig.engine.damage(checkpoint.claims[uid], checkpoint, rig.devices)


def test_a_partition_fm_lost_in_a_restart_is_activated_again(rig: FmRig) -> None:
    ref = rig.claims.add("vm", [PAIR])
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    _fm(rig).restart()
    assert rig.active() == []
    assert _damage(rig, ref.uid) == ["Fabric Manager partition 1 is not active"]
    assert rig.engine.prepare([ref])[ref.uid].error == ""  # the repeated prepare repairs it
    assert rig.active() == [1]
    assert rig.on_vfio() == [GPU0, GPU1]
    assert _damage(rig, ref.uid) == []
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    assert rig.active() == [] and rig.on_vfio() == []


def test_the_startup_recovery_repairs_it_too(rig: FmRig) -> None:
    ref = rig.claims.add("vm", [PAIR])
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    rig.engine.close()
    _fm(rig).restart()  # FM and the plugin restarted (a node agent upgrade, say)
    engine = rig.restart()
    report = engine.recovery.recover()
    assert ref.uid in report.repaired
    assert rig.active() == [1]


def test_a_member_moved_back_to_nvidia_is_rebound_before_the_activation(rig: FmRig) -> None:
    ref = rig.claims.add("vm", [PAIR])
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    _fm(rig).restart()
    rig.pci.unbind(GPU1, "vfio-pci")  # someone gave it back to the host behind the plugin's back
    rig.pci.set_driver_override(GPU1, None)
    rig.pci.bind(GPU1, "nvidia")
    assert _damage(rig, ref.uid) == [
        f"PCI function {GPU1} of the passed-through GPU is bound to nvidia, not vfio-pci",
        "Fabric Manager partition 1 is not active",
    ]
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    assert rig.on_vfio() == [GPU0, GPU1] and rig.active() == [1]  # FM activates only over vfio-bound GPUs


def test_a_refused_reactivation_is_reported_and_nothing_is_torn_down(rig: FmRig) -> None:
    ref = rig.claims.add("vm", [PAIR])
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    _fm(rig).restart()
    _fm(rig).set_activated((4,))  # someone else activated GPU 1's own partition meanwhile
    error = rig.engine.prepare([ref])[ref.uid].error
    assert "Fabric Manager partition 1 is inactive though this plugin activated it" in error, error
    assert "IN_USE" in error
    assert rig.active() == [4]  # the other's partition is not touched
    assert rig.on_vfio() == [GPU0, GPU1]  # the VM's GPUs stay where they are
    record = rig.checkpoint.load().claims[ref.uid].devices[0].fm_partition
    assert record is not None and record.activating  # the unprepare still deactivates what the record says
    _fm(rig).deactivate(4)
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    assert rig.active() == [1]


def test_a_deactivation_refused_with_another_code_counts_as_done_only_if_fm_lists_it_inactive(
    rig: FmRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guide's "not active" is FM_ST_UNINITIALIZED; another FM may answer otherwise. The release reads the
    partition back: inactive, the release goes on; still active, the record is kept and the release retried."""
    ref = rig.claims.add("vm", [PAIR])
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    fm = _fm(rig)
    real_deactivate = fm.deactivate

    def refused(partition_id: int) -> None:
        raise FabricManagerError(FmReturn.PARTITION_ID_NOT_IN_USE, f"fmDeactivateFabricPartition({partition_id})")

    monkeypatch.setattr(fm, "deactivate", refused)
    error = rig.engine.unprepare([ref])[ref.uid]
    assert "could not deactivate partition 1" in error and "PARTITION_ID_NOT_IN_USE" in error
    assert rig.active() == [1] and rig.on_vfio() == [GPU0, GPU1]  # still active: nothing given back
    fm.restart()  # now FM lists it inactive (and would say so with its own code)
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    assert rig.on_vfio() == [] and rig.checkpoint.load().claims == {}
    monkeypatch.setattr(fm, "deactivate", real_deactivate)
