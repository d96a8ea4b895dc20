"""Dynamic MIG through the prepare engine on the fake NVML: carve on prepare, remove on unprepare."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver.inventory.catalog import MigPolicy
from dra_driver.nvml.types import NvmlReturn, Placement
from dra_driver.plugin.checkpoint import ClaimRecord, ClaimState, MigRecord, PreparedDevice
from dra_driver.plugin.types import ClaimRef
from tests.plugin.conftest import NODE, EngineRig


@pytest.fixture
def h100(tmp_path: Path) -> EngineRig:
    rig = EngineRig(tmp_path, policy=MigPolicy.DYNAMIC)
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
    h100.backend.inject_fault("create_compute_instance", NvmlReturn.INSUFFICIENT_RESOURCES)
    ref = h100.claims.add("c", ["gpu-0-mig-3g40gb-9-4"])
    assert "compute instance" in h100.engine.prepare([ref])[ref.uid].error
    assert _instances(h100, gpu) == []
    assert not h100.backend.mig_mode(gpu).current  # type: ignore[union-attr]


def test_whole_hopper_gpu_turns_leftover_mig_mode_off(h100: EngineRig) -> None:
    gpu = _gpu0(h100)
    h100.backend.set_mig_mode(gpu, True)
    ref = h100.claims.add("c", ["gpu-0"])
    assert h100.engine.prepare([ref])[ref.uid].error == ""
    assert not h100.backend.mig_mode(gpu).current  # type: ignore[union-attr]


def test_ampere_partitions_without_toggling(tmp_path: Path) -> None:
    rig = EngineRig(tmp_path, preset="dgx-a100", policy=MigPolicy.DYNAMIC)
    gpu = rig.devices["gpu-0-mig-3g20gb-9-4"].gpu.uuid
    assert "gpu-0" not in rig.devices
    ref = rig.claims.add("c", ["gpu-0-mig-3g20gb-9-4"])
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    assert rig.backend.mig_mode(gpu).current  # type: ignore[union-attr]  # Ampere: left on
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
    h100.engine._checkpoint.update(lambda cp: cp.with_claim(half))
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
    assert h100.actuator.destroy_unowned({gpu: True}, owned) == 1
    remaining = h100.backend.gpu_instances(gpu)
    assert stray.id not in [g.id for g in remaining] and len(remaining) == 1
