"""Shared IOMMU groups (slices/iommu.py, docs/passthrough.md): where GPUs share a group with a passthrough GPU, the
group's counter set makes the scheduler unable to give one GPU of the group to a VM while another is in use (issue
36 #1), on every supported API version's layout, within its limits."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.allocation import allocate
from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.passthrough import PassthroughScope, PassthroughSettings
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_sandbox.apiserver.validation import ValidationOptions, format_errors, validate_resource_slice
from tests import kubeschema
from tests.narrow import present

DRIVER = DRIVER_NAME
NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "labels": {}}}
CEL = DraCelEnvironment()
VERSIONS = [(1, 34), (1, 35), (1, 36), (1, 37)]


def _slices(
    policy: MigOffering, version: tuple[int, int] = (1, 35), scope: str = "all", gpus: int = 8, preset: str = "dgx-h100"
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The preset's GPUs 0 and 1 in IOMMU group 30, every other GPU alone in its own."""
    backend = open_backend(f"fake:{preset}")
    backend.init()
    inv = discover(backend)
    groups = {g.info.pci_bus_id: 30 for g in inv.gpus[:2]}
    groups.update({g.info.pci_bus_id: 40 + g.info.index for g in inv.gpus[2:]})
    passthrough = (
        PassthroughSettings(PassthroughScope.ALL, iommu_groups=groups)
        if scope == "all"
        else PassthroughSettings(PassthroughScope.LISTED, (scope,), iommu_groups=groups)
    )
    keep = {g.uuid for g in inv.gpus[:gpus]}
    devices = {k: v for k, v in catalog(inv, policy, passthrough=passthrough).items() if v.gpu.uuid in keep}
    settings = SliceSettings(DRIVER, "node-a", kube_version=version, passthrough=passthrough)
    return build_slices(inv.system, devices, settings, generation=1), devices


def _devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def _sets(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for s in slices for c in s["spec"].get("sharedCounters", [])}


def test_the_group_set_counts_the_container_devices_and_a_vfio_device_takes_it_all() -> None:
    slices, _ = _slices(MigOffering.NONE)
    group = _sets(slices)["iommu-group-30-counter-set"]
    assert group["counters"] == {"devices": {"value": "2"}}  # gpu-0 and gpu-1
    by_name = _devices(slices)
    draws = {n: {c["counterSet"]: c["counters"] for c in d.get("consumesCounters", [])} for n, d in by_name.items()}
    assert draws["gpu-0-vfio"]["iommu-group-30-counter-set"] == {"devices": {"value": "2"}}
    assert draws["gpu-1-vfio"]["iommu-group-30-counter-set"] == {"devices": {"value": "2"}}
    assert draws["gpu-1"]["iommu-group-30-counter-set"] == {"devices": {"value": "1"}}
    assert "iommu-group-30-counter-set" not in draws["gpu-2"]  # alone in its group
    assert not any(n.startswith("iommu-group-4") for n in _sets(slices))


def test_a_gpu_that_is_not_offered_for_passthrough_still_draws_from_its_groups_set() -> None:
    slices, _ = _slices(MigOffering.NONE, scope="0")  # only GPU 0 passes through; GPU 1 is for containers only
    by_name = _devices(slices)
    assert "gpu-1-vfio" not in by_name
    assert [c["counterSet"] for c in by_name["gpu-1"]["consumesCounters"]] == ["iommu-group-30-counter-set"]
    slices, _ = _slices(MigOffering.NONE, scope="2")  # no passthrough GPU in group 30: nothing more
    assert "iommu-group-30-counter-set" not in _sets(slices)
    assert "consumesCounters" not in _devices(slices)["gpu-1"]


@pytest.mark.parametrize("preset", ["dgx-h100", "l4x2"])
@pytest.mark.parametrize("policy", [MigOffering.NONE, MigOffering.DYNAMIC])
@pytest.mark.parametrize("version", VERSIONS)
def test_slices_with_a_shared_group_are_valid_on_every_supported_version(
    preset: str, policy: MigOffering, version: tuple[int, int]
) -> None:
    slices, devices = _slices(policy, version, preset=preset)
    for obj in slices:
        kubeschema.validate(obj, f"{version[0]}.{version[1]}.0")
        errors = validate_resource_slice(obj, ValidationOptions(kube_version=version))
        assert not errors, format_errors(errors)
    names = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
    assert len(names) == len(set(names))
    if version >= (1, 35) or preset == "l4x2":
        assert "iommu-group-30-counter-set" in _sets(slices)
        assert {"gpu-0-vfio", "gpu-1-vfio"} <= set(names)
    if version < (1, 35) and preset == "l4x2":
        # 1.34: a device consumes only sets of its own slice: the group's GPUs, their sets and the group's set in one.
        together = next(s for s in slices if any(c["name"] == "iommu-group-30-counter-set"
                                                for c in s["spec"].get("sharedCounters", [])))
        assert {d["name"] for d in together["spec"]["devices"]} == {"gpu-0", "gpu-0-vfio", "gpu-1", "gpu-1-vfio"}
    if version < (1, 35) and preset == "dgx-h100":
        # Two H100 counter sets (MIG geometry: 17 counters each) pass 1.34's 32 counters per slice: the group's VFIO
        # devices are left out (the safe side), every other device is published as without the group.
        assert "gpu-0-vfio" not in names and "gpu-1-vfio" not in names and "gpu-2-vfio" in names
        assert "iommu-group-30-counter-set" not in _sets(slices)
        assert set(names) == set(devices) - {"gpu-0-vfio", "gpu-1-vfio"}


