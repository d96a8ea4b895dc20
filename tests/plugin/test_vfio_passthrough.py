"""The VFIO passthrough effect, step by step, on the fake node's PCI state: the refusals before anything moves,
every function of the IOMMU group moved and recorded, the CDI edits, persistence mode, unprepare restoring each
driver, and a crash at every step recovered without a function bound to no driver."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.nvml.types import NvmlReturn
from dra_driver.plugin.checkpoint import ClaimState, VfioFunction
from dra_driver.plugin.faults import PREPARE_POINTS, UNPREPARE_POINTS, VFIO_POINTS
from tests.plugin.conftest import DRIVER
from tests.plugin.vfiorig import Crashed, SnapshotFaults, VfioRig, vfio_config

H100 = "gpu-0-vfio"  # 0000:18:00.0, group 20, a 3D controller alone in its group
VGA = "gpu-3-vfio"  # 0000:3f:00.0, group 23: VGA with audio .1 and a USB controller .2 in its group
NATIVE = {
    "0000:18:00.0": "nvidia",
    "0000:25:00.0": "nvidia",
    "0000:32:00.0": "nvidia",
    "0000:32:00.1": "snd_hda_intel",
    "0000:3f:00.0": "nvidia",
    "0000:3f:00.1": "snd_hda_intel",
    "0000:3f:00.2": "xhci_hcd",
}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[VfioRig]:
    r = VfioRig(tmp_path)
    yield r
    r.engine.close()


def _spec(rig: VfioRig, uid: str) -> dict[str, object]:
    loaded: dict[str, object] = json.loads(rig.spec_path(uid).read_bytes())
    return loaded


def test_prepare_binds_the_whole_group_and_unprepare_restores_every_driver(rig: VfioRig) -> None:
    gpu = rig.gpu(VGA)
    rig.nvml.set_persistence_mode(gpu.uuid, True)
    ref = rig.claims.add("vm", [VGA], config=vfio_config(api_device=True))
    result = rig.engine.prepare([ref])[ref.uid]
    assert result.error == ""
    drivers = rig.drivers()
    assert {a: drivers[a] for a in ("0000:3f:00.0", "0000:3f:00.1", "0000:3f:00.2")} == dict.fromkeys(
        ("0000:3f:00.0", "0000:3f:00.1", "0000:3f:00.2"), "vfio-pci"
    )
    assert drivers["0000:18:00.0"] == "nvidia"
    assert "vfio_pci" in rig.pci.state().modules  # modprobe'd on first use
    assert gpu.uuid not in {g.uuid for g in rig.nvml.gpus()}  # gone from NVML, as a real GPU on vfio-pci is
    record = rig.checkpoint.load().claims[ref.uid]
    assert record.state is ClaimState.PREPARE_COMPLETED
    vfio = record.devices[0].vfio
    assert vfio is not None and vfio.group == 23 and vfio.persistence_mode is True
    assert vfio.functions == (
        VfioFunction("0000:3f:00.0", "nvidia"),
        VfioFunction("0000:3f:00.1", "snd_hda_intel"),
        VfioFunction("0000:3f:00.2", "xhci_hcd"),
    )
    raw = rig.spec_path(ref.uid).read_bytes()
    spec = json.loads(raw)
    device = spec["devices"][0]
    assert device["containerEdits"]["deviceNodes"] == [{"path": "/dev/vfio/23", "hostPath": "/dev/null"}]
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert spec["containerEdits"]["deviceNodes"] == [{"path": "/dev/vfio/vfio", "hostPath": "/dev/null"}]
    assert rig.rediscoveries == 1

    assert rig.engine.prepare([ref])[ref.uid].error == ""  # repeated: verified, nothing moves
    assert rig.spec_path(ref.uid).read_bytes() == raw

    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    assert rig.drivers() == NATIVE
    assert all(f.driver_override is None for f in rig.pci.state().functions)
    assert rig.nvml.persistence_mode(gpu.uuid) is True  # restored (unbinding nvidia had dropped it)
    assert gpu.uuid in {g.uuid for g in rig.nvml.gpus()}
    assert rig.rediscoveries == 2
    assert not rig.spec_path(ref.uid).exists() and rig.checkpoint.load().claims == {}


def test_prefer_iommufd_hands_out_the_device_cdev_and_dev_iommu(rig: VfioRig) -> None:
    ref = rig.claims.add("vm", [H100], config=vfio_config("PreferIommuFD", api_device=True))
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    spec = _spec(rig, ref.uid)
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/vfio/devices/vfio0", "hostPath": "/dev/null"}]  # type: ignore[index]
    assert spec["containerEdits"]["deviceNodes"] == [{"path": "/dev/iommu", "hostPath": "/dev/null"}]  # type: ignore[index]


def test_without_dev_iommu_prefer_iommufd_falls_back_to_the_group(tmp_path: Path) -> None:
    rig = VfioRig(tmp_path, "gpus: [{model: H100-SXM5-80GB}]\npci: {iommufd: false}\n")
    ref = rig.claims.add("vm", ["gpu-0-vfio"], config=vfio_config("PreferIommuFD", api_device=True))
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    spec = _spec(rig, ref.uid)
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/vfio/20", "hostPath": "/dev/null"}]  # type: ignore[index]
    assert spec["containerEdits"]["deviceNodes"] == [{"path": "/dev/vfio/vfio", "hostPath": "/dev/null"}]  # type: ignore[index]
    rig.engine.close()


def _refused(rig: VfioRig, name: str, devices: list[str], text: str) -> None:
    ref = rig.claims.add(name, devices, config=vfio_config())
    error = rig.engine.prepare([ref])[ref.uid].error
    assert text in error, error
    assert rig.drivers() == NATIVE  # nothing moved
    assert ref.uid not in rig.checkpoint.load().claims
    assert not rig.spec_path(ref.uid).exists()


def test_iommu_off_is_refused_with_the_fix(rig: VfioRig) -> None:
    rig.pci.set_iommu(False)
    _refused(rig, "vm", [H100], "intel_iommu=on")


def test_a_gpu_with_processes_is_refused_naming_them(rig: VfioRig) -> None:
    rig.nvml.set_busy(rig.gpu(H100).uuid, [4242])
    _refused(rig, "vm", [H100], "in use by processes 4242")


def test_a_gpu_with_mig_instances_is_refused(tmp_path: Path) -> None:
    node = "gpus: [{model: H100-SXM5-80GB, mig: enabled, instances: [{profile: 1g.10gb}]}]\n"
    rig = VfioRig(tmp_path, node)
    # The catalog does not offer a GPU with MIG on for passthrough; a stale allocation still meets the binder.
    gpu = next(iter(rig.devices.values())).gpu
    rig.devices = {**rig.devices, "gpu-0-vfio": AllocatableDevice("gpu-0-vfio", DeviceKind.VFIO, gpu)}
    ref = rig.claims.add("vm", ["gpu-0-vfio"], config=vfio_config())
    assert "holds MIG instances" in rig.engine.prepare([ref])[ref.uid].error
    assert rig.pci.state().function("0000:18:00.0").driver == "nvidia"
    rig.engine.close()


def test_a_gpu_prepared_for_containers_is_refused_and_the_other_way_round(rig: VfioRig) -> None:
    container = rig.claims.add("pod", ["gpu-0"])
    assert rig.engine.prepare([container])[container.uid].error == ""
    # The engine's overlap check (one counter set: the devices collide) or the effect's own (same GPU) refuses.
    _refused(rig, "vm", [H100], "prepared for claim default/pod")
    vm = rig.claims.add("vm2", ["gpu-1-vfio"], config=vfio_config())
    assert rig.engine.prepare([vm])[vm.uid].error == ""
    late = rig.claims.add("late", ["gpu-1"])
    assert "claim default/vm2" in rig.engine.prepare([late])[late.uid].error


def test_the_effect_refuses_a_gpu_another_claim_holds_even_where_the_devices_do_not_collide(rig: VfioRig) -> None:
    from dataclasses import replace

    from dra_driver.plugin.effects.vfio_passthrough import VfioPassthrough

    # Without counters (a catalog that does not mark the devices partitioned) only the effect sees the GPU clash.
    rig.devices = {name: replace(d, partitioned=False) for name, d in rig.devices.items()}
    container = rig.claims.add("pod", ["gpu-0"])
    assert rig.engine.prepare([container])[container.uid].error == ""
    _refused(rig, "vm", [H100], "GPU of device gpu-0-vfio is in use for containers by claim default/pod")
    assert any(isinstance(e, VfioPassthrough) for e in rig.engine.parts.effects.devices)


def test_a_claim_mixing_passthrough_and_container_devices_is_refused(rig: VfioRig) -> None:
    _refused(rig, "mixed", [H100, "gpu-1"], "request them in separate claims")


def test_two_vfio_configs_in_one_claim_are_refused(rig: VfioRig) -> None:
    ref = rig.claims.add("vm", [H100], config=vfio_config() + vfio_config("PreferIommuFD"))
    error = rig.engine.prepare([ref])[ref.uid].error
    assert "status.allocation.devices.config[1]: a claim takes at most one VfioDeviceConfig" in error


def test_a_failed_bind_rolls_the_group_back_to_its_drivers(rig: VfioRig) -> None:
    rig.nvml.set_persistence_mode(rig.gpu(VGA).uuid, True)
    rig.pci.inject_bind_fault("0000:3f:00.0", "vfio-pci")  # the GPU, moved last: audio and USB moved already
    ref = rig.claims.add("vm", [VGA], config=vfio_config())
    error = rig.engine.prepare([ref])[ref.uid].error
    assert "binding 0000:3f:00.0 to vfio-pci failed" in error and "errno 5" in error
    assert rig.drivers() == NATIVE
    assert rig.nvml.persistence_mode(rig.gpu(VGA).uuid) is True
    assert rig.checkpoint.load().claims == {}
    assert rig.rediscoveries == 2  # the failed bind (functions had moved), then the rollback's rebind


def test_a_failed_rebind_keeps_the_function_on_vfio_and_the_record(rig: VfioRig) -> None:
    ref = rig.claims.add("vm", [H100], config=vfio_config())
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    rig.pci.inject_bind_fault("0000:18:00.0", "nvidia")
    error = rig.engine.unprepare([ref])[ref.uid]
    assert "rebinding the passed-through GPU's functions failed" in error
    assert rig.drivers()["0000:18:00.0"] == "vfio-pci"  # never bound to no driver
    assert rig.checkpoint.load().claims[ref.uid].state is ClaimState.UNPREPARE_STARTED
    rig.pci.clear_bind_faults()
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    assert rig.drivers() == NATIVE


def test_verify_finds_a_gpu_rebound_under_the_claim_and_repair_moves_it_back(rig: VfioRig) -> None:
    ref = rig.claims.add("vm", [H100], config=vfio_config())
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    rig.pci.unbind("0000:18:00.0", "vfio-pci")  # someone rebinds it to nvidia behind the plugin's back
    rig.pci.set_driver_override("0000:18:00.0", None)
    rig.pci.bind("0000:18:00.0", "nvidia")
    record = rig.checkpoint.load().claims[ref.uid]
    problems = rig.engine.damage(record, rig.checkpoint.load(), rig.devices)
    assert problems == ["PCI function 0000:18:00.0 of the passed-through GPU is bound to nvidia, not vfio-pci"]
    assert rig.rediscoveries == 1
    assert rig.engine.prepare([ref])[ref.uid].error == ""  # the repeated prepare repairs it
    assert rig.drivers()["0000:18:00.0"] == "vfio-pci"
    assert rig.rediscoveries == 2  # the GPU left NVML again: its offer is republished


def test_a_vfio_pci_variant_from_modules_alias_is_loaded_and_bound(tmp_path: Path) -> None:
    node = (
        "gpus: [{model: H100-SXM5-80GB}]\n"
        "pci:\n  modules_alias:\n"
        '    - "alias vfio_pci:v000010DEd00002330sv*sd*bc*sc*i* nvgrace_gpu_vfio_pci"\n'
        '    - "alias vfio_pci:v000010DEd*sv*sd*bc*sc*i* wide_vfio_pci"\n'
    )
    rig = VfioRig(tmp_path, node)
    ref = rig.claims.add("vm", ["gpu-0-vfio"], config=vfio_config())
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    assert rig.drivers()["0000:18:00.0"] == "nvgrace-gpu-vfio-pci"
    assert rig.pci.state().modules == ("nvgrace_gpu_vfio_pci",)
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    assert rig.drivers()["0000:18:00.0"] == "nvidia"
    rig.engine.close()


def test_nvml_reports_not_supported_persistence_as_unknown(rig: VfioRig) -> None:
    rig.nvml.inject_fault("persistence_mode", NvmlReturn.NOT_SUPPORTED)
    ref = rig.claims.add("vm", [H100], config=vfio_config())
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    vfio = rig.checkpoint.load().claims[ref.uid].devices[0].vfio
    assert vfio is not None and vfio.persistence_mode is None


# --- crashes -------------------------------------------------------------------------------------

# (point, n-th time): the per-function points at the first and at the last function of the VGA group.
PREPARE_CRASHES = [
    *((p, 1) for p in PREPARE_POINTS),
    ("vfio:after-record", 1),
    ("vfio:after-persistence-off", 1),
    *((p, n) for p in ("vfio:after-override", "vfio:after-unbind", "vfio:after-bind") for n in (1, 3)),
]
UNPREPARE_CRASHES = [
    *((p, 1) for p in UNPREPARE_POINTS),
    *((p, n) for p in ("vfio:after-restore-override", "vfio:after-restore-unbind", "vfio:after-restore-bind")
      for n in (1, 3)),
    ("vfio:after-persistence-restore", 1),
]


def test_every_vfio_point_is_exercised() -> None:
    assert {p for p, _ in PREPARE_CRASHES + UNPREPARE_CRASHES} >= set(VFIO_POINTS)


def _no_function_without_driver(rig: VfioRig) -> None:
    unbound = [a for a, d in rig.drivers().items() if d is None]
    assert unbound == [], f"functions bound to no driver: {unbound}"


@pytest.mark.parametrize(("point", "nth"), PREPARE_CRASHES, ids=[f"{p}#{n}" for p, n in PREPARE_CRASHES])
def test_a_crash_in_prepare_is_recovered(rig: VfioRig, point: str, nth: int) -> None:
    uuid = rig.gpu(VGA).uuid
    rig.nvml.set_persistence_mode(uuid, True)
    ref = rig.claims.add("vm", [VGA], config=vfio_config())
    faults = SnapshotFaults(rig, point, nth)
    rig.engine.close()
    engine = rig.restart(faults)
    with pytest.raises(Crashed):
        engine.prepare([ref])
    engine.close()
    faults.restore()  # the node as the SIGKILL left it
    engine = rig.restart()
    engine.recovery.recover()  # startup: a PrepareStarted record is rolled back, a completed one verified
    _no_function_without_driver(rig)
    record = rig.checkpoint.load().claims.get(ref.uid)
    if record is None:
        assert rig.drivers() == NATIVE and rig.nvml.persistence_mode(uuid) is True
    assert engine.prepare([ref])[ref.uid].error == ""  # the kubelet's retry
    assert {a: d for a, d in rig.drivers().items() if a.startswith("0000:3f")} == dict.fromkeys(
        ("0000:3f:00.0", "0000:3f:00.1", "0000:3f:00.2"), "vfio-pci"
    )
    vfio = rig.checkpoint.load().claims[ref.uid].devices[0].vfio
    assert vfio is not None and vfio.persistence_mode is True  # the original, never the "off" a crash left
    assert engine.unprepare([ref]) == {ref.uid: ""}
    assert rig.drivers() == NATIVE and rig.nvml.persistence_mode(uuid) is True


@pytest.mark.parametrize(("point", "nth"), UNPREPARE_CRASHES, ids=[f"{p}#{n}" for p, n in UNPREPARE_CRASHES])
def test_a_crash_in_unprepare_is_finished(rig: VfioRig, point: str, nth: int) -> None:
    uuid = rig.gpu(VGA).uuid
    rig.nvml.set_persistence_mode(uuid, True)
    ref = rig.claims.add("vm", [VGA], config=vfio_config())
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    faults = SnapshotFaults(rig, point, nth)
    rig.engine.close()
    engine = rig.restart(faults)
    with pytest.raises(Crashed):
        engine.unprepare([ref])
    engine.close()
    faults.restore()
    engine = rig.restart()
    engine.recovery.recover()  # an UnprepareStarted record is released to the end, never repaired back
    _no_function_without_driver(rig)
    assert engine.unprepare([ref]) == {ref.uid: ""}  # the kubelet's retry
    assert rig.drivers() == NATIVE and rig.nvml.persistence_mode(uuid) is True
    assert rig.checkpoint.load().claims == {} and not rig.spec_path(ref.uid).exists()
    assert DRIVER  # the spec was this driver's


# --- driver reload -------------------------------------------------------------------------------


def _rediscovered_after_restart(rig: VfioRig) -> None:
    """The catalog a plugin restarted while a GPU is on vfio-pci builds: NVML does not list that GPU."""
    from dra_driver.inventory.catalog import MigOffering, catalog
    from dra_driver.inventory.discover import discover
    from dra_driver.inventory.passthrough import passthrough_settings
    from dra_driver.inventory.sharing import EXCLUSIVE

    rig.engine.close()
    rig.restart()
    rig.devices = catalog(discover(rig.nvml), MigOffering.STATIC, EXCLUSIVE, passthrough_settings("all"))


def test_a_reload_after_a_restart_keeps_a_vm_claim_whose_gpu_is_still_on_vfio(rig: VfioRig) -> None:
    """Issue 36 #4: the GPU is missing from a restarted plugin's catalog, yet it never left vfio-pci: the reload
    re-verifies the claim by its binding and keeps it."""
    from dra_driver.observability.metrics import PluginMetrics
    from dra_driver.plugin.driverreload import reverify_claims
    from tests.plugin.conftest import NODE

    ref = rig.claims.add("vm", [H100], config=vfio_config())
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    _rediscovered_after_restart(rig)
    assert H100 not in rig.devices  # the restarted plugin has never read the GPU from NVML
    rig.nvml.unload_driver()
    rig.nvml.load_driver("580.999.1")
    rig.nvml.init()
    report = reverify_claims(rig.engine, node_name=NODE, events=None, metrics=PluginMetrics(process_collectors=False))
    assert report.lost == () and report.verified == (ref.uid,)
    record = rig.checkpoint.load().claims[ref.uid]
    assert record.lost is None and record.state is ClaimState.PREPARE_COMPLETED
    assert rig.engine.prepare([ref])[ref.uid].error == ""  # the kubelet's next prepare: still the VM's
    assert rig.drivers()["0000:18:00.0"] == "vfio-pci"
    assert rig.engine.unprepare([ref]) == {ref.uid: ""}
    assert rig.drivers() == NATIVE


def test_a_reload_marks_a_vm_claim_lost_only_where_its_binding_is_gone(rig: VfioRig) -> None:
    from dra_driver.observability.metrics import PluginMetrics
    from dra_driver.plugin.driverreload import reverify_claims
    from tests.plugin.conftest import NODE

    ref = rig.claims.add("vm", [H100], config=vfio_config())
    assert rig.engine.prepare([ref])[ref.uid].error == ""
    _rediscovered_after_restart(rig)
    rig.pci.unbind("0000:18:00.0", "vfio-pci")  # the function left vfio-pci (and the catalog does not offer it)
    report = reverify_claims(rig.engine, node_name=NODE, events=None, metrics=PluginMetrics(process_collectors=False))
    assert report.lost == (ref.uid,)
    record = rig.checkpoint.load().claims[ref.uid]
    assert record.lost is not None and "gpu-0-vfio" in record.lost


# --- a shared IOMMU group (issue 36 #1, #2) --------------------------------------------------------

# GPUs 0 and 1 share IOMMU group 30 (a PCIe switch without ACS); GPU 2 shares group 22 with a host NIC.
SHARED_NODE = """
name: shared-node
gpus:
  - model: H100-SXM5-80GB
    count: 3
