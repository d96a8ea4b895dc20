"""MPS at prepare: a claim's MPS devices get one control daemon with the config's limits, GPU shares get one daemon
per GPU with each share's consumed capacity; the daemon, its directories and the compute mode live exactly as long
as the records that hold them. Everything is read back from what a restart would see: the fake NVML state file,
the directories on disk, the CDI spec and the checkpoint."""

from __future__ import annotations

import json
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind, MigOffering, shared_device_name
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.nvml.factory import open_mps_control
from dra_driver.nvml.mps import MpsDaemonSpec
from tests.plugin.conftest import DRIVER, EngineRig

V = "gpu.dra.dev/v1beta1"
GI = 1024**3


def _mps(kind: str = "GpuConfig", **mps_config: Any) -> list[Any]:
    sharing: dict[str, Any] = {"strategy": "MPS"}
    if mps_config:
        sharing["mpsConfig"] = mps_config
    return [
        {
            "source": "FromClaim",
            "requests": [],
            "opaque": {"driver": DRIVER, "parameters": {"apiVersion": V, "kind": kind, "sharing": sharing}},
        }
    ]


def _rig(tmp_path: Path, policy: MigOffering = MigOffering.STATIC, spec: str = "fake:dgx-h100") -> EngineRig:
    return EngineRig(tmp_path, backend_spec=f"{spec},state={tmp_path / 'nvml-state.json'}", policy=policy)


def _state(rig: EngineRig) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((rig.tmp / "nvml-state.json").read_bytes())
    return doc


def _daemons(rig: EngineRig) -> dict[str, dict[str, Any]]:
    return {d["id"]: d for d in _state(rig).get("mps_daemons", [])}


def _compute_modes(rig: EngineRig) -> dict[str, str]:
    return {g["uuid"]: g["compute_mode"] for g in _state(rig)["gpus"]}


def _mps_root(rig: EngineRig) -> Path:
    return rig.checkpoint_path.parent / "mps"


def _edits(rig: EngineRig, uid: str) -> dict[str, Any]:
    edits: dict[str, Any] = json.loads(rig.spec_path(uid).read_bytes())["containerEdits"]
    return edits


def _recorded(rig: EngineRig, uid: str) -> list[dict[str, Any]]:
    doc = json.loads(rig.checkpoint_path.read_bytes())
    devices: list[dict[str, Any]] = doc["payload"]["claims"][uid]["devices"]
    return devices


def _everything_released(rig: EngineRig) -> None:
    assert _daemons(rig) == {}
    assert set(_compute_modes(rig).values()) == {"DEFAULT"}
    assert not _mps_root(rig).exists() or list(_mps_root(rig).iterdir()) == []


# --- MPS by config ------------------------------------------------------------------------------------


