"""Dynamic MIG through the prepare engine on the fake NVML: carve on prepare, remove on unprepare."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.inventory.catalog import MigOffering
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.nvml.types import NvmlReturn, Placement
from dra_driver.plugin.checkpoint import ClaimRecord, ClaimState, MigRecord, PreparedDevice
from tests.narrow import present
from tests.plugin.conftest import NODE, EngineRig


@pytest.fixture
def h100(tmp_path: Path) -> Iterator[EngineRig]:
    rig = EngineRig(tmp_path, policy=MigOffering.DYNAMIC)
    yield rig
    rig.engine.close()


def _gpu0(rig: EngineRig) -> str:
    return rig.devices["gpu-0"].gpu.uuid


def _instances(rig: EngineRig, gpu: str) -> list[Any]:
    mode = rig.backend.mig_mode(gpu)
    return rig.backend.gpu_instances(gpu) if mode and mode.current else []


def test_three_partitions_on_one_h100_then_all_gone(h100: EngineRig) -> None:
    gpu = _gpu0(h100)
    names = ["gpu-0-mig-1g10gb-19-6", "gpu-0-mig-2g20gb-14-4", "gpu-0-mig-3g40gb-9-0"]
    refs = [h100.claims.add(f"c{i}", [n]) for i, n in enumerate(names)]
    results = h100.engine.prepare(refs)
    assert all(r.error == "" for r in results.values()), results
    live = {(gi.profile_id, gi.placement) for gi in _instances(h100, gpu)}
    assert live == {(19, Placement(6, 1)), (14, Placement(4, 2)), (9, Placement(0, 4))}
    mig_uuids = {m.uuid for m in h100.backend.mig_devices(gpu)}
    for ref, name in zip(refs, names, strict=True):
        record = h100.engine.prepared_claims().claims[ref.uid]
        mig = record.devices[0].mig
        assert mig is not None and mig.uuid in mig_uuids and mig.uuid != gpu
        spec = json.loads(h100.spec_path(ref.uid).read_text())
        assert f"NVIDIA_VISIBLE_DEVICES={mig.uuid}" in spec["containerEdits"]["env"]
        key = "DRA_DEVICE_" + name.upper().replace("-", "_")
        assert f"{key}_PARENT_UUID={gpu}" in spec["devices"][0]["containerEdits"]["env"]
    assert h100.engine.unprepare(refs) == {r.uid: "" for r in refs}
    assert _instances(h100, gpu) == []
    mode = h100.backend.mig_mode(gpu)
    assert mode is not None and not mode.current  # Hopper: MIG off after the last partition


def test_occupied_placement_fails_cleanly(h100: EngineRig) -> None:
    gpu = _gpu0(h100)
    h100.backend.set_mig_mode(gpu, True)
    foreign = h100.backend.create_gpu_instance(gpu, 19, Placement(6, 1))
    ref = h100.claims.add("c", ["gpu-0-mig-1g10gb-19-6"])
    error = h100.engine.prepare([ref])[ref.uid].error
    assert "occupied" in error and "nothing was created" in error
    assert [gi.id for gi in h100.backend.gpu_instances(gpu)] == [foreign.id]
    assert ref.uid not in h100.engine.prepared_claims().claims
    assert not h100.spec_path(ref.uid).exists()


def test_failed_compute_instance_leaves_nothing(h100: EngineRig) -> None:
    gpu = _gpu0(h100)
    assert isinstance(h100.backend, FakeNvml)
    h100.backend.inject_fault("create_compute_instance", NvmlReturn.INSUFFICIENT_RESOURCES)
    ref = h100.claims.add("c", ["gpu-0-mig-3g40gb-9-4"])
    assert "compute instance" in h100.engine.prepare([ref])[ref.uid].error
    assert _instances(h100, gpu) == []
    assert not present(h100.backend.mig_mode(gpu)).current


def test_whole_hopper_gpu_turns_leftover_mig_mode_off(h100: EngineRig) -> None:
    gpu = _gpu0(h100)
    h100.backend.set_mig_mode(gpu, True)
    ref = h100.claims.add("c", ["gpu-0"])
    assert h100.engine.prepare([ref])[ref.uid].error == ""
    assert not present(h100.backend.mig_mode(gpu)).current


def test_ampere_partitions_without_toggling(tmp_path: Path) -> None:
    rig = EngineRig(tmp_path, preset="dgx-a100", policy=MigOffering.DYNAMIC)
    gpu = rig.devices["gpu-0-mig-3g20gb-9-4"].gpu.uuid
    assert "gpu-0" not in rig.devices
    ref = rig.claims.add("c", ["gpu-0-mig-3g20gb-9-4"])
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    assert present(rig.backend.mig_mode(gpu)).current  # Ampere: left on
    rig.engine.close()


def test_rollback_of_a_half_prepared_claim_finds_the_instance_by_spec(h100: EngineRig) -> None:
    gpu = _gpu0(h100)
    h100.backend.set_mig_mode(gpu, True)
    gi = h100.backend.create_gpu_instance(gpu, 9, Placement(4, 4))
    h100.backend.create_compute_instance(gpu, gi.id, 2)
    half = ClaimRecord(
        "uid-half",
        "default",
        "half",
        ClaimState.PREPARE_STARTED,
        allocated=(
            PreparedDevice(("r0",), NODE, "gpu-0-mig-3g40gb-9-4", gpu_uuid=gpu, mig=MigRecord(gpu, 9, 4, 4, gi.id)),
        ),
    )
    h100.checkpoint.update(lambda cp: cp.with_claim(half))
    foreign = h100.backend.create_gpu_instance(gpu, 19, Placement(0, 1))  # same profile family, other slot
    # The rollback itself (recover() would also sweep the foreign instance as unowned: see the test below).
    assert h100.engine.unprepare_claim(ClaimRef("default", "half", "uid-half"))
    assert [g.id for g in _instances(h100, gpu)] == [foreign.id]


def test_startup_destroys_instances_no_claim_owns(h100: EngineRig) -> None:
    gpu = _gpu0(h100)
    kept = h100.claims.add("kept", ["gpu-0-mig-1g10gb-19-6"])
    assert h100.engine.prepare([kept])[kept.uid].error == ""
    stray = h100.backend.create_gpu_instance(gpu, 14, Placement(0, 2))
    owned = [d.mig for d in h100.engine.prepared_claims().claims[kept.uid].devices if d.mig is not None]
    assert len(h100.actuator.destroy_unowned({gpu: True}, owned)) == 1
    remaining = h100.backend.gpu_instances(gpu)
    assert stray.id not in [g.id for g in remaining] and len(remaining) == 1


def _live(rig: EngineRig, gpu: str) -> set[tuple[int, int, Placement]]:
    return {(gi.id, gi.profile_id, gi.placement) for gi in _instances(rig, gpu)}


def test_release_never_destroys_an_instance_that_reuses_the_recorded_id(h100: EngineRig) -> None:
    """Issue 12 finding 1: unprepare A crashes after releasing its instance but before updating the checkpoint;
    NVML hands A's GI id to claim B at another placement; the kubelet's retried unprepare of A must leave B's
    instance alone."""
    gpu = _gpu0(h100)
    a = h100.claims.add("a", ["gpu-0-mig-1g10gb-19-6"])
    assert h100.engine.prepare([a])[a.uid].error == ""
    a_device = h100.engine.prepared_claims().claims[a.uid].devices[0]
    assert a_device.mig is not None
    h100.actuator.release(a_device)  # what the crashed unprepare got done
    assert _instances(h100, gpu) == []
    b = h100.claims.add("b", ["gpu-0-mig-1g10gb-19-0"])
    assert h100.engine.prepare([b])[b.uid].error == ""
    b_mig = h100.engine.prepared_claims().claims[b.uid].devices[0].mig
    assert b_mig is not None and b_mig.gpu_instance_id == a_device.mig.gpu_instance_id  # the id really was reused

    assert h100.engine.unprepare([a]) == {a.uid: ""}  # the kubelet's retry

    assert _live(h100, gpu) == {(b_mig.gpu_instance_id, 19, Placement(0, 1))}
    assert b_mig.uuid in {m.uuid for m in h100.backend.mig_devices(gpu)}
    assert h100.engine.prepared_claims().claims[b.uid].state is ClaimState.PREPARE_COMPLETED
    assert h100.engine.unprepare([b]) == {b.uid: ""}
    assert _instances(h100, gpu) == []


def test_release_leaves_an_instance_with_a_compute_instance_it_did_not_make(h100: EngineRig) -> None:
    """Same GI id, profile and placement, but compute instances inside that are not the recorded one: somebody
    else's layout, left alone (and said so)."""
    gpu = _gpu0(h100)
    ref = h100.claims.add("c", ["gpu-0-mig-3g40gb-9-4"])
    assert h100.engine.prepare([ref])[ref.uid].error == ""
    mig = h100.engine.prepared_claims().claims[ref.uid].devices[0].mig
    assert mig is not None and mig.gpu_instance_id is not None and mig.compute_instance_id is not None
    h100.backend.destroy_compute_instance(gpu, mig.gpu_instance_id, mig.compute_instance_id)
    foreign = [h100.backend.create_compute_instance(gpu, mig.gpu_instance_id, 0).id for _ in range(2)]
    assert set(foreign) - {mig.compute_instance_id}  # at least one id we never recorded
    assert h100.engine.unprepare([ref]) == {ref.uid: ""}
    assert (mig.gpu_instance_id, 9, Placement(4, 4)) in _live(h100, gpu)
    assert sorted(ci.id for ci in h100.backend.compute_instances(gpu, mig.gpu_instance_id)) == sorted(foreign)


