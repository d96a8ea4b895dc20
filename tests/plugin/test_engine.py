"""The prepare engine's state machine, driven directly (the gRPC layer is tested separately)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.plugin.checkpoint import ClaimRecord, ClaimState, PreparedDevice
from tests.plugin.conftest import DRIVER, NODE, EngineRig

V = "gpu.dra.dev/v1beta1"


def _spec(rig: EngineRig, uid: str) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(rig.spec_path(uid).read_text())
    return spec


def test_prepare_writes_cdi_and_checkpoint(rig: EngineRig) -> None:
    ref = rig.claims.add("train", ["gpu-0", "gpu-1"], same_request=True)
    result = rig.engine.prepare([ref])[ref.uid]
    assert result.error == ""
    assert [d.device for d in result.devices] == ["gpu-0", "gpu-1"]
    assert result.devices[0].cdi_device_ids == (f"k8s.{DRIVER}/claim={ref.uid}-gpu-0",)
    assert result.devices[0].pool == NODE and result.devices[1].request_names == ("r0",)
    spec = _spec(rig, ref.uid)
    assert spec["kind"] == f"k8s.{DRIVER}/claim"
    # The lowest version covering the features used: a device name starting with a digit needs 0.5.0.
    assert spec["cdiVersion"] == ("0.5.0" if ref.uid[0].isdigit() else "0.3.0")
    gpu0 = rig.devices["gpu-0"].gpu.uuid
    assert f"DRA_DEVICE_GPU_0_UUID={gpu0}" in spec["devices"][0]["containerEdits"]["env"]
    visible = [e for e in spec["containerEdits"]["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert visible == [f"NVIDIA_VISIBLE_DEVICES={gpu0},{rig.devices['gpu-1'].gpu.uuid}"]
    record = rig.engine.prepared_claims().claims[ref.uid]
    assert record.state is ClaimState.PREPARE_COMPLETED
    assert [d.device for d in record.devices] == ["gpu-0", "gpu-1"]


def test_claim_wide_visibility_only_where_every_container_gets_every_device(rig: EngineRig) -> None:
    """Two requests: a container may reference only one, so no claim-wide NVIDIA_VISIBLE_DEVICES (CDI would hand
    it to that container too); each device's own DRA_DEVICE_*_UUID is exact."""
    ref = rig.claims.add("split", ["gpu-5", "gpu-6"])
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    spec = _spec(rig, ref.uid)
    assert "containerEdits" not in spec or not spec["containerEdits"].get("env")
    env = [e for d in spec["devices"] for e in d["containerEdits"]["env"]]
    assert f"DRA_DEVICE_GPU_5_UUID={rig.devices['gpu-5'].gpu.uuid}" in env
    assert f"DRA_DEVICE_GPU_6_UUID={rig.devices['gpu-6'].gpu.uuid}" in env


def test_prepare_is_idempotent_and_touches_nothing_the_second_time(rig: EngineRig) -> None:
    ref = rig.claims.add("c", ["gpu-2"])
    first = rig.engine.prepare([ref])[ref.uid]
    mtime = rig.spec_path(ref.uid).stat().st_mtime_ns
    reads = rig.claims.reads
    second = rig.engine.prepare([ref])[ref.uid]
    assert second == first
    assert rig.claims.reads == reads  # answered from the checkpoint alone
    assert rig.spec_path(ref.uid).stat().st_mtime_ns == mtime


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda obj: None, "does not exist"),
        (lambda obj: obj["metadata"].update(uid="other"), "deleted and re-created"),
        (lambda obj: obj["status"].clear(), "not allocated"),
    ],
)
def test_claim_problems_are_per_claim_errors(rig: EngineRig, mutate: Any, fragment: str) -> None:
    ref = rig.claims.add("c", ["gpu-0"])
    good = rig.claims.add("ok", ["gpu-1"])
    obj = rig.claims.objects[("default", "c")]
    if mutate(obj) is None and fragment == "does not exist":
        del rig.claims.objects[("default", "c")]
    results = rig.engine.prepare([ref, good])
    assert fragment in results[ref.uid].error
    assert "default/c" in results[ref.uid].error
    assert results[good.uid].error == ""
    assert not rig.spec_path(ref.uid).exists()
    assert ref.uid not in rig.engine.prepared_claims().claims


