"""The prepare engine's state machine, driven directly (the gRPC layer is tested separately)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from dra_driver.plugin.checkpoint import ClaimRecord, ClaimState, PreparedDevice
from dra_driver.plugin.types import ClaimRef
from tests.plugin.conftest import DRIVER, NODE, EngineRig

V = "gpu.dra.dev/v1beta1"


def _spec(rig: EngineRig, uid: str) -> dict[str, Any]:
    return json.loads(rig.spec_path(uid).read_text())


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


def test_valid_sharing_config_is_not_enabled_yet(rig: EngineRig) -> None:
    config = [
        {
            "source": "FromClass",
            "opaque": {
                "driver": DRIVER,
                "parameters": {"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}},
            },
        }
    ]
    ref = rig.claims.add("c", ["gpu-0"], config=config)
    error = rig.engine.prepare([ref])[ref.uid].error
    assert "TimeSlicing" in error and "not enabled" in error
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

    monkeypatch.setattr(rig.engine._cdi, "write", broken_write)
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
    rig.engine._checkpoint.update(lambda cp: cp.with_claim(half))
    rig.cdi_root.mkdir(exist_ok=True)
    (rig.cdi_root / f"k8s.{DRIVER}-claim_{NODE}_uid-half.json").write_text("{}")
    (rig.cdi_root / f"k8s.{DRIVER}-claim_{NODE}_uid-orphan.json").write_text("{}")
    (rig.cdi_root / f"k8s.{DRIVER}-claim_node-b_uid-other-node.json").write_text("{}")
    (rig.cdi_root / "other-vendor.json").write_text("{}")
    engine = rig.new_engine()
    assert engine.recover().finished == ("uid-half",)
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
    assert sorted(rig.engine.cleanup_stale()) == sorted([gone.uid, recreated.uid])
    assert set(rig.engine.prepared_claims().claims) == {kept.uid}
    assert not rig.spec_path(gone.uid).exists()


def test_claims_on_different_gpus_prepare_concurrently(rig: EngineRig, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two claims on different GPUs must be inside the actuator at the same time (no global lock)."""
    inside = threading.Barrier(2, timeout=10)
    real_prepare = rig.engine._actuator.prepare

    def prepare(*args: Any) -> Any:
        inside.wait()  # both claims must arrive here together, or BrokenBarrierError fails the claim
        return real_prepare(*args)

    monkeypatch.setattr(rig.engine._actuator, "prepare", prepare)
    a, b = rig.claims.add("a", ["gpu-4"]), rig.claims.add("b", ["gpu-5"])
    results = rig.engine.prepare([a, b])
    assert results[a.uid].error == "" and results[b.uid].error == ""


def test_subrequest_results_are_reported_under_their_request(rig: EngineRig) -> None:
    ref = rig.claims.add("first-available", ["gpu-7"])
    rig.claims.objects[("default", "first-available")]["status"]["allocation"]["devices"]["results"][0]["request"] = "gpu/h100"
    result = rig.engine.prepare([ref])[ref.uid]
    assert result.error == "" and result.devices[0].request_names == ("gpu",)