@pytest.mark.parametrize("damage", ["destroy-instance", "destroy-compute-instance"])
def test_repeated_prepare_recreates_a_vanished_mig_instance(h100: EngineRig, damage: str) -> None:
    """Issue 12 finding 2: a prepared claim whose MIG instance is gone is re-created at the same placement, the
    checkpoint names the new instance and the CDI spec names its MIG UUID; the CDI ids stay the same."""
    gpu = _gpu0(h100)
    ref = h100.claims.add("c", ["gpu-0-mig-3g40gb-9-4"])
    first = h100.engine.prepare([ref])[ref.uid]
    old = h100.engine.prepared_claims().claims[ref.uid].devices[0].mig
    assert old is not None and old.gpu_instance_id is not None and old.compute_instance_id is not None
    h100.backend.destroy_compute_instance(gpu, old.gpu_instance_id, old.compute_instance_id)
    if damage == "destroy-instance":
        h100.backend.destroy_gpu_instance(gpu, old.gpu_instance_id)
        h100.backend.create_gpu_instance(gpu, 9, Placement(0, 4))  # takes the freed id: the new one gets another

    again = h100.engine.prepare([ref])[ref.uid]

    assert again == first  # the same CDI ids: the kubelet's cached ones stay valid
    new = h100.engine.prepared_claims().claims[ref.uid].devices[0].mig
    assert new is not None and new.compute_instance_id is not None
    assert (new.gpu_instance_id, 9, Placement(4, 4)) in _live(h100, gpu)
    assert [ci.id for ci in h100.backend.compute_instances(gpu, new.gpu_instance_id or 0)] == [new.compute_instance_id]
    assert new.uuid in {m.uuid for m in h100.backend.mig_devices(gpu)}
    spec = json.loads(h100.spec_path(ref.uid).read_text())
    assert f"NVIDIA_VISIBLE_DEVICES={new.uuid}" in spec["containerEdits"]["env"]
    if damage == "destroy-instance":
        assert new.gpu_instance_id != old.gpu_instance_id


