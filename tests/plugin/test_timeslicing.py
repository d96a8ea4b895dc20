"""Time-slicing at prepare: the GPU's time-slice is set from the claim's config, recorded in the checkpoint and
reset to Default by the last unprepare; on MIG devices TimeSlicing alone is accepted with nothing to apply and an
interval is refused; GPUs without support get per-claim errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dra_driver.inventory.catalog import MigOffering
from dra_driver.nvml.types import TimeSlice
from dra_driver.plugin.checkpoint import ClaimRecord, ClaimState, PreparedDevice
from tests.plugin.conftest import DRIVER, EngineRig

V = "gpu.dra.dev/v1beta1"


def _config(kind: str = "GpuConfig", interval: str | None = "Long", requests: list[str] | None = None) -> list[Any]:
    sharing: dict[str, Any] = {"strategy": "TimeSlicing"}
    if interval is not None:
        sharing["timeSlicingConfig"] = {"interval": interval}
    return [
        {
            "source": "FromClaim",
            "requests": requests or [],
            "opaque": {"driver": DRIVER, "parameters": {"apiVersion": V, "kind": kind, "sharing": sharing}},
        }
    ]


def _state_rig(tmp_path: Path, spec: str = "fake:dgx-h100", **kwargs: Any) -> EngineRig:
    return EngineRig(tmp_path, backend_spec=f"{spec},state={tmp_path / 'nvml-state.json'}", **kwargs)


def _file_time_slices(rig: EngineRig) -> dict[str, str]:
    """GPU UUID -> time_slice as written in the fake NVML state file (what survives a restart)."""
    doc = json.loads((rig.tmp / "nvml-state.json").read_bytes())
    return {g["uuid"]: g["time_slice"] for g in doc["gpus"]}


def _checkpoint_devices(rig: EngineRig, uid: str) -> list[dict[str, Any]]:
    doc = json.loads(rig.checkpoint_path.read_bytes())
    assert doc["version"] == 1
    devices: list[dict[str, Any]] = doc["payload"]["claims"][uid]["devices"]
    return devices


def test_time_slice_is_applied_recorded_and_reset(tmp_path: Path) -> None:
    rig = _state_rig(tmp_path)
    gpu0, gpu1 = rig.devices["gpu-0"].gpu.uuid, rig.devices["gpu-1"].gpu.uuid
    ref = rig.claims.add("ts", ["gpu-0"], config=_config(interval="Long"))
    result = rig.engine.prepare([ref])[ref.uid]
    assert result.error == ""
    assert _file_time_slices(rig)[gpu0] == "LONG"
    assert _file_time_slices(rig)[gpu1] == "DEFAULT"  # other GPUs untouched
    [device] = _checkpoint_devices(rig, ref.uid)
    assert device["sharing"] == "TimeSlicing" and device["timeSlice"] == "Long"
    spec = json.loads(rig.spec_path(ref.uid).read_bytes())
    assert "DRA_DEVICE_GPU_0_SHARING=TimeSlicing" in spec["devices"][0]["containerEdits"]["env"]
    # A repeated prepare is answered from the checkpoint and changes nothing.
    assert rig.engine.prepare([ref])[ref.uid] == result
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    assert _file_time_slices(rig)[gpu0] == "DEFAULT"
    assert json.loads(rig.checkpoint_path.read_bytes())["payload"]["claims"] == {}
    rig.engine.close()


def test_time_slicing_without_interval_sets_default(tmp_path: Path) -> None:
    rig = _state_rig(tmp_path)
    ref = rig.claims.add("ts", ["gpu-2"], config=_config(interval=None))
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    assert _checkpoint_devices(rig, ref.uid)[0]["timeSlice"] == "Default"
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    rig.engine.close()


def test_exclusive_claims_record_no_time_slice(tmp_path: Path) -> None:
    rig = _state_rig(tmp_path)
    ref = rig.claims.add("ex", ["gpu-0"])
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    assert "timeSlice" not in _checkpoint_devices(rig, ref.uid)[0]
    assert set(_file_time_slices(rig).values()) == {"DEFAULT"}
    rig.engine.close()


def test_time_slicing_without_interval_on_a_mig_device_is_accepted_with_nothing_applied(tmp_path: Path) -> None:
    """NVIDIA's `simple-mig-ts`: MigDeviceConfig TimeSlicing, no timeSlicingConfig. Nothing to apply (the time-slice
    is a setting of the whole GPU), the claim is prepared and a note for a Normal Event says so."""
    rig = _state_rig(tmp_path, policy=MigOffering.DYNAMIC)
    mig = "gpu-0-mig-3g40gb-9-0"
    ref = rig.claims.add("ts-mig", [mig], config=_config(kind="MigDeviceConfig", interval=None, requests=["r0"]))
    result = rig.engine.prepare([ref])[ref.uid]
    assert result.error == ""
    [note] = result.notes
    assert f"TimeSlicing on MIG device(s) {mig}: nothing to apply" in note
    [device] = _checkpoint_devices(rig, ref.uid)
    assert device["sharing"] == "TimeSlicing" and "timeSlice" not in device  # recorded, never applied
    assert set(_file_time_slices(rig).values()) == {"DEFAULT"}
    spec = json.loads(rig.spec_path(ref.uid).read_bytes())
    assert any(e.endswith("_SHARING=TimeSlicing") for e in spec["devices"][0]["containerEdits"]["env"])
    # The answer from the checkpoint (a repeated prepare) carries no note: the Event was recorded once.
    assert rig.engine.prepare([ref])[ref.uid].notes == ()
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    assert set(_file_time_slices(rig).values()) == {"DEFAULT"}
    rig.engine.close()


def test_an_interval_on_a_mig_device_is_refused_naming_the_field(tmp_path: Path) -> None:
    rig = _state_rig(tmp_path, policy=MigOffering.DYNAMIC)
    mig = "gpu-0-mig-3g40gb-9-0"
    ref = rig.claims.add("ts-mig", [mig], config=_config(kind="MigDeviceConfig", interval="Short", requests=["r0"]))
    error = rig.engine.prepare([ref])[ref.uid].error
    assert "sharing.timeSlicingConfig.interval" in error and "a MIG device takes no time-slice interval" in error
    assert "remove sharing.timeSlicingConfig" in error
    assert ref.uid not in rig.engine.prepared_claims().claims
    assert not rig.spec_path(ref.uid).exists()
    # Refused before anything was touched: MIG was not even enabled for it.
    mode = rig.backend.mig_mode(rig.devices[mig].gpu.uuid)
    assert mode is not None and not mode.current
    rig.engine.close()


def test_unsupported_gpu_gives_a_per_claim_error(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text(
        "name: p4-node\ngpus:\n  - model: H100-SXM5-80GB\n    count: 1\n    time_slice: unsupported\n"
        "  - model: H100-SXM5-80GB\n    count: 1\n"
    )
    rig = EngineRig(tmp_path, backend_spec=f"fake:{node},state={tmp_path / 'nvml-state.json'}")
    bad = rig.claims.add("ts", ["gpu-0"], config=_config())
    good = rig.claims.add("ts-ok", ["gpu-1"], config=_config(interval="Short"))
    plain = rig.claims.add("plain", ["gpu-0"], namespace="other")
    results = rig.engine.prepare([bad, good])
    assert "does not support setting a time-slice" in results[bad.uid].error
    assert "NOT_SUPPORTED" in results[bad.uid].error and "default/ts" in results[bad.uid].error
    assert bad.uid not in rig.engine.prepared_claims().claims  # rolled back, nothing half-done
    assert not rig.spec_path(bad.uid).exists()
    assert results[good.uid].error == ""
    assert _file_time_slices(rig)[rig.devices["gpu-1"].gpu.uuid] == "SHORT"
    # The GPU itself stays usable for claims without time-slicing.
    assert rig.engine.prepare([plain])[plain.uid].error == ""
    assert rig.engine.unprepare([good, plain]) == {good.uid: "", plain.uid: ""}
    rig.engine.close()


def test_time_slice_survives_a_restart_and_is_reset_by_the_next_instance(tmp_path: Path) -> None:
    rig = _state_rig(tmp_path)
    gpu = rig.devices["gpu-3"].gpu.uuid
    ref = rig.claims.add("ts", ["gpu-3"], config=_config(interval="Medium"))
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    rig.engine.close()
    again = _state_rig(tmp_path)  # a new process: backend reopened from the state file
    again.claims = rig.claims
    again.engine = again.new_engine()
    assert again.backend.time_slice(gpu) is TimeSlice.MEDIUM
    report = again.engine.recovery.recover()
    assert report.repaired == () and again.backend.time_slice(gpu) is TimeSlice.MEDIUM
    assert again.engine.unprepare([ref]) == {ref.uid: ""}
    assert _file_time_slices(again)[gpu] == "DEFAULT"
    again.engine.close()


def test_a_lost_time_slice_is_repaired_by_the_next_prepare(tmp_path: Path) -> None:
    rig = _state_rig(tmp_path)
    gpu = rig.devices["gpu-4"].gpu.uuid
    ref = rig.claims.add("ts", ["gpu-4"], config=_config(interval="Short"))
    first = rig.engine.prepare([ref])[ref.uid]
    rig.backend.set_time_slice(gpu, TimeSlice.DEFAULT)  # e.g. a driver reload
    assert rig.engine.prepare([ref])[ref.uid] == first
    assert _file_time_slices(rig)[gpu] == "SHORT"
    rig.engine.close()


def test_recovery_resets_a_time_slice_no_record_holds(tmp_path: Path) -> None:
    rig = _state_rig(tmp_path)
    gpu = rig.devices["gpu-5"].gpu.uuid
    rig.backend.set_time_slice(gpu, TimeSlice.LONG)  # left behind with a lost checkpoint
    rig.engine.recovery.recover()
    assert _file_time_slices(rig)[gpu] == "DEFAULT"
    rig.engine.close()


def test_a_crashed_prepare_is_rolled_back_to_default(tmp_path: Path) -> None:
    """What a SIGKILL after the time-slice was set leaves: the PrepareStarted record names the interval, and the
    rollback at startup resets the GPU."""
    rig = _state_rig(tmp_path)
    gpu = rig.devices["gpu-6"].gpu.uuid
    ref = rig.claims.add("ts", ["gpu-6"], config=_config())
    planned = PreparedDevice(("r0",), "node-a", "gpu-6", gpu_uuid=gpu, sharing="TimeSlicing", time_slice="Long")
    record = ClaimRecord(ref.uid, ref.namespace, ref.name, ClaimState.PREPARE_STARTED, allocated=(planned,))
    rig.checkpoint.update(lambda cp: cp.with_claim(record))
    rig.backend.set_time_slice(gpu, TimeSlice.LONG)
    report = rig.engine.recovery.recover()
    assert report.finished == (ref.uid,)
    assert _file_time_slices(rig)[gpu] == "DEFAULT"
    assert rig.engine.prepared_claims().claims == {}
    rig.engine.close()


def test_shares_keep_the_time_slice_until_the_last_one_goes(tmp_path: Path) -> None:
    """Reference counting over checkpoint records: two records on one GPU (the shape consumable capacity will
    produce) keep the GPU's time-slice until both are gone; a share asking for another interval is refused."""
    rig = _state_rig(tmp_path)
    gpu = rig.devices["gpu-7"].gpu.uuid
    first = rig.claims.add("a", ["gpu-7"], config=_config(interval="Long"))
    assert rig.engine.prepare([first])[first.uid].error == ""
    share = PreparedDevice(("r0",), "node-a", "gpu-7", share_id="s-1", gpu_uuid=gpu, time_slice="Long")
    other = ClaimRecord(
        "uid-share", "team", "share", ClaimState.PREPARE_COMPLETED, devices=(share,), allocated=(share,)
    )
    rig.checkpoint.update(lambda cp: cp.with_claim(other))
    assert rig.engine.unprepare([first]) == {first.uid: ""}
    assert _file_time_slices(rig)[gpu] == "LONG"  # still held by the share
    clash = rig.claims.add("b", ["gpu-7"], config=_config(interval="Short"))
    rig.claims.objects[("default", "b")]["status"]["allocation"]["devices"]["results"][0]["shareID"] = "s-2"
    error = rig.engine.prepare([clash])[clash.uid].error
    assert "runs another time-slice for claim(s) team/share (Long)" in error
    from dra_driver.kubeletplugin.driver import ClaimRef

    assert rig.engine.unprepare([ClaimRef("team", "share", "uid-share")]) == {"uid-share": ""}
    assert _file_time_slices(rig)[gpu] == "DEFAULT"
    rig.engine.close()
