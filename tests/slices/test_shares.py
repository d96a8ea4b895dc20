"""GPUs offered in shares (`--sharing-mode shares`, KEP-5075): the catalog, the published shared devices, their
counters, and that every layout stays valid against the real resource.k8s.io/v1 schema and limits."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import DeviceKind, MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.model import NodeInventory
from dra_driver.inventory.sharing import EXCLUSIVE, SharingSettings, SharingSettingsError, sharing_settings
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_sandbox.apiserver.validation import ValidationOptions, format_errors, validate_resource_slice
from tests import kubeschema

SHARES = sharing_settings("shares")
PRESETS = ["dgx-h100", "dgx-a100", "hgx-h200", "a30x4", "l4x2"]


def inventory(preset: str) -> NodeInventory:
    backend = open_backend(f"fake:{preset}")
    backend.init()
    try:
        return discover(backend)
    finally:
        backend.shutdown()


def slices_of(
    preset: str, policy: MigOffering, sharing: SharingSettings = SHARES, version: tuple[int, int] = (1, 35)
) -> list[dict[str, Any]]:
    inv = inventory(preset)
    settings = SliceSettings(DRIVER_NAME, "node-a", kube_version=version, sharing=sharing)
    return build_slices(inv.system, catalog(inv, policy, sharing), settings, generation=3)


def devices_of(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def counter_sets_of(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c["counters"] for s in slices for c in s["spec"].get("sharedCounters", [])}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("policy", list(MigOffering))
@pytest.mark.parametrize("version", [(1, 34), (1, 35)])
def test_every_preset_and_layout_with_shares_is_valid(preset: str, policy: MigOffering, version: tuple[int, int]) -> None:
    slices = slices_of(preset, policy, version=version)
    for obj in slices:
        kubeschema.validate(obj, f"{version[0]}.{version[1]}.0")
        errors = validate_resource_slice(obj, ValidationOptions(kube_version=version))
        assert not errors, format_errors(errors)
    devices = devices_of(slices)
    sets = counter_sets_of(slices)
    for name, dev in devices.items():
        if not name.endswith("-shared"):
            continue
        whole = devices[name.removesuffix("-shared")]
        # The share consumes exactly what the whole GPU consumes, from a set the pool publishes.
        assert dev["consumesCounters"] == whole["consumesCounters"]
        [consumption] = dev["consumesCounters"]
        assert consumption["counters"] == sets[consumption["counterSet"]]


def test_shared_device_is_the_whole_gpu_with_consumable_capacity() -> None:
    devices = devices_of(slices_of("dgx-h100", MigOffering.STATIC))
    whole, shared = devices["gpu-0"], devices["gpu-0-shared"]
    assert shared["attributes"] == {**whole["attributes"], "type": {"string": "gpu-share"}}
    assert shared["allowMultipleAllocations"] is True
    assert "allowMultipleAllocations" not in whole
    # 85520809984 bytes = 81559.5 MiB, published rounded down to a whole MiB.
    assert shared["capacity"] == {
        "memory": {"value": "81559Mi", "requestPolicy": {"default": "4Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}},
        "compute": {
            "value": "100",
            "requestPolicy": {"default": "10", "validRange": {"min": "1", "max": "100", "step": "1"}},
        },
    }
    assert list(devices)[:3] == ["gpu-0", "gpu-0-shared", "gpu-1"]


def test_custom_share_sizes_are_published() -> None:
    sharing = sharing_settings("shares", memory_step="512Mi", memory_default="2Gi", compute_default="25")
    shared = devices_of(slices_of("l4x2", MigOffering.NONE, sharing))["gpu-0-shared"]
    assert shared["capacity"]["memory"]["requestPolicy"] == {
        "default": "2Gi",
        "validRange": {"min": "512Mi", "step": "512Mi"},
    }
    assert shared["capacity"]["compute"]["requestPolicy"]["default"] == "25"


def test_a_gpu_without_mig_gets_a_one_counter_set_when_shared() -> None:
    slices = slices_of("l4x2", MigOffering.NONE)
    assert counter_sets_of(slices) == {
        "gpu-0-counter-set": {"gpu": {"value": "1"}},
        "gpu-1-counter-set": {"gpu": {"value": "1"}},
    }
    devices = devices_of(slices)
    for name in ("gpu-0", "gpu-0-shared"):
        assert devices[name]["consumesCounters"] == [{"counterSet": "gpu-0-counter-set", "counters": {"gpu": {"value": "1"}}}]
    # Exclusive mode: no set, nothing consumes counters (unchanged output).
    plain = slices_of("l4x2", MigOffering.NONE, EXCLUSIVE)
    assert counter_sets_of(plain) == {}
    assert all("consumesCounters" not in d for d in devices_of(plain).values())


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("policy", list(MigOffering))
def test_exclusive_mode_changes_nothing(preset: str, policy: MigOffering) -> None:
    inv = inventory(preset)
    assert catalog(inv, policy, EXCLUSIVE) == catalog(inv, policy)
    assert not any(d.kind is DeviceKind.GPU_SHARED for d in catalog(inv, policy).values())


@pytest.mark.parametrize(
    ("preset", "policy", "shared"),
    [
        ("dgx-h100", MigOffering.STATIC, 8),  # MIG off: every GPU whole, so every GPU shared
        ("dgx-h100", MigOffering.DYNAMIC, 8),  # Hopper: the whole GPU competes with its placements
        ("dgx-a100", MigOffering.DYNAMIC, 0),  # Ampere with MIG on: partitions only, never whole
        ("dgx-a100", MigOffering.STATIC, 0),  # MIG on: static MIG devices only
        ("dgx-a100", MigOffering.NONE, 0),  # MIG on and not offered: nothing
        ("l4x2", MigOffering.NONE, 2),
    ],
)
def test_only_gpus_offered_whole_are_shared(preset: str, policy: MigOffering, shared: int) -> None:
    devices = catalog(inventory(preset), policy, SHARES)
    shares = [d for d in devices.values() if d.kind is DeviceKind.GPU_SHARED]
    assert len(shares) == shared
    for dev in shares:
        whole = devices[dev.name.removesuffix("-shared")]
        assert whole.kind is DeviceKind.GPU and whole.partitioned and dev.partitioned
        assert dev.kind.whole_gpu and dev.kind.type_attribute == "gpu-share"


def test_shared_gpus_selects_by_index_or_uuid() -> None:
    inv = inventory("dgx-h100")
    uuid_3 = inv.gpus[3].uuid
    devices = catalog(inv, MigOffering.STATIC, sharing_settings("shares", shared_gpus=f"1, {uuid_3}"))
    assert sorted(n for n, d in devices.items() if d.kind is DeviceKind.GPU_SHARED) == ["gpu-1-shared", "gpu-3-shared"]
    # The GPUs left exclusive keep their plain, counter-free whole device.
    assert not devices["gpu-0"].partitioned and devices["gpu-1"].partitioned
    assert sharing_settings("shares", shared_gpus="1,9,GPU-x").unknown_gpus(inv) == ["9", "GPU-x"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "half"}, "--sharing-mode 'half': choose one of exclusive | shares"),
        ({"memory_step": "lots"}, "--share-memory-step 'lots' is not a quantity"),
        ({"memory_step": "1.5Ki"}, "--share-memory-step '1.5Ki' must be a positive whole number of MiB"),
        ({"memory_step": "0"}, "--share-memory-step '0' must be a positive whole number of MiB"),
        ({"memory_default": "1536Mi"}, "--share-memory-default 1536Mi must be a multiple of --share-memory-step 1Gi"),
        ({"memory_default": "512Mi"}, "e.g. --share-memory-default 1Gi"),
        ({"compute_default": "0"}, "--share-compute-default 0 must be a whole percent from 1 to 100"),
        ({"compute_default": "ten"}, "--share-compute-default 'ten' must be a whole percent from 1 to 100"),
        ({"shared_gpus": "0,0"}, "--shared-gpus '0,0' names a GPU twice"),
    ],
)
def test_bad_sharing_settings_name_the_flag_and_the_fix(kwargs: dict[str, str], message: str) -> None:
    mode = kwargs.pop("mode", "shares")
    with pytest.raises(SharingSettingsError) as err:
        sharing_settings(mode, **kwargs)
    assert message in str(err.value)


def test_sharing_defaults() -> None:
    policy = sharing_settings("exclusive")
    assert policy == EXCLUSIVE and not policy.enabled
    assert SharingSettings(SHARES.mode, (), 1 << 30, 4 << 30, 10) == SHARES