def test_mps_claim_gets_a_daemon_with_its_limits_and_loses_it_on_unprepare(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    gpu0, gpu1 = rig.devices["gpu-0"].gpu.uuid, rig.devices["gpu-1"].gpu.uuid
    config = _mps(defaultActiveThreadPercentage=50, defaultPinnedDeviceMemoryLimit="10Gi")
    ref = rig.claims.add("mps", ["gpu-0"], config=config)
    assert rig.engine.prepare([ref])[ref.uid].error == ""

    daemon_id = f"claim-{ref.uid}"
    daemon = _daemons(rig)[daemon_id]
    directory = _mps_root(rig) / daemon_id
    assert daemon["visible_uuids"] == [gpu0]
    assert daemon["active_thread_percentage"] == 50
    assert daemon["pinned_memory_limits"] == {gpu0: 10 * GI}
    assert daemon["pipe_directory"] == str(directory / "pipe")
    assert daemon["multi_user"] is False
    assert _compute_modes(rig)[gpu0] == "EXCLUSIVE_PROCESS"
    assert _compute_modes(rig)[gpu1] == "DEFAULT"
    for sub in ("pipe", "log", "shm"):
        assert stat.S_IMODE((directory / sub).stat().st_mode) == 0o755  # MPS servers run as the client's UID
    edits = _edits(rig, ref.uid)
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in edits["env"]
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    assert mounts == {"/tmp/nvidia-mps": str(directory / "pipe"), "/dev/shm": str(directory / "shm")}
    [device] = _recorded(rig, ref.uid)
    assert device["sharing"] == "MPS"
    assert device["mps"] == {
        "daemon": daemon_id,
        "activeThreadPercentage": 50,
        "pinnedMemoryLimit": 10 * GI,
        "uuid": gpu0,
    }

    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    _everything_released(rig)


def test_a_limit_above_the_gpus_memory_is_refused_naming_field_device_and_memory(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    memory = rig.devices["gpu-0"].gpu.info.memory_total_bytes
    assert memory is not None
    ref = rig.claims.add("big", ["gpu-0"], config=_mps(defaultPinnedDeviceMemoryLimit="100Gi"))
    error = rig.engine.prepare([ref])[ref.uid].error
    assert "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: 102400Mi is more than GPU gpu-0 has" in error
    assert f"{memory} bytes" in error and f"at most {memory // 2**20}Mi" in error
    per_device = rig.claims.add("big0", ["gpu-1"], config=_mps(defaultPerDevicePinnedMemoryLimit={"0": "1Ei"}))
    error = rig.engine.prepare([per_device])[per_device.uid].error
    assert 'sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit["0"]' in error and "GPU gpu-1" in error
    exact = rig.claims.add("exact", ["gpu-2"], config=_mps(defaultPinnedDeviceMemoryLimit=str(memory)))
    assert rig.engine.prepare([exact])[exact.uid].error == ""  # the whole memory is a (pointless) valid limit
    assert rig.engine.unprepare([exact]) == {exact.uid: ""}
    assert _daemons(rig) == {} and ref.uid not in rig.engine.prepared_claims().claims
    _everything_released(rig)


def test_a_limit_above_a_mig_devices_memory_is_refused(tmp_path: Path) -> None:
    rig = _rig(tmp_path, policy=MigOffering.DYNAMIC)
    mig = "gpu-0-mig-1g10gb-19-6"
    profile = rig.devices[mig].profile
    assert profile is not None
    ref = rig.claims.add("mig", [mig], config=_mps("MigDeviceConfig", defaultPinnedDeviceMemoryLimit="20Gi"))
    error = rig.engine.prepare([ref])[ref.uid].error
    assert f"more than MIG device {mig} has ({profile.memory_bytes // 2**20}Mi" in error
    mode = rig.backend.mig_mode(rig.devices[mig].gpu.uuid)
    assert mode is not None and not mode.current  # refused before anything was touched
    _everything_released(rig)


def test_per_device_limits_by_uuid_and_by_index(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    gpu0, gpu1 = rig.devices["gpu-0"].gpu.uuid, rig.devices["gpu-1"].gpu.uuid
    config = _mps(defaultPinnedDeviceMemoryLimit="8Gi", defaultPerDevicePinnedMemoryLimit={gpu1: "4Gi", "0": "6Gi"})
    ref = rig.claims.add("two", ["gpu-0", "gpu-1"], config=config, same_request=True)
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    daemon = _daemons(rig)[f"claim-{ref.uid}"]
    assert daemon["visible_uuids"] == sorted([gpu0, gpu1])
    assert daemon["pinned_memory_limits"] == {gpu0: 6 * GI, gpu1: 4 * GI}
    assert daemon["active_thread_percentage"] is None
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    _everything_released(rig)


@pytest.mark.parametrize(
    ("mps_config", "expected"),
    [
        (
            {"defaultPerDevicePinnedMemoryLimit": {"GPU-00000000-0000-0000-0000-000000000000": "1Gi"}},
            'sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit["GPU-00000000-0000-0000-0000-000000000000"]: '
            "no device of this claim has that UUID",
        ),
        (
            {"defaultPerDevicePinnedMemoryLimit": {"1": "1Gi"}},
            'sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit["1"]: the claim has 1 device(s) served by MPS',
        ),
        ({"defaultActiveThreadPercentage": 0}, "mpsConfig.defaultActiveThreadPercentage"),
        ({"defaultActiveThreadPercentage": 101}, "mpsConfig.defaultActiveThreadPercentage"),
        ({"defaultPinnedDeviceMemoryLimit": "512Ki"}, "mpsConfig.defaultPinnedDeviceMemoryLimit"),
    ],
)
def test_bad_mps_configs_fail_the_claim_naming_the_field_and_touch_nothing(
    tmp_path: Path, mps_config: dict[str, Any], expected: str
) -> None:
    rig = _rig(tmp_path)
    ref = rig.claims.add("bad", ["gpu-0"], config=_mps(**mps_config))
    error = rig.engine.prepare([ref])[ref.uid].error
    assert expected in error
    assert error.count("\n") == 0
    assert ref.uid not in rig.engine.prepared_claims().claims
    assert not rig.spec_path(ref.uid).exists()
    _everything_released(rig)


def test_mps_on_a_dynamic_mig_device(tmp_path: Path) -> None:
    rig = _rig(tmp_path, MigOffering.DYNAMIC)
    name = next(n for n, d in rig.devices.items() if d.profile is not None and d.profile.name == "3g.40gb")
    gpu = rig.devices[name].gpu.uuid
    ref = rig.claims.add("mig-mps", [name], config=_mps("MigDeviceConfig", defaultActiveThreadPercentage=40))
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    [device] = _recorded(rig, ref.uid)
    mig_uuid = device["mig"]["uuid"]
    daemon = _daemons(rig)[f"claim-{ref.uid}"]
    assert daemon["visible_uuids"] == [mig_uuid] and mig_uuid.startswith("MIG-")
    assert daemon["active_thread_percentage"] == 40
    assert _compute_modes(rig)[gpu] == "DEFAULT"  # MIG devices keep theirs
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    _everything_released(rig)
    assert all(not g["gpu_instances"] for g in _state(rig)["gpus"])


def test_a_killed_daemon_is_started_again_by_the_next_prepare(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    ref = rig.claims.add("mps", ["gpu-0"], config=_mps(defaultActiveThreadPercentage=30))
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    control = open_mps_control(rig.backend)
    assert control is not None
    daemon = f"claim-{ref.uid}"
    control.stop(MpsDaemonSpec(id=daemon, directory=str(_mps_root(rig) / daemon), visible_uuids=()))
    assert _daemons(rig) == {}
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    assert _daemons(rig)[f"claim-{ref.uid}"]["active_thread_percentage"] == 30


def test_a_restarted_plugin_adopts_the_running_daemon_and_still_releases_it(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    ref = rig.claims.add("mps", ["gpu-0"], config=_mps(defaultActiveThreadPercentage=30))
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    before = _daemons(rig)
    rig.engine.close()
    rig.engine = rig.new_engine()
    report = rig.engine.recovery.recover()
    assert report.finished == () and report.repaired == ()
    assert _daemons(rig) == before
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    _everything_released(rig)


def test_recovery_stops_a_daemon_no_record_holds(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    ref = rig.claims.add("mps", ["gpu-0"], config=_mps())
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    # The claim is gone from the API and from the checkpoint (lost file): only the daemon dir proves ownership.
    del rig.claims.objects[("default", "mps")]
    rig.engine.close()
    rig.checkpoint_path.unlink()
    rig.engine = rig.new_engine()
    rig.engine.recovery.recover()
    _everything_released(rig)


# --- shares (consumable capacity) -------------------------------------------------------------------


def _with_shared(rig: EngineRig) -> str:
    whole = rig.devices["gpu-0"]
    name = shared_device_name(whole.gpu)
    rig.devices = {**rig.devices, name: AllocatableDevice(name, DeviceKind.GPU_SHARED, whole.gpu)}
    return name


def _share(rig: EngineRig, claim: str, device: str, memory: str, compute: str, *, config: Any = None) -> ClaimRef:
    ref = rig.claims.add(claim, [device], config=config)
    [result] = rig.claims.objects[("default", claim)]["status"]["allocation"]["devices"]["results"]
    result["shareID"] = f"00000000-0000-0000-0000-{len(rig.claims.objects):012d}"
    result["consumedCapacity"] = {"memory": memory, "compute": compute}
    return ref


def test_shares_of_one_gpu_share_one_daemon_limited_per_share(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    shared = _with_shared(rig)
    gpu0 = rig.devices[shared].gpu.uuid
    refs = [
        _share(rig, "a", shared, "20Gi", "10"),
        _share(rig, "b", shared, "20Gi", "20"),
        _share(rig, "c", shared, "30Gi", "30"),
    ]
    results = rig.engine.prepare(refs)
    assert [results[r.uid].error for r in refs] == ["", "", ""]
    assert all(results[r.uid].devices[0].share_id for r in refs)
    daemon_id = "gpu-" + gpu0.lower().removeprefix("gpu-")
    [daemon] = _daemons(rig).values()
    assert daemon["id"] == daemon_id
    assert daemon["multi_user"] is True  # shares are different pods, usually different UIDs: -M
    assert daemon["visible_uuids"] == [gpu0]
    assert daemon["active_thread_percentage"] == 30  # the largest share: no client can go beyond it
    assert daemon["pinned_memory_limits"] == {gpu0: 30 * GI}
    assert sorted((s["claim"], s["active_thread_percentage"], s["pinned_memory_limit"]) for s in daemon["shares"]) == [
        ("default/a", 10, 20 * GI),
        ("default/b", 20, 20 * GI),
        ("default/c", 30, 30 * GI),
    ]
    assert _compute_modes(rig)[gpu0] == "EXCLUSIVE_PROCESS"
    env = _edits(rig, refs[0].uid)["env"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10" in env
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M" in env
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in env

    # The largest share goes: the daemon is re-limited to the shares left.
    assert rig.engine.unprepare([refs[2]]) == {refs[2].uid: ""}
    [daemon] = _daemons(rig).values()
    assert daemon["active_thread_percentage"] == 20
    assert daemon["pinned_memory_limits"] == {gpu0: 20 * GI}
    assert len(daemon["shares"]) == 2
    assert _compute_modes(rig)[gpu0] == "EXCLUSIVE_PROCESS"
    # The last share takes the daemon, its directory and the compute mode with it.
    assert rig.engine.unprepare(refs[:2]) == {refs[0].uid: "", refs[1].uid: ""}
    _everything_released(rig)


def test_whole_gpu_and_shares_of_it_exclude_each_other(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    shared = _with_shared(rig)
    share = _share(rig, "share", shared, "10Gi", "10")
    assert rig.engine.prepare([share])[share.uid].error == ""
    whole = rig.claims.add("whole", ["gpu-0"])
    error = rig.engine.prepare([whole])[whole.uid].error
    assert "device gpu-0 is already prepared for claim default/share" in error
    assert rig.engine.unprepare([share]) == {share.uid: ""}
    assert rig.engine.prepare([whole])[whole.uid].error == ""
    late = _share(rig, "late", shared, "10Gi", "10")
    assert f"device {shared} is already prepared for claim default/whole" in rig.engine.prepare([late])[late.uid].error
    assert _daemons(rig) == {}  # the refused share started nothing


def test_share_refusals(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    shared = _with_shared(rig)
    sliced = [
        {
            "source": "FromClaim",
            "requests": [],
            "opaque": {
                "driver": DRIVER,
                "parameters": {"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}},
            },
        }
    ]
    ts = _share(rig, "ts", shared, "10Gi", "10", config=sliced)
    assert "TimeSlicing on gpu-0-shared is refused" in rig.engine.prepare([ts])[ts.uid].error
    twice = rig.claims.add("twice", [shared, shared])
    for i, result in enumerate(rig.claims.objects[("default", "twice")]["status"]["allocation"]["devices"]["results"]):
        result["shareID"] = f"00000000-0000-0000-0000-00000000000{i}"
        result["consumedCapacity"] = {"memory": "1Gi", "compute": "1"}
    assert "one claim gets at most one share per GPU" in rig.engine.prepare([twice])[twice.uid].error
    no_share_id = rig.claims.add("bare", [shared])
    assert "has no shareID" in rig.engine.prepare([no_share_id])[no_share_id.uid].error
    _everything_released(rig)


def test_an_mps_config_on_a_share_only_narrows_it(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    shared = _with_shared(rig)
    narrow = _share(
        rig,
        "n",
        shared,
        "20Gi",
        "50",
        config=_mps(defaultActiveThreadPercentage=25, defaultPinnedDeviceMemoryLimit="40Gi"),
    )
    assert rig.engine.prepare([narrow])[narrow.uid].error == ""
    [device] = _recorded(rig, narrow.uid)
    assert device["mps"]["activeThreadPercentage"] == 25
    assert device["mps"]["pinnedMemoryLimit"] == 20 * GI


def test_devices_of_one_claim_must_agree_on_the_thread_limit(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    config = [
        {
            "source": "FromClaim",
            "requests": [request],
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": V,
                    "kind": "GpuConfig",
                    "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": pct}},
                },
            },
        }
        for request, pct in (("r0", 20), ("r1", 40))
    ]
    ref = rig.claims.add("split", ["gpu-0", "gpu-1"], config=config)
    error = rig.engine.prepare([ref])[ref.uid].error
    assert "defaultActiveThreadPercentage differs between the claim's MPS devices (gpu-0: 20, gpu-1: 40)" in error
    _everything_released(rig)


def test_multi_user_from_the_config_reaches_the_daemon(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    ref = rig.claims.add("mu", ["gpu-0"], config=_mps(multiUser=True))
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    assert _daemons(rig)[f"claim-{ref.uid}"]["multi_user"] is True
    assert _recorded(rig, ref.uid)[0]["mps"]["multiUser"] is True


def test_multi_user_on_a_gpu_older_than_volta_is_refused(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    whole = rig.devices["gpu-0"]
    info = replace(whole.gpu.info, cuda_compute_capability=(6, 1))
    rig.devices = {**rig.devices, "gpu-0": replace(whole, gpu=replace(whole.gpu, info=info))}
    ref = rig.claims.add("old", ["gpu-0"], config=_mps(multiUser=True))
    error = rig.engine.prepare([ref])[ref.uid].error
    assert "sharing.mpsConfig.multiUser: GPU gpu-0 has compute capability 6.1" in error
    _everything_released(rig)


# --- NVIDIA's consumable shares on the main class (`--consumable-shares`) ------------------------------


def _consumable(rig: EngineRig, count: int | None) -> str:
    whole = rig.devices["gpu-0"]
    rig.devices = {**rig.devices, "gpu-0": replace(whole, kind=DeviceKind.GPU_CONSUMABLE, share_count=count)}
    return "gpu-0"


def _consumed(rig: EngineRig, claim: str, device: str, consumed: dict[str, str]) -> ClaimRef:
    ref = rig.claims.add(claim, [device])
    [result] = rig.claims.objects[("default", claim)]["status"]["allocation"]["devices"]["results"]
    result["shareID"] = f"00000000-0000-0000-0000-{len(rig.claims.objects):012d}"
    result["consumedCapacity"] = consumed
    return ref


def test_integer_shares_are_enforced_as_thread_percentages_through_one_daemon(tmp_path: Path) -> None:
    """`--consumable-shares 4`: k of 4 shares is k/4 of the SMs; memory consumed 0 (NVIDIA's default) is no limit."""
    rig = _rig(tmp_path)
    gpu = _consumable(rig, 4)
    gpu0 = rig.devices[gpu].gpu.uuid
    one = _consumed(rig, "one", gpu, {"memory": "0", "shares": "1"})
    two = _consumed(rig, "two", gpu, {"memory": "2Gi", "shares": "2"})
    results = rig.engine.prepare([one, two])
    assert [results[r.uid].error for r in (one, two)] == ["", ""]
    assert [results[r.uid].devices[0].share_id for r in (one, two)] == [
        "00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000002"]  # fmt: skip
    [daemon] = _daemons(rig).values()
    assert daemon["visible_uuids"] == [gpu0]
    assert daemon["active_thread_percentage"] == 50  # the largest share (2 of 4)
    assert daemon["pinned_memory_limits"] == {}  # one share without a memory limit: none for the daemon
    assert sorted((s["claim"], s["active_thread_percentage"], s["pinned_memory_limit"]) for s in daemon["shares"]) == [
        ("default/one", 25, None), ("default/two", 50, 2 * GI)]  # fmt: skip
    assert _compute_modes(rig)[gpu0] == "EXCLUSIVE_PROCESS"
    env = _edits(rig, one.uid)["env"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in env and not any("PINNED" in e for e in env)
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M" in _edits(rig, two.uid)["env"]
    assert rig.engine.unprepare([one, two]) == {one.uid: "", two.uid: ""}
    _everything_released(rig)


def test_memory_shares_are_enforced_as_pinned_memory(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    gpu = _consumable(rig, None)
    ref = _consumed(rig, "mem", gpu, {"memory": "4Gi"})
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    [daemon] = _daemons(rig).values()
    assert daemon["active_thread_percentage"] is None
    assert [(s["active_thread_percentage"], s["pinned_memory_limit"]) for s in daemon["shares"]] == [(None, 4 * GI)]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M" in _edits(rig, ref.uid)["env"]
    no_share = rig.claims.add("noshare", [gpu])  # allocated by a scheduler without DRAConsumableCapacity
    assert "has no shareID" in rig.engine.prepare([no_share])[no_share.uid].error
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    _everything_released(rig)