pci:
  groups: {"0000:18:00.0": 30, "0000:25:00.0": 30}
  functions:
    - {address: "0000:19:00.0", group_of: "0000:32:00.0", class_code: 0x020000, vendor: 0x15b3, device: 0x101d,
       driver: mlx5_core}
"""
SHARED_NATIVE = {
    "0000:18:00.0": "nvidia",
    "0000:19:00.0": "mlx5_core",
    "0000:25:00.0": "nvidia",
    "0000:32:00.0": "nvidia",
}


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[VfioRig]:
    r = VfioRig(tmp_path, SHARED_NODE)
    yield r
    r.engine.close()


def _refused_shared(rig: VfioRig, name: str, devices: list[str], *texts: str) -> str:
    ref = rig.claims.add(name, devices, config=vfio_config() if devices[0].endswith("-vfio") else None)
    error = rig.engine.prepare([ref])[ref.uid].error
    assert all(t in error for t in texts), error
    assert ref.uid not in rig.checkpoint.load().claims
    assert not rig.spec_path(ref.uid).exists()
    return error


def test_passthrough_never_takes_a_gpu_of_its_group_that_a_container_claim_holds(shared: VfioRig) -> None:
    pod = shared.claims.add("pod", ["gpu-1"])
    assert shared.engine.prepare([pod])[pod.uid].error == ""
    _refused_shared(
        shared, "vm", ["gpu-0-vfio"],
        "takes its whole IOMMU group 30", "GPU 0000:25:00.0", f"claim default/pod (uid {pod.uid}, device gpu-1)",
    )
    assert shared.drivers() == SHARED_NATIVE  # nothing moved: gpu-1 still serves the pod
    assert shared.engine.prepare([pod])[pod.uid].error == ""


def test_a_container_claim_on_a_gpu_of_a_passed_through_group_is_refused(shared: VfioRig) -> None:
    vm = shared.claims.add("vm", ["gpu-0-vfio"], config=vfio_config())
    assert shared.engine.prepare([vm])[vm.uid].error == ""
    assert shared.drivers()["0000:25:00.0"] == "vfio-pci"  # the group moves whole
    _refused_shared(shared, "pod", ["gpu-1"], "IOMMU group 30", f"claim default/vm (uid {vm.uid}, device gpu-0-vfio)")
    _refused_shared(shared, "vm2", ["gpu-1-vfio"], "IOMMU group 30", "claim default/vm")
    assert shared.engine.unprepare([vm]) == {vm.uid: ""}
    assert shared.drivers() == SHARED_NATIVE


def test_a_free_gpu_of_the_group_moves_with_it_and_gets_its_persistence_back(shared: VfioRig) -> None:
    other = shared.gpu("gpu-1").uuid
    shared.nvml.set_persistence_mode(other, True)
    vm = shared.claims.add("vm", ["gpu-0-vfio"], config=vfio_config())
    assert shared.engine.prepare([vm])[vm.uid].error == ""
    vfio = shared.checkpoint.load().claims[vm.uid].devices[0].vfio
    assert vfio is not None
    assert vfio.functions == (VfioFunction("0000:18:00.0", "nvidia"), VfioFunction("0000:25:00.0", "nvidia", True))
    assert shared.engine.unprepare([vm]) == {vm.uid: ""}
    assert shared.drivers() == SHARED_NATIVE
    assert shared.nvml.persistence_mode(other) is True


def test_a_busy_gpu_of_the_group_is_refused_naming_it(shared: VfioRig) -> None:
    shared.nvml.set_busy(shared.gpu("gpu-1").uuid, [4242])
    _refused_shared(shared, "vm", ["gpu-0-vfio"], "GPU 0000:25:00.0 (in the IOMMU group of gpu-0-vfio", "4242")
    assert shared.drivers() == SHARED_NATIVE


def test_a_host_nic_in_the_group_is_never_rebound_without_the_admins_say(shared: VfioRig) -> None:
    error = _refused_shared(
        shared, "vm", ["gpu-2-vfio"],
        "PCI function 0000:19:00.0 (class 0x020000, driver mlx5_core)", "--passthrough-allow-rebind 0x0200",
        "--passthrough-allow-rebind mlx5_core", "passthrough.allowRebind",
    )
    assert "IOMMU group 22" in error
    assert shared.drivers() == SHARED_NATIVE
    assert shared.pci.state().modules == ()  # refused before vfio-pci was even loaded


@pytest.mark.parametrize("allowed", ["mlx5_core", "0x02", "0x0200", "0x020000"])
def test_an_allowed_host_function_moves_and_comes_back(tmp_path: Path, allowed: str) -> None:
    from dra_driver.pci.model import rebind_allowance

    rig = VfioRig(tmp_path, SHARED_NODE, allow_rebind=rebind_allowance(allowed))
    vm = rig.claims.add("vm", ["gpu-2-vfio"], config=vfio_config())
    assert rig.engine.prepare([vm])[vm.uid].error == ""
    assert rig.drivers()["0000:19:00.0"] == "vfio-pci"
    assert rig.engine.unprepare([vm]) == {vm.uid: ""}
    assert rig.drivers() == SHARED_NATIVE
    rig.engine.close()


def test_concurrent_container_and_vm_claims_on_one_group_never_both_prepare(shared: VfioRig) -> None:
    import threading

    for round_ in range(4):
        pod = shared.claims.add(f"pod-{round_}", ["gpu-1"])
        vm = shared.claims.add(f"vm-{round_}", ["gpu-0-vfio"], config=vfio_config())
        errors: dict[str, str] = {}
        start = threading.Barrier(2)

        def prepare(ref: ClaimRef, errors: dict[str, str] = errors, start: threading.Barrier = start) -> None:
            start.wait()
            errors[ref.uid] = shared.engine.prepare([ref])[ref.uid].error

        threads = [threading.Thread(target=prepare, args=(r,)) for r in (pod, vm)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [errors[pod.uid], errors[vm.uid]].count("") == 1, errors
        gpu1 = shared.drivers()["0000:25:00.0"]
        assert gpu1 == ("vfio-pci" if errors[vm.uid] == "" else "nvidia")
        assert shared.engine.unprepare([pod, vm]) == {pod.uid: "", vm.uid: ""}
        assert shared.drivers() == SHARED_NATIVE