def test_startup_verifies_and_repairs_every_prepared_claim(h100: EngineRig) -> None:
    gpu = _gpu0(h100)
    mig = h100.claims.add("mig", ["gpu-0-mig-2g20gb-14-2"])
    whole = h100.claims.add("whole", ["gpu-1"])
    assert all(r.error == "" for r in h100.engine.prepare([mig, whole]).values())
    specs = {ref.uid: h100.spec_path(ref.uid).read_bytes() for ref in (mig, whole)}
    record = h100.engine.prepared_claims().claims[mig.uid].devices[0].mig
    assert record is not None and record.gpu_instance_id is not None and record.compute_instance_id is not None
    h100.backend.destroy_compute_instance(gpu, record.gpu_instance_id, record.compute_instance_id)
    h100.backend.destroy_gpu_instance(gpu, record.gpu_instance_id)
    h100.spec_path(mig.uid).unlink()
    h100.spec_path(whole.uid).write_bytes(specs[whole.uid][:40])  # truncated

    engine = h100.new_engine()
    report = engine.recovery.recover()

    assert {(p, pl) for _, p, pl in _live(h100, gpu)} == {(14, Placement(2, 2))}
    assert h100.spec_path(whole.uid).read_bytes() == specs[whole.uid]
    assert h100.spec_path(mig.uid).read_bytes() == specs[mig.uid]  # same GI/CI ids again, so the same bytes
    assert sorted(report.repaired) == sorted([mig.uid, whole.uid])
    engine.close()