def test_results_of_other_drivers_and_pools_are_ignored(rig: EngineRig) -> None:
    other_driver = rig.claims.add("x", ["gpu-0"], driver="other.example.com")
    other_pool = rig.claims.add("y", ["gpu-0"], pool="node-b")
    results = rig.engine.prepare([other_driver, other_pool])
    assert results[other_driver.uid].devices == () and results[other_driver.uid].error == ""
    assert results[other_pool.uid].devices == ()
    assert list(rig.cdi_root.glob("*.json")) == [] if rig.cdi_root.exists() else True


def test_unknown_device_is_refused(rig: EngineRig) -> None:
    ref = rig.claims.add("c", ["gpu-99"])
    assert "'gpu-99'" in rig.engine.prepare([ref])[ref.uid].error


def test_device_held_by_another_claim_is_refused_naming_both(rig: EngineRig) -> None:
    first = rig.claims.add("first", ["gpu-3"])
    second = rig.claims.add("second", ["gpu-3"], namespace="team-b")
    assert rig.engine.prepare([first])[first.uid].error == ""
    error = rig.engine.prepare([second])[second.uid].error
    assert "default/first" in error and "team-b/second" in error and first.uid in error
    assert second.uid not in rig.engine.prepared_claims().claims


def test_admin_access_may_share_a_prepared_device(rig: EngineRig) -> None:
    first = rig.claims.add("first", ["gpu-3"])
    monitor = rig.claims.add("monitor", ["gpu-3"], admin=True)
    assert rig.engine.prepare([first])[first.uid].error == ""
    assert rig.engine.prepare([monitor])[monitor.uid].error == ""


def test_bad_config_names_the_field(rig: EngineRig) -> None:
    config = [
        {
            "source": "FromClaim",
            "requests": [],
            "opaque": {
                "driver": DRIVER,
                "parameters": {"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": "Spatial"}},
            },
        }
    ]
    ref = rig.claims.add("c", ["gpu-0"], config=config)
    error = rig.engine.prepare([ref])[ref.uid].error
    assert "status.allocation.devices.config[0].opaque.parameters.sharing.strategy" in error
    assert "Exclusive, TimeSlicing, MPS" in error


