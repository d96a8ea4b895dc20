"""The effect protocol from the engine's side: one checkpoint read per claim operation and one durable write per
state change, every step of a kind reached through the registry alone (a kind the engine has never heard of
plugs in), and undo in the reverse order of apply."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.plugin.checkpoint import Checkpoint, ClaimRecord, ClaimState
from dra_driver.plugin.effects.base import Catalog, ClaimPlan, Created, GpuEffect, NodeTools, Records
from dra_driver.plugin.effects.registry import DEVICE_EFFECTS, node_effects
from dra_driver.plugin.effects.time_slice import TimeSlice
from dra_driver.plugin.engine import PrepareEngine
from dra_driver.plugin.ownership import AllocatedClaim
from dra_driver.plugin.sharing import TimeSlicer
from tests.plugin.conftest import DRIVER, NODE, EngineRig
from tests.plugin.test_timeslicing import _config


class Counted:
    """Counts the engine's checkpoint reads and writes (the store's own reads inside a write are not counted)."""

    def __init__(self, rig: EngineRig, monkeypatch: pytest.MonkeyPatch) -> None:
        self.loads = self.updates = 0
        load, update = rig.checkpoint.load, rig.checkpoint.update

        def counted_load() -> Checkpoint:
            self.loads += 1
            return load()

        def counted_update(change: Any) -> Checkpoint:
            self.updates += 1
            return update(change)

        monkeypatch.setattr(rig.checkpoint, "load", counted_load)
        monkeypatch.setattr(rig.checkpoint, "update", counted_update)

    def take(self) -> tuple[int, int]:
        taken, self.loads, self.updates = (self.loads, self.updates), 0, 0
        return taken


@pytest.fixture
def state_rig(tmp_path: Path) -> Iterator[EngineRig]:
    rig = EngineRig(tmp_path, backend_spec=f"fake:dgx-h100,state={tmp_path / 'nvml-state.json'}")
    yield rig
    rig.engine.close()


def test_a_whole_gpu_claim_reads_the_checkpoint_once_per_operation(
    state_rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = state_rig
    counted = Counted(rig, monkeypatch)
    ref = rig.claims.add("whole", ["gpu-0"])
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    # One read; one write (PrepareCompleted: a whole GPU changes nothing but its CDI spec, no PrepareStarted).
    assert counted.take() == (1, 1)
    assert rig.engine.prepare([ref])[ref.uid].error == ""  # repeated: verified from the one read, nothing written
    assert counted.take() == (1, 0)
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    assert counted.take() == (1, 1)  # the record's removal (the spec goes first)
    assert rig.engine.prepared_claims().claims == {}


def test_a_claim_that_changes_the_node_reads_once_and_writes_each_state_once(
    state_rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = state_rig
    counted = Counted(rig, monkeypatch)
    ref = rig.claims.add("ts", ["gpu-3"], config=_config(interval="Long"))
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    assert counted.take() == (1, 2)  # PrepareStarted, PrepareCompleted
    record = rig.engine.prepared_claims().claims[ref.uid]
    counted.take()
    # Planned once: the PrepareStarted record already carried what the completed one says (CDI id, sharing).
    assert record.allocated == record.devices
    assert record.devices[0].cdi_device_ids == (f"k8s.{DRIVER}/claim={ref.uid}-gpu-3",)
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    assert counted.take() == (1, 2)  # UnprepareStarted, the record's removal


def test_a_kind_plugs_in_through_the_registry_and_is_undone_in_reverse(tmp_path: Path) -> None:
    """A kind the engine has never heard of: added to the registry's tuple, it is planned, applied after the kinds
    before it, verified, undone before them and swept — with no change to the engine."""
    calls: list[str] = []

    class Probe(GpuEffect):
        kind = "probe"

        def plan(self, claim: ClaimPlan) -> ClaimPlan:
            calls.append("plan")
            return claim

        def changes_node(self, claim: ClaimPlan) -> bool:
            return True  # so PrepareStarted is written before apply, as for any kind that changes the node

        def in_records(self, records: Records) -> bool:
            return True

        def apply(self, claim: ClaimPlan, records: Records, checkpoint: Checkpoint, created: Created) -> Records:
            # Applied under PrepareStarted, which names the claim's devices.
            assert checkpoint.claims[claim.ref.uid].state is ClaimState.PREPARE_STARTED
            calls.append("apply")
            return records

        def undo(self, owner: ClaimRecord, records: Records, checkpoint: Checkpoint, *, rollback: bool) -> None:
            calls.append("undo-rollback" if rollback else "undo")

        def verify(self, owner: ClaimRecord, records: Records, checkpoint: Checkpoint, catalog: Catalog) -> list[str]:
            calls.append("verify")
            return []

        def sweep(
            self, checkpoint: Checkpoint, allocated: Mapping[str, AllocatedClaim] | None, catalog: Catalog
        ) -> tuple[str, ...]:
            calls.append("sweep")
            return ("leftover",)

    class TimeSliceSpy(TimeSlice):
        def apply(self, claim: ClaimPlan, records: Records, checkpoint: Checkpoint, created: Created) -> Records:
            calls.append("time-slice")
            return super().apply(claim, records, checkpoint, created)

        def undo(self, owner: ClaimRecord, records: Records, checkpoint: Checkpoint, *, rollback: bool) -> None:
            calls.append("time-slice-undo")
            super().undo(owner, records, checkpoint, rollback=rollback)

    rig = EngineRig(tmp_path)
    rig.engine.close()
    tools = NodeTools(driver_name=DRIVER, cdi=rig.cdi, time_slicer=TimeSlicer(rig.backend))
    kinds = (DEVICE_EFFECTS[0], TimeSliceSpy, *DEVICE_EFFECTS[2:], Probe)
    engine = PrepareEngine(
        settings=rig.engine.settings,
        claims=rig.claims,
        catalog=lambda: rig.devices,
        effects=node_effects(tools, kinds),
        checkpoint=rig.checkpoint,
    )
    try:
        ref = rig.claims.add("c", ["gpu-1"], config=_config(interval="Short"))
        assert engine.prepare([ref])[ref.uid].error == ""
        assert calls == ["plan", "time-slice", "apply"]
        assert engine.prepare([ref])[ref.uid].error == ""
        assert calls[-1] == "verify"
        report = engine.recovery.recover()
        assert report.swept["probe"] == ("leftover",) and "sweep" in calls
        calls.clear()
        assert engine.unprepare([ref]) == {ref.uid: ""}
        assert calls == ["undo", "time-slice-undo"]  # the reverse of apply
        assert rig.backend.time_slice(rig.devices["gpu-1"].gpu.uuid).label == "Default"
    finally:
        engine.close()


def test_every_kind_is_registered_in_apply_order() -> None:
    assert [k.kind for k in DEVICE_EFFECTS] == [
        "vfio-passthrough", "vgpu", "fm-partition", "mig-partition", "time-slice", "mps-daemon", "capacity-share"
    ]


def test_a_prepare_refused_inside_the_completed_write_leaves_no_spec(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole GPU writes no PrepareStarted: its refusal against other claims runs inside the PrepareCompleted write
    (the store's current state). A claim that took the device meanwhile gets ours refused, and our spec removed."""
    ref = rig.claims.add("late", ["gpu-2"])
    other = rig.claims.add("first", ["gpu-2"])
    ours = rig.cdi
    real_write = ours.write
    second = rig.new_engine()  # another plugin instance on the node (seamless upgrade): GPU locks of its own

    def write_then_lose_the_race(uid: str, devices: Any) -> Any:
        written = real_write(uid, devices)
        if uid == ref.uid:
            # Another plugin instance on the node prepares the same device in between (only the record is needed).
            assert second.prepare([other])[other.uid].error == ""
        return written

    monkeypatch.setattr(ours, "write", write_then_lose_the_race)
    error = rig.engine.prepare([ClaimRef(ref.namespace, ref.name, ref.uid)])[ref.uid].error
    assert "already prepared for claim default/first" in error
    assert not rig.spec_path(ref.uid).exists() and rig.spec_path(other.uid).exists()
    assert set(rig.engine.prepared_claims().claims) == {other.uid}
    assert NODE in rig.spec_path(other.uid).name
    second.close()