def _corrupt_or_delete(rig: EngineRig, how: str) -> None:
    if how == "corrupt":
        rig.checkpoint_path.write_bytes(rig.checkpoint_path.read_bytes()[:-30])
    else:
        rig.checkpoint_path.unlink()


@pytest.mark.parametrize("how", ["corrupt", "missing"])
def test_lost_checkpoint_rebuilds_ownership_and_destroys_nothing_in_use(h100: EngineRig, how: str) -> None:
    """Issue 12 finding 3: after a corrupt or missing checkpoint, what exists is matched to the claims the API
    has allocated here; in-use specs and instances survive, only what provably belongs to no claim goes."""
    gpu = _gpu0(h100)
    mig = h100.claims.add("mig", ["gpu-0-mig-1g10gb-19-6"])
    whole = h100.claims.add("whole", ["gpu-1"])
    results = h100.engine.prepare([mig, whole])
    assert all(r.error == "" for r in results.values())
    specs = {ref.uid: h100.spec_path(ref.uid).read_bytes() for ref in (mig, whole)}
    before = h100.engine.prepared_claims().claims
    stray = h100.backend.create_gpu_instance(gpu, 14, Placement(0, 2))  # allocated to nobody
    in_use = _live(h100, gpu) - {(stray.id, 14, Placement(0, 2))}
    _corrupt_or_delete(h100, how)

    engine = h100.new_engine()
    report = engine.recovery.recover()

    assert _live(h100, gpu) == in_use  # the claim's instance survives; the stray one is gone
    assert {uid: h100.spec_path(uid).read_bytes() for uid in specs} == specs
    assert report.ownership_known and sorted(report.adopted) == sorted([mig.uid, whole.uid])
    rebuilt = engine.prepared_claims().claims
    for ref in (mig, whole):
        assert rebuilt[ref.uid].state is ClaimState.PREPARE_COMPLETED
        assert rebuilt[ref.uid].devices == before[ref.uid].devices  # identities, CDI ids, sharing: all the same
    if how == "corrupt":
        assert len(list(h100.checkpoint_path.parent.glob("checkpoint.json.corrupt-*"))) == 1
    assert engine.prepare([mig])[mig.uid] == results[mig.uid]  # the kubelet's retry gets the same answer
    assert engine.unprepare([mig, whole]) == {mig.uid: "", whole.uid: ""}
    assert _instances(h100, gpu) == [] and list(h100.cdi_root.glob("*.json")) == []
    engine.close()


def test_lost_checkpoint_and_no_api_keeps_everything_until_the_api_answers(h100: EngineRig) -> None:
    from dra_driver.k8s.client import ApiError

    gpu = _gpu0(h100)
    mig = h100.claims.add("mig", ["gpu-0-mig-1g10gb-19-6"])
    assert h100.engine.prepare([mig])[mig.uid].error == ""
    stray = h100.backend.create_gpu_instance(gpu, 14, Placement(0, 2))
    live = _live(h100, gpu)
    h100.checkpoint_path.write_bytes(b"{not json")

    def unreachable() -> list[dict[str, Any]]:
        raise ApiError(0, "connection refused")

    real_list = h100.claims.list_claims
    h100.claims.list_claims = unreachable  # type: ignore[method-assign]
    engine = h100.new_engine()
    report = engine.recovery.recover()
    assert _live(h100, gpu) == live and h100.spec_path(mig.uid).exists()
    assert not report.ownership_known and report.destroyed_instances == 0 and report.removed_specs == ()

    h100.claims.list_claims = real_list  # type: ignore[method-assign]
    later = engine.recovery.reconcile()
    assert later is not None and later.adopted == (mig.uid,) and later.destroyed_instances == 1
    assert stray.id not in {gi_id for gi_id, _, _ in _live(h100, gpu)}
    assert engine.recovery.reconcile() is None  # nothing pending any more
    engine.close()