def test_mps_config_without_an_mps_control_is_refused_as_not_enabled(rig: EngineRig) -> None:
    rig.engine.close()
    rig.mps = lambda: None  # type: ignore[method-assign]  # a backend without MPS (none today but the fake has one)
    rig.engine = rig.new_engine()
    config = [
        {
            "source": "FromClass",
            "opaque": {
                "driver": DRIVER,
                "parameters": {"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}},
            },
        }
    ]
    ref = rig.claims.add("c", ["gpu-0"], config=config)
    error = rig.engine.prepare([ref])[ref.uid].error
    assert "MPS" in error and "not enabled" in error
    assert ref.uid not in rig.engine.prepared_claims().claims
    assert not rig.spec_path(ref.uid).exists()


def test_unprepare_is_the_exact_inverse_and_idempotent(rig: EngineRig) -> None:
    ref = rig.claims.add("c", ["gpu-0"])
    rig.engine.prepare([ref])
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    assert not rig.spec_path(ref.uid).exists()
    assert rig.engine.prepared_claims().claims == {}
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    unknown = ClaimRef("default", "never", "uid-never")
    assert rig.engine.unprepare([unknown]) == {unknown.uid: ""}


def test_failure_after_checkpoint_started_rolls_everything_back(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = rig.claims.add("c", ["gpu-0"])

    def broken_write(*args: Any, **kwargs: Any) -> Any:
        raise OSError("disk full")

    monkeypatch.setattr(rig.cdi, "write", broken_write)
    assert "disk full" in rig.engine.prepare([ref])[ref.uid].error
    assert rig.engine.prepared_claims().claims == {}
    monkeypatch.undo()
    assert rig.engine.prepare([ref])[ref.uid].error == ""


def test_recover_rolls_back_half_prepared_claims_and_orphan_specs(rig: EngineRig) -> None:
    done = rig.claims.add("done", ["gpu-1"])
    rig.engine.prepare([done])
    half = ClaimRecord(
        "uid-half", "default", "half", ClaimState.PREPARE_STARTED, allocated=(PreparedDevice(("r0",), NODE, "gpu-0"),)
    )
    rig.checkpoint.update(lambda cp: cp.with_claim(half))
    rig.cdi_root.mkdir(exist_ok=True)
    (rig.cdi_root / f"k8s.{DRIVER}-claim_{NODE}_uid-half.json").write_text("{}")
    (rig.cdi_root / f"k8s.{DRIVER}-claim_{NODE}_uid-orphan.json").write_text("{}")
    (rig.cdi_root / f"k8s.{DRIVER}-claim_node-b_uid-other-node.json").write_text("{}")
    (rig.cdi_root / "other-vendor.json").write_text("{}")
    engine = rig.new_engine()
    assert engine.recovery.recover().finished == ("uid-half",)
    assert set(engine.prepared_claims().claims) == {done.uid}
    assert sorted(p.name for p in rig.cdi_root.iterdir()) == sorted(
        [rig.spec_path(done.uid).name, f"k8s.{DRIVER}-claim_node-b_uid-other-node.json", "other-vendor.json"]
    )
    engine.close()


def test_cleanup_releases_claims_deleted_or_recreated(rig: EngineRig) -> None:
    gone = rig.claims.add("gone", ["gpu-0"])
    recreated = rig.claims.add("recreated", ["gpu-1"])
    kept = rig.claims.add("kept", ["gpu-2"])
    rig.engine.prepare([gone, recreated, kept])
    del rig.claims.objects[("default", "gone")]
    rig.claims.objects[("default", "recreated")]["metadata"]["uid"] = "new-uid"
    assert sorted(rig.engine.recovery.cleanup_stale()) == sorted([gone.uid, recreated.uid])
    assert set(rig.engine.prepared_claims().claims) == {kept.uid}
    assert not rig.spec_path(gone.uid).exists()


def test_claims_on_different_gpus_prepare_concurrently(rig: EngineRig, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two claims on different GPUs must be inside their effects (the CDI spec's write, under the GPU locks) at the
    same time (no global lock)."""
    inside = threading.Barrier(2, timeout=10)
    real_write = rig.cdi.write

    def write(*args: Any) -> Any:
        inside.wait()  # both claims must arrive here together, or BrokenBarrierError fails the claim
        return real_write(*args)

    monkeypatch.setattr(rig.cdi, "write", write)
    a, b = rig.claims.add("a", ["gpu-4"]), rig.claims.add("b", ["gpu-5"])
    results = rig.engine.prepare([a, b])
    assert results[a.uid].error == "" and results[b.uid].error == ""


def test_subrequest_results_are_reported_under_their_request(rig: EngineRig) -> None:
    ref = rig.claims.add("first-available", ["gpu-7"])
    rig.claims.objects[("default", "first-available")]["status"]["allocation"]["devices"]["results"][0]["request"] = "gpu/h100"
    result = rig.engine.prepare([ref])[ref.uid]
    assert result.error == "" and result.devices[0].request_names == ("gpu",)


@pytest.mark.parametrize("damage", ["deleted", "truncated", "edited", "cdi-dir-removed"])
def test_repeated_prepare_repairs_a_damaged_cdi_spec(rig: EngineRig, damage: str) -> None:
    """Issue 12 finding 2: the checkpoint says prepared, but the spec the CDI ids point to is gone or wrong; the
    repeated prepare rewrites exactly what the first one wrote instead of returning ids nothing resolves."""
    ref = rig.claims.add("c", ["gpu-2", "gpu-3"], same_request=True)
    first = rig.engine.prepare([ref])[ref.uid]
    original = rig.spec_path(ref.uid).read_bytes()
    if damage == "deleted":
        rig.spec_path(ref.uid).unlink()
    elif damage == "truncated":
        rig.spec_path(ref.uid).write_bytes(original[: len(original) // 2])
    elif damage == "edited":
        rig.spec_path(ref.uid).write_bytes(original.replace(b"NVIDIA_VISIBLE_DEVICES=", b"NVIDIA_VISIBLE_DEVICES=x,"))
    else:
        for path in rig.cdi_root.iterdir():
            path.unlink()
        rig.cdi_root.rmdir()
    assert rig.engine.prepare([ref])[ref.uid] == first
    assert rig.spec_path(ref.uid).read_bytes() == original
    assert rig.claims.reads == 1  # repaired from the record alone


def test_prepared_claim_whose_gpu_left_the_catalog_is_a_clear_error(rig: EngineRig) -> None:
    ref = rig.claims.add("c", ["gpu-4"])
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    rig.spec_path(ref.uid).unlink()
    rig.devices = {k: v for k, v in rig.devices.items() if k != "gpu-4"}
    error = rig.engine.prepare([ref])[ref.uid].error
    assert "gpu-4" in error and "no longer offered" in error and "delete the pod" in error


def _plant_temp_files(rig: EngineRig, uid: str) -> tuple[list[Path], list[Path]]:
    """Crash leftovers of our own writes, and look-alikes that are not ours."""
    plugin_dir, cdi = rig.checkpoint_path.parent, rig.cdi_root
    cdi.mkdir(exist_ok=True)
    ours = [
        plugin_dir / ".checkpoint.json.a1b2c3d4.tmp",
        plugin_dir / ".checkpoint.json.q_9zk0x1.tmp",  # the name an older version (tempfile.mkstemp) chose
        cdi / f".k8s.{DRIVER}-claim_{NODE}_{uid}.json.0f0f0f0f.tmp",
    ]
    theirs = [
        plugin_dir / "checkpoint.json.tmp",
        plugin_dir / ".checkpoint.json.a1b2c3d4.tmp.keep",
        plugin_dir / ".checkpoint.json.lock.a1b2c3d4.tmp",
        plugin_dir / ".checkpoint.json.toolong99.tmp",
        cdi / f".k8s.{DRIVER}-claim_node-b_{uid}.json.0f0f0f0f.tmp",  # another node sharing the CDI dir
        cdi / ".k8s.other.example.com-claim_node-a_x.json.0f0f0f0f.tmp",
        cdi / ".vendor-runtime.json.12345678.tmp",
    ]
    for path in ours + theirs:
        path.write_bytes(b"partial")
    lookalike_dir = cdi / f".k8s.{DRIVER}-claim_{NODE}_{uid}.json.99999999.tmp"
    lookalike_dir.mkdir()
    return ours, [*theirs, lookalike_dir]


def test_startup_sweeps_exactly_our_crash_leftover_temp_files(rig: EngineRig) -> None:
    """Issue 12 finding 5: `.checkpoint.json.*.tmp` and our CDI `.tmp` files left by a crash mid-write are
    deleted at startup; nothing else in the plugin dir or the shared CDI dir is touched."""
    ref = rig.claims.add("c", ["gpu-0"])
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    ours, theirs = _plant_temp_files(rig, ref.uid)
    engine = rig.new_engine()
    report = engine.recovery.recover()
    assert [p for p in ours if p.exists()] == []
    assert [p for p in theirs if not p.exists()] == []
    assert sorted(report.removed_temp_files) == sorted(str(p) for p in ours)
    assert rig.spec_path(ref.uid).exists() and ref.uid in engine.prepared_claims().claims
    engine.close()


def test_write_failures_are_clear_per_claim_errors(rig: EngineRig) -> None:
    """Issue 12 finding 6: an unwritable CDI dir or plugin dir fails the claim with the path, the reason and the
    flag to check, and leaves nothing behind."""
    from tests.plugin.readonly import read_only

    ref = rig.claims.add("c", ["gpu-0"])
    rig.cdi_root.mkdir(exist_ok=True)
    with read_only(rig.cdi_root):
        error = rig.engine.prepare([ref])[ref.uid].error
    assert str(rig.spec_path(ref.uid)) in error and "--cdi-root" in error and "must be writable" in error
    assert "internal error" not in error and ".tmp" not in error
    assert rig.engine.prepared_claims().claims == {}

    with read_only(rig.checkpoint_path.parent):
        error = rig.engine.prepare([ref])[ref.uid].error
    assert str(rig.checkpoint_path) in error and "--plugin-dir" in error and "must be writable" in error
    assert "internal error" not in error and ".tmp" not in error
    assert rig.engine.prepare([ref])[ref.uid].error == ""  # writable again: the kubelet's retry works


def test_a_first_start_with_nothing_on_the_node_asks_the_api_nothing(rig: EngineRig) -> None:
    rig.claims.add("elsewhere", ["gpu-0"])
    assert not rig.checkpoint_path.exists()
    report = rig.engine.recovery.recover()
    assert report.rebuild_reason is None and rig.claims.lists == 0


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda obj: obj.update(metadata="x"), "metadata: must be an object, got str"),
        (lambda obj: obj["status"].update(allocation=["x"]), "status.allocation: must be an object, got list"),
        (
            lambda obj: obj["status"]["allocation"]["devices"].update(results={}),
            "status.allocation.devices.results: must be a list, got dict",
        ),
        (
            lambda obj: obj["status"]["allocation"]["devices"]["results"][0].update(device=7),
            "status.allocation.devices.results[0].device: must be",
        ),
    ],
)
def test_a_malformed_claim_object_fails_the_claim_naming_the_field(rig: EngineRig, mutate: Any, fragment: str) -> None:
    ref = rig.claims.add("c", ["gpu-0"])
    mutate(rig.claims.objects[("default", "c")])
    error = rig.engine.prepare([ref])[ref.uid].error
    assert fragment in error and "internal error" not in error