def _bus_ids(preset: str) -> list[str]:
    backend = open_backend(f"fake:{preset}")
    backend.init()
    return [g.info.pci_bus_id for g in discover(backend).gpus]


def _class(name: str, kind: str) -> dict[str, Any]:
    expr = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expr}}]}}


CLASSES = [_class("gpu", "gpu"), _class("vfio", "vfio"), _class("mig", "mig")]


def _claim(i: int, cls: str, device: str) -> dict[str, Any]:
    selector = {"cel": {"expression": f"device.attributes['resource.kubernetes.io'].pciBusID == '{device}'"}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"c{i}", "namespace": "default", "uid": f"uid-{i}"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": cls,
                                                                    "selectors": [selector]}}]}},
    }


def _grant(slices: list[dict[str, Any]], wanted: list[tuple[str, str]]) -> list[str | None]:
    """Each (class, PCI bus id) in turn, against the claims granted before."""
    granted: list[dict[str, Any]] = []
    out: list[str | None] = []
    for i, (cls, bus_id) in enumerate(wanted):
        claim = _claim(i, cls, bus_id)
        outcome = allocate(claim, node=NODE, classes=CLASSES, slices=slices, allocated_claims=granted, cel=CEL)
        if outcome.ok:
            granted.append({**claim, "status": {"allocation": outcome.allocation}})
            out.append(present(outcome.allocation)["devices"]["results"][0]["device"])
        else:
            out.append(None)
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_the_scheduler_cannot_pass_a_gpu_through_while_another_of_its_group_is_in_use(version: tuple[int, int]) -> None:
    # 1.34 lays a shared group out in one slice only where it fits: two L4s (no MIG geometry) do, H100s do not.
    preset = "dgx-h100" if version >= (1, 35) else "l4x2"
    slices, _ = _slices(MigOffering.NONE, version, gpus=3, preset=preset)
    gpu0, gpu1, *rest = _bus_ids(preset)
    alone = [("vfio", rest[0])] if rest else []
    # A container on GPU 1: no VM may take GPU 0 (same group) or GPU 1; GPU 2 (a group of its own) may.
    assert _grant(slices, [("gpu", gpu1), ("vfio", gpu0), ("vfio", gpu1), *alone]) == [
        "gpu-1", None, None, *(["gpu-2-vfio"] if rest else [])
    ]
    # A VM on GPU 0: neither GPU of the group for containers, nor for another VM.
    assert _grant(slices, [("vfio", gpu0), ("gpu", gpu1), ("gpu", gpu0), ("vfio", gpu1)]) == [
        "gpu-0-vfio", None, None, None
    ]
    # Containers on both GPUs of the group at once are fine.
    assert _grant(slices, [("gpu", gpu0), ("gpu", gpu1)]) == ["gpu-0", "gpu-1"]


def test_dynamic_mig_partitions_of_one_gpu_do_not_run_short_of_the_group_counter() -> None:
    slices, devices = _slices(MigOffering.DYNAMIC, (1, 35), gpus=2)
    gpu1 = "0000:43:00.0"
    mig = [n for n, d in devices.items() if d.gpu.info.index == 1 and d.profile is not None and d.profile.name == "1g.10gb"]
    granted = _grant(slices, [("mig", gpu1)] * 7 + [("vfio", "0000:1b:00.0")])
    assert all(granted[:7]) and set(granted[:7]) <= set(mig)  # seven 1g partitions of GPU 1 fit
    assert granted[7] is None  # and GPU 0 cannot go to a VM meanwhile



def test_the_explanation_names_the_group_partner_that_holds_it() -> None:
    from dra_driver.allocation import explain_text

    slices, _ = _slices(MigOffering.NONE, (1, 35), gpus=3)
    gpu0, gpu1 = "0000:1b:00.0", "0000:43:00.0"
    pod = _claim(0, "gpu", gpu1)
    outcome = allocate(pod, node=NODE, classes=CLASSES, slices=slices, cel=CEL)
    held = [{**pod, "status": {"allocation": outcome.allocation}}]
    vm = allocate(_claim(1, "vfio", gpu0), node=NODE, classes=CLASSES, slices=slices, allocated_claims=held, cel=CEL)
    assert vm.allocation is None
    text = explain_text(vm)
    assert "the GPU shares its IOMMU group with a GPU in use: a passthrough device takes the whole group" in text, text
    assert "held by gpu-1 (claim default/c0)" in text, text
    # The GPU itself in use keeps its own reason.
    own = allocate(_claim(2, "vfio", gpu1), node=NODE, classes=CLASSES, slices=slices, allocated_claims=held, cel=CEL)
    assert "the GPU is in use for containers" in explain_text(own)
