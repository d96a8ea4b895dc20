"""Passthrough offers (docs/passthrough.md): `gpu-<minor>-vfio` next to a GPU's container devices, one counter set
for both, NVIDIA's VFIO attributes, compatibility groups only when asked, and slices every supported API accepts."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import DeviceKind, MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.model import NodeInventory
from dra_driver.inventory.passthrough import (
    NO_PASSTHROUGH,
    PassthroughError,
    PassthroughScope,
    PassthroughSettings,
    addressable_memory,
    normal_pci_bus_id,
    passthrough_settings,
    pci_ids,
    vfio_uuid,
)
from dra_driver.inventory.sharing import EXCLUSIVE, SharingSettings, sharing_settings
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_driver.slices.counters import counter_set, counter_totals
from dra_sandbox.apiserver.validation import ValidationOptions, format_errors, validate_resource_slice
from dra_sandbox.apiserver.validation.schema import prune_unknown_fields
from tests import kubeschema

ALL = PassthroughSettings(PassthroughScope.ALL)
VERSIONS = [(1, 34), (1, 35), (1, 36), (1, 37)]


def _inventory(spec: str) -> NodeInventory:
    backend = open_backend(spec)
    backend.init()
    return discover(backend)


def _slices(
    spec: str,
    policy: MigOffering,
    passthrough: PassthroughSettings = ALL,
    version: tuple[int, int] = (1, 35),
    sharing: SharingSettings = EXCLUSIVE,
) -> list[dict[str, Any]]:
    inv = _inventory(spec)
    settings = SliceSettings(driver_name=DRIVER_NAME, node_name="node-a", kube_version=version, sharing=sharing,
                             passthrough=passthrough)
    return build_slices(inv.system, catalog(inv, policy, sharing, passthrough), settings, generation=3)


def _devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


# --- settings --------------------------------------------------------------------------------------------------


def test_passthrough_flag_values() -> None:
    assert passthrough_settings("none") == NO_PASSTHROUGH and not passthrough_settings("").enabled
    assert passthrough_settings("all").scope is PassthroughScope.ALL
    listed = passthrough_settings("0, GPU-abc ,53:00.0,0000:53:00.0")
    assert listed.scope is PassthroughScope.LISTED
    assert listed.gpus == ("0", "GPU-abc", "0000:53:00.0")  # normalised, duplicates dropped
    assert passthrough_settings("all", compatibility_groups=True).compatibility_groups


@pytest.mark.parametrize(
    ("text", "needle"),
    [("MIG-1234", "is a MIG device"), ("gpu0", "names no GPU"), ("0,xyz", "'xyz' names no GPU")],
)
def test_passthrough_flag_refuses_bad_values_naming_the_flag_and_the_fix(text: str, needle: str) -> None:
    with pytest.raises(PassthroughError) as err:
        passthrough_settings(text)
    assert needle in str(err.value) and "--passthrough" in str(err.value)
    assert "index" in str(err.value)


def test_pci_bus_ids_are_normalised_as_nvml_and_sysfs_write_them() -> None:
    assert normal_pci_bus_id("00000000:1B:00.0") == "0000:1b:00.0"
    assert normal_pci_bus_id("1b:00.0") == "0000:1b:00.0"
    assert normal_pci_bus_id("1b:00") is None


def test_vfio_uuid_is_nvidias_sha1_name_based_uuid_of_the_pci_address() -> None:
    # NVIDIA: uuid.NewSHA1(uuid.NameSpaceDNS, []byte(address)); a version-5 UUID, stable for the address.
    value = vfio_uuid("0000:53:00.0")
    assert value == str(uuid.uuid5(uuid.NAMESPACE_DNS, "0000:53:00.0"))
    assert uuid.UUID(value).version == 5
    assert vfio_uuid("00000000:53:00.0") == value


def test_pci_ids_in_nvidias_format() -> None:
    assert pci_ids(0x233010DE) == ("0x2330", "0x10de")


def test_addressable_memory_sums_64_bit_memory_bars_rounded_up_to_a_power_of_two() -> None:
    # An H100's sysfs `resource`: BAR0 16 MiB 32-bit, BAR1 128 GiB 64-bit prefetchable, BAR3 32 MiB 64-bit; then an
    # empty BAR, the ROM and SR-IOV lines that must not count.
    text = "\n".join([
        "0x00000000e2000000 0x00000000e2ffffff 0x0000000000040200",
        "0x0000220000000000 0x0000221fffffffff 0x000000000014220c",
        "0x0000000000000000 0x0000000000000000 0x0000000000000000",
        "0x0000222000000000 0x0000222001ffffff 0x000000000014220c",
        "0x0000000000000000 0x0000000000000000 0x0000000000000000",
        "0x0000000000000000 0x0000000000000000 0x0000000000000000",
        "0x00000000e3000000 0x00000000e307ffff 0x000000000014220c",  # 7th line: not a BAR
    ])
    assert addressable_memory(text) == 256 * 1024**3  # 128 GiB + 32 MiB -> the next power of two
    assert addressable_memory("") is None
    assert addressable_memory("junk junk junk") is None


# --- the catalog -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", list(MigOffering))
def test_every_gpu_offered_whole_gets_one_vfio_device_and_all_its_devices_share_the_counter_set(
    policy: MigOffering,
) -> None:
    inv = _inventory("fake:dgx-h100")
    devices = catalog(inv, policy, EXCLUSIVE, ALL)
    vfio = [d for d in devices.values() if d.kind is DeviceKind.VFIO]
    assert sorted(d.name for d in vfio) == sorted(f"gpu-{g.info.minor}-vfio" for g in inv.gpus)
    assert all(d.partitioned for d in devices.values())  # every device of a passthrough GPU draws from its set
    without = catalog(inv, policy, EXCLUSIVE, NO_PASSTHROUGH)
    assert set(devices) - set(without) == {d.name for d in vfio}  # nothing else appears or disappears


def test_gpus_with_mig_on_are_not_offered_for_passthrough() -> None:
    """Static MIG (and Ampere under dynamic MIG): the GPU is not offered whole, so not to a VM either."""
    for policy in MigOffering:
        devices = catalog(_inventory("fake:dgx-a100"), policy, EXCLUSIVE, ALL)
        assert not [d for d in devices.values() if d.kind is DeviceKind.VFIO]
        assert not any(d.partitioned for d in devices.values() if d.kind is DeviceKind.MIG_STATIC)


def test_listed_gpus_by_index_uuid_or_pci_bus_id() -> None:
    inv = _inventory("fake:dgx-h100")
    g1, g2 = inv.gpus[1], inv.gpus[2]
    selection = passthrough_settings(f"0,{g1.uuid},{g2.info.pci_bus_id.upper()}")
    devices = catalog(inv, MigOffering.NONE, EXCLUSIVE, selection)
    assert sorted(d.name for d in devices.values() if d.kind is DeviceKind.VFIO) == [
        "gpu-0-vfio", f"gpu-{g1.info.minor}-vfio", f"gpu-{g2.info.minor}-vfio"]
    # The other GPUs stay as they were: not partitioned, no counters.
    assert not devices["gpu-3"].partitioned
    assert passthrough_settings("0,9,GPU-nope").unknown_gpus(inv) == ("9", "GPU-nope")


def test_shares_and_consumable_shares_draw_from_the_same_set() -> None:
    inv = _inventory("fake:dgx-h100")
    for sharing in (sharing_settings("shares"), sharing_settings("exclusive", consumable="4")):
        devices = catalog(inv, MigOffering.NONE, sharing, ALL)
        gpu0 = [d for d in devices.values() if d.gpu.info.index == 0]
        assert {d.kind for d in gpu0} >= {DeviceKind.VFIO}
        assert all(d.partitioned for d in gpu0)


# --- the slices ------------------------------------------------------------------------------------------------


def test_vfio_device_consumes_the_whole_set_and_so_does_the_whole_gpu() -> None:
    inv = _inventory("fake:l4x2")  # no MIG geometry: the set is the single counter `gpu`
    slices = _slices("fake:l4x2", MigOffering.NONE)
    sets = {c["name"]: c for s in slices for c in s["spec"].get("sharedCounters", [])}
    assert sets == {f"gpu-{g.info.minor}-counter-set": counter_set(g) for g in inv.gpus}
    devices = _devices(slices)
    for gpu in inv.gpus:
        whole, vfio = devices[f"gpu-{gpu.info.minor}"], devices[f"gpu-{gpu.info.minor}-vfio"]
        expected = [{"counterSet": f"gpu-{gpu.info.minor}-counter-set",
                     "counters": {k: {"value": str(v)} for k, v in sorted(counter_totals(gpu).items())}}]
        assert whole["consumesCounters"] == expected == vfio["consumesCounters"]


def test_vfio_device_attributes_are_nvidias_set() -> None:
    inv = _inventory("fake:dgx-h100")
    gpu = inv.gpus[0]
    facts = PassthroughSettings(PassthroughScope.ALL, iommufd=True,
                                addressable_memory={gpu.info.pci_bus_id: 256 * 1024**3})
    devices = _devices(_slices("fake:dgx-h100", MigOffering.DYNAMIC, facts))
    vfio = devices[f"gpu-{gpu.info.minor}-vfio"]
    device_id, vendor_id = pci_ids(gpu.info.pci_device_id)
    assert vfio["attributes"] == {
        "type": {"string": "vfio"},
        "uuid": {"string": vfio_uuid(gpu.info.pci_bus_id)},
        "deviceID": {"string": device_id},
        "vendorID": {"string": "0x10de"},
        "productName": {"string": gpu.info.name},
        "iommuFDEnabled": {"bool": True},
        "resource.kubernetes.io/pciBusID": {"string": gpu.info.pci_bus_id},
        "resource.kubernetes.io/pcieRoot": {"string": gpu.topology.pcie_root},
        "numaNode": {"int": gpu.topology.numa_node},
        "resource.kubernetes.io/numaNode": {"int": gpu.topology.numa_node},
    }
    assert device_id.startswith("0x") and len(device_id) == 6 and vendor_id == "0x10de"
    assert vfio["capacity"] == {"addressableMemory": {"value": "256Gi"}}
    assert "allowMultipleAllocations" not in vfio  # one VM per GPU: no shares
    # A GPU whose BARs could not be read publishes no capacity rather than a guess.
    assert devices[f"gpu-{inv.gpus[1].info.minor}-vfio"]["capacity"] == {}
    # The container device keeps its own identity: the passthrough offer changes nothing else on it.
    assert devices["gpu-0"]["attributes"]["type"] == {"string": "gpu"}


def test_the_vfio_device_stands_after_the_gpus_container_devices() -> None:
    names = list(_devices(_slices("fake:dgx-h100", MigOffering.DYNAMIC)))
    gpu0 = [n for n in names if n == "gpu-0" or n.startswith("gpu-0-")]
    assert gpu0[0] == "gpu-0" and gpu0[-1] == "gpu-0-vfio"


SHARING = {"exclusive": EXCLUSIVE, "shares": sharing_settings("shares"),
           "consumable": sharing_settings("exclusive", consumable="memory")}


@pytest.mark.parametrize("preset", ["dgx-h100", "dgx-a100", "l4x2", "a30x4"])
@pytest.mark.parametrize("policy", list(MigOffering))
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("sharing", list(SHARING))
def test_passthrough_slices_are_valid_on_every_supported_version(
    preset: str, policy: MigOffering, version: tuple[int, int], sharing: str
) -> None:
    slices = _slices(f"fake:{preset}", policy, ALL, version, SHARING[sharing])
    for obj in slices:
        kubeschema.validate(obj, f"{version[0]}.{version[1]}.0")
        errors = validate_resource_slice(obj, ValidationOptions(kube_version=version))
        assert not errors, format_errors(errors)
        for device in obj["spec"].get("devices", []):
            assert len(device.get("consumesCounters", [])) <= 2  # the API's limit per device
    assert len(_devices(slices)) == len({d for s in slices for d in (x["name"] for x in s["spec"].get("devices", []))})


def test_compatibility_groups_only_when_asked_and_kept_only_with_the_gate() -> None:
    """KEP-5963 is alpha in 1.37 and off by default; when on, the sandbox API server (as a 1.37 server with
    DRADeviceCompatibilityGroups off) drops the field without a word, known to strict decoding, and keeps it with
    the gate on (docs/passthrough.md)."""
    plain = _devices(_slices("fake:l4x2", MigOffering.NONE))
    assert not any("compatibilityGroups" in c for d in plain.values() for c in d.get("consumesCounters", []))
    grouped_settings = PassthroughSettings(PassthroughScope.ALL, compatibility_groups=True)
    slices = _slices("fake:l4x2", MigOffering.NONE, grouped_settings, (1, 37))
    grouped = _devices(slices)
    assert grouped["gpu-0"]["consumesCounters"][0]["compatibilityGroups"] == ["native"]
    assert grouped["gpu-0-vfio"]["consumesCounters"][0]["compatibilityGroups"] == ["vfio"]
    device_slice = next(s for s in slices if s["spec"].get("devices"))
    pruned, dropped = prune_unknown_fields(device_slice, options=ValidationOptions(kube_version=(1, 37)))
    assert dropped == []  # a known field: no strict-decoding error
    kept, _ = prune_unknown_fields(device_slice, options=ValidationOptions(
        kube_version=(1, 37), enabled_gates=frozenset({"DRADeviceCompatibilityGroups"})))
    assert kept["spec"]["devices"] == device_slice["spec"]["devices"]
    assert pruned["spec"]["devices"] == [
        {**d, "consumesCounters": [{k: v for k, v in c.items() if k != "compatibilityGroups"}
                                   for c in d["consumesCounters"]]}
        for d in device_slice["spec"]["devices"]
    ]
    # Only GPUs offered for passthrough carry groups.
    listed = PassthroughSettings(PassthroughScope.LISTED, ("0",), compatibility_groups=True)
    shared = _devices(_slices("fake:dgx-h100", MigOffering.DYNAMIC, listed, (1, 37)))
    assert "compatibilityGroups" in shared["gpu-0-mig-1g10gb-19-6"]["consumesCounters"][0]
    assert "compatibilityGroups" not in shared["gpu-1-mig-1g10gb-19-6"]["consumesCounters"][0]