def test_lost_checkpoint_keeps_an_instance_overlapping_an_allocated_device(h100: EngineRig) -> None:
    """An instance that is not exactly the allocated partition but overlaps it may still be that claim's: kept."""
    gpu = _gpu0(h100)
    ref = h100.claims.add("c", ["gpu-0-mig-3g40gb-9-4"])  # allocated, never prepared here
    h100.backend.set_mig_mode(gpu, True)
    odd = h100.backend.create_gpu_instance(gpu, 19, Placement(5, 1))
    h100.checkpoint_path.unlink(missing_ok=True)
    engine = h100.new_engine()
    report = engine.recovery.recover()
    assert _live(h100, gpu) == {(odd.id, 19, Placement(5, 1))}
    assert report.adopted == () and report.destroyed_instances == 0
    assert ref.uid not in engine.prepared_claims().claims
    engine.close()


def test_an_interrupted_unprepare_is_finished_at_startup_never_repaired(
    h100: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint says UnprepareStarted before anything is released, so startup recovery completes the
    release instead of mistaking the missing instance for damage and re-creating it."""
    gpu = _gpu0(h100)
    ref = h100.claims.add("c", ["gpu-0-mig-2g20gb-14-4"])
    assert h100.engine.prepare([ref])[ref.uid].error == ""

    class Killed(BaseException):
        pass

    def killed(uid: str) -> bool:
        raise Killed

    monkeypatch.setattr(h100.cdi, "remove", killed)  # dies between releasing devices and the spec
    with pytest.raises(Killed):
        h100.engine.unprepare_claim(ref)
    monkeypatch.undo()
    assert h100.engine.prepared_claims().claims[ref.uid].state is ClaimState.UNPREPARE_STARTED
    assert _instances(h100, gpu) == [] and h100.spec_path(ref.uid).exists()

    engine = h100.new_engine()
    report = engine.recovery.recover()
    assert _instances(h100, gpu) == [] and not h100.spec_path(ref.uid).exists()
    assert engine.prepared_claims().claims == {}
    assert report.finished == (ref.uid,) and report.repaired == ()
    engine.close()


def test_recovery_of_a_second_instance_never_undoes_a_claim_in_flight(
    h100: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seamless upgrade: the new instance starts while the old one is in the middle of a prepare (PrepareStarted
    recorded, instance created). Its recovery must wait, not roll that claim back or destroy the instance."""
    import threading

    from dra_driver.kubeletplugin.statedirs import NodeStateBusyError

    gpu = _gpu0(h100)
    ref = h100.claims.add("c", ["gpu-0-mig-3g40gb-9-0"])
    created, go_on = threading.Event(), threading.Event()
    real_write = h100.cdi.write

    def slow_write(*args: Any) -> Any:
        created.set()  # the instance exists and is recorded; the spec is not written yet
        go_on.wait(10)
        return real_write(*args)

    monkeypatch.setattr(h100.cdi, "write", slow_write)
    results: list[Any] = []
    worker = threading.Thread(target=lambda: results.append(h100.engine.prepare([ref])[ref.uid]))
    worker.start()
    assert created.wait(10)
    newcomer = h100.new_engine(recovery_lock_timeout=0.2)
    with pytest.raises(NodeStateBusyError):
        newcomer.recovery.recover()
    newcomer.close()
    assert h100.engine.prepared_claims().claims[ref.uid].state is ClaimState.PREPARE_STARTED
    assert {(p, pl) for _, p, pl in _live(h100, gpu)} == {(9, Placement(0, 4))}
    go_on.set()
    worker.join(10)
    assert results and results[0].error == ""
    newcomer = h100.new_engine(recovery_lock_timeout=5)
    assert newcomer.recovery.recover().finished == ()
    assert newcomer.prepared_claims().claims[ref.uid].state is ClaimState.PREPARE_COMPLETED
    assert {(p, pl) for _, p, pl in _live(h100, gpu)} == {(9, Placement(0, 4))}
    newcomer.close()
