"""The Fabric Manager partition effect, step by step, on a fake HGX node: a claim's partition gets its GPUs bound to
vfio-pci and is activated (each step recorded before it), unprepare deactivates it and gives the GPUs back; every
failure (a member GPU busy, FM refusing, a partition someone else activated) rolls back what was done, so no
partition is left active (NVIDIA's #1331) and no GPU left on vfio-pci (its #1255); a crash at every point of prepare
and unprepare is recovered the same way; a partition no record names is never deactivated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dra_driver.plugin.checkpoint import ClaimState
from dra_driver.plugin.faults import FM_PARTITION_POINTS, PREPARE_POINTS, UNPREPARE_POINTS
from dra_driver.plugin.passthroughfacts import passed_through
from tests.fmpartition.fmrig import GPU0, GPU1, PAIR, FmRig
from tests.plugin.vfiorig import Crashed, SnapshotFaults


def _clean(rig: FmRig) -> None:
    assert rig.active() == []
    assert rig.on_vfio() == []


def test_prepare_binds_and_activates_and_unprepare_releases(rig: FmRig) -> None:
    assert rig.devices[PAIR].partition_id == 1 and len(rig.devices[PAIR].members) == 2
    ref = rig.claims.add("vm", [PAIR])
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    assert rig.active() == [1]
    assert rig.on_vfio() == [GPU0, GPU1]
    record = rig.checkpoint.load().claims[ref.uid]
    assert record.state is ClaimState.PREPARE_COMPLETED
    made = record.devices[0].fm_partition
    assert made is not None and made.activating and [g.address for g in made.gpus] == [GPU0, GPU1]
    assert all(g.started for g in made.gpus)
    spec = json.loads(rig.spec_path(ref.uid).read_bytes())
    edits = spec["devices"][0]["containerEdits"]
    assert [n["path"] for n in edits["deviceNodes"]] == [f"/dev/vfio/{g.group}" for g in made.gpus]
    assert "DRA_DEVICE_FM_PARTITION_1_FM_PARTITION_ID=1" in edits["env"]
    assert f"DRA_DEVICE_FM_PARTITION_1_PCI_BUS_IDS={GPU0},{GPU1}" in edits["env"]
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]  # the VM's container gets no GPU
    # While prepared, each member counts as a GPU passed through (kept in the catalog, left out of NVML's watch).
    passed = passed_through(rig.checkpoint.load())
    assert [(d.gpu_uuid, d.vfio.address if d.vfio else None) for d in passed] == [
        (rig.devices["gpu-0"].gpu.uuid, GPU0),
        (rig.devices["gpu-1"].gpu.uuid, GPU1),
    ]
    assert rig.engine.prepare([ref])[ref.uid].error == ""  # repeated: verified, nothing done again
    assert rig.active() == [1]
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    _clean(rig)
    assert rig.checkpoint.load().claims == {}


def test_a_busy_member_gpu_rolls_back_the_first(rig: FmRig) -> None:
    rig.nvml.set_busy(rig.devices["gpu-1"].gpu.uuid, [4242])
    ref = rig.claims.add("vm", [PAIR])
    error = rig.engine.prepare([ref])[ref.uid].error
    assert "4242" in error or "in use" in error, error
    _clean(rig)  # GPU 0, bound first, is back on nvidia; nothing activated
    assert ref.uid not in rig.checkpoint.load().claims


def test_fm_refusing_activation_rolls_back_every_bind(rig: FmRig) -> None:
    # FM came back (fmSetActivatedFabricPartitions) with partition 4 (GPU 1 alone) active, outside the plugin: FM
    # refuses ours with IN_USE after both GPUs were bound.
    rig.fm.set_activated((4,))
    ref = rig.claims.add("vm", [rig.devices["fm-partition-2"].name])  # GPUs 2, 3: disjoint, succeeds
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    other = rig.claims.add("vm2", [PAIR])
    error = rig.engine.prepare([other])[other.uid].error
    assert "IN_USE" in error, error
    assert rig.active() == [2, 4]  # the admin's partition 4 is not touched; ours (1) never active
    assert GPU0 not in rig.on_vfio() and GPU1 not in rig.on_vfio()  # both bound for the claim, both rebound
    assert other.uid not in rig.checkpoint.load().claims
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    assert rig.active() == [4]  # only the partition the record proves ours was deactivated


def test_a_partition_already_active_is_refused_not_taken(rig: FmRig) -> None:
    rig.fm.set_activated((1,))  # FM restarted with 1 active, say: not ours
    ref = rig.claims.add("vm", [PAIR])
    error = rig.engine.prepare([ref])[ref.uid].error
    assert "already active" in error, error
    assert rig.active() == [1] and rig.on_vfio() == []  # still active (not ours to end), GPUs rebound


def test_a_container_claim_and_a_partition_exclude_each_other(rig: FmRig) -> None:
    gpu = rig.claims.add("pod", ["gpu-1"])
    assert rig.engine.prepare([gpu])[gpu.uid].error == ""
    vm = rig.claims.add("vm", [PAIR])
    error = rig.engine.prepare([vm])[vm.uid].error
    assert "Fabric Manager partition takes its GPUs whole" in error, error
    _clean(rig)
    assert rig.engine.unprepare([gpu]) == {gpu.uid: ""}
    assert rig.engine.prepare([vm])[vm.uid].error == ""
    again = rig.claims.add("pod2", ["gpu-1"])  # the second member (the engine itself catches gpu-0, the first)
    assert "Fabric Manager partition" in rig.engine.prepare([again])[again.uid].error


def test_overlapping_partitions_exclude_each_other(rig: FmRig) -> None:
    a = rig.claims.add("vm", ["fm-partition-2"])  # GPUs 2, 3
    assert rig.engine.prepare([a])[a.uid].error == ""
    b = rig.claims.add("vm2", ["fm-partition-0"])  # the whole board
    assert "Fabric Manager partition" in rig.engine.prepare([b])[b.uid].error
    # Partition 1 starts on GPU 0, as partition 0 does: the engine's own overlap check (by the record's GPU) refuses
    # it first, with its words ("already prepared").
    c = rig.claims.add("vm3", [PAIR])
    assert rig.engine.prepare([c])[c.uid].error == ""
    d = rig.claims.add("vm4", ["fm-partition-0"])
    assert rig.engine.prepare([d])[d.uid].error != ""
    assert rig.active() == [1, 2]
    assert rig.on_vfio() == ["0000:18:00.0", "0000:25:00.0", "0000:32:00.0", "0000:3f:00.0"]


def test_without_the_flag_a_partition_device_is_refused(tmp_path: Path) -> None:
    rig = FmRig(tmp_path, enabled=False)
    ref = rig.claims.add("vm", [PAIR])
    assert "--fabric-partitions is off" in rig.engine.prepare([ref])[ref.uid].error
    _clean(rig)
    rig.engine.close()


# --- crashes -------------------------------------------------------------------------------------

PREPARE_CRASHES = [*PREPARE_POINTS, "vfio:after-record", "vfio:after-bind", "fmpartition:after-record",
                   "fmpartition:after-activate"]  # fmt: skip
UNPREPARE_CRASHES = [*UNPREPARE_POINTS, "fmpartition:after-deactivate", "vfio:after-restore-bind"]


def test_every_fm_point_is_exercised() -> None:
    assert set(PREPARE_CRASHES + UNPREPARE_CRASHES) >= set(FM_PARTITION_POINTS)


@pytest.mark.parametrize("point", PREPARE_CRASHES)
def test_a_crash_in_prepare_is_recovered(rig: FmRig, point: str) -> None:
    ref = rig.claims.add("vm", [PAIR])
    faults = SnapshotFaults(rig, point)
    rig.engine.close()
    engine = rig.restart(faults)
    with pytest.raises(Crashed):
        engine.prepare([ref])
    engine.close()
    faults.restore()  # the node as the SIGKILL left it
    engine = rig.restart()
    engine.recovery.recover()  # a PrepareStarted record is rolled back (deactivated, rebound), a completed one kept
    if rig.checkpoint.load().claims.get(ref.uid) is None:
        _clean(rig)  # nothing leaked
    assert engine.prepare([ref])[ref.uid].error == ""  # the kubelet's retry
    assert rig.active() == [1] and rig.on_vfio() == [GPU0, GPU1]
    assert engine.unprepare([ref]) == {ref.uid: ""}
    _clean(rig)
    assert rig.checkpoint.load().claims == {}


@pytest.mark.parametrize("point", UNPREPARE_CRASHES)
def test_a_crash_in_unprepare_is_finished(rig: FmRig, point: str) -> None:
    ref = rig.claims.add("vm", [PAIR])
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
    _clean(rig)
    assert rig.checkpoint.load().claims == {}
