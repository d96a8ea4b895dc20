"""The slice builder per preset: names, attributes, capacities, counters, chunking, and real validation
(the official OpenAPI schema via kubernetes-validate, plus the API server's limits)."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.k8s.quantity import parse_quantity
from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.types import Placement
from dra_driver.slices.builder import SliceSettings, build_slices, slice_name
from dra_sandbox.apiserver.validation import ValidationOptions, format_errors, validate_resource_slice
from tests import kubeschema

DRIVER = DRIVER_NAME


def _inventory(spec: str) -> Any:
    backend = open_backend(spec)
    backend.init()
    return backend, discover(backend)


def _slices(spec: str, policy: MigOffering, version: tuple[int, int] = (1, 35), **kw: Any) -> list[dict[str, Any]]:
    _, inv = _inventory(spec)
    settings = SliceSettings(driver_name=DRIVER, node_name="node-a", kube_version=version, **kw)
    return build_slices(inv.system, catalog(inv, policy), settings, generation=7)


def _devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


def _assert_valid(slices: list[dict[str, Any]], version: tuple[int, int]) -> None:
    for obj in slices:
        kubeschema.validate(obj, f"{version[0]}.{version[1]}.0")
        errors = validate_resource_slice(obj, ValidationOptions(kube_version=version))
        assert not errors, format_errors(errors)


PRESETS = ["dgx-h100", "dgx-a100", "hgx-h200", "a30x4", "l4x2"]


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("policy", list(MigOffering))
@pytest.mark.parametrize("version", [(1, 34), (1, 35)])
def test_every_preset_and_layout_is_valid(preset: str, policy: MigOffering, version: tuple[int, int]) -> None:
    slices = _slices(f"fake:{preset}", policy, version)
    _assert_valid(slices, version)
    generations = {s["spec"]["pool"]["generation"] for s in slices}
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices}
    assert generations == {7} and counts == {len(slices)}
    names = [d["name"] for d in _devices(slices)]
    assert len(names) == len(set(names))
    assert [s["metadata"]["name"] for s in slices] == [
        slice_name(SliceSettings(DRIVER, "node-a"), i) for i in range(len(slices))
    ]


def test_whole_gpus_carry_identity_topology_and_capacity() -> None:
    devices = {d["name"]: d for d in _devices(_slices("fake:dgx-h100", MigOffering.STATIC))}
    assert sorted(devices) == sorted(f"gpu-{i}" for i in range(8))
    gpu = devices["gpu-0"]
    attrs = gpu["attributes"]
    assert attrs["type"] == {"string": "gpu"}
    assert attrs["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attrs["architecture"] == {"string": "Hopper"}
    assert attrs["cudaComputeCapability"] == {"version": "9.0.0"}
    assert attrs["driverVersion"] == {"version": "580.105.8"}  # "08" is not valid semver
    assert attrs["cudaDriverVersion"] == {"version": "13.0.0"}
    assert attrs["migCapable"] == {"bool": True}
    assert attrs["uuid"]["string"].startswith("GPU-")
    assert attrs["numaNode"] == {"int": 0}
    assert attrs["resource.kubernetes.io/numaNode"] == {"int": 0}  # KEP-6072 standard attribute
    assert attrs["resource.kubernetes.io/pciBusID"]["string"].startswith("0000:")
    assert attrs["resource.kubernetes.io/pcieRoot"]["string"].startswith("pci")
    domains = {d["attributes"]["nvlinkDomain"]["string"] for d in devices.values()}
    assert len(domains) == 1  # NVSwitch: one domain
    # Canonical, as kube-apiserver returns it (81559 MiB: the fake H100's memory, a whole number of MiB).
    assert gpu["capacity"]["memory"] == {"value": "81559Mi"}
    assert parse_quantity(gpu["capacity"]["memory"]["value"]).as_int64() > 80 * 10**9
    assert gpu["capacity"]["multiprocessors"] == {"value": "132"}
    assert "consumesCounters" not in gpu


def test_l4_has_no_nvlink_domain_and_is_not_mig_capable() -> None:
    for dev in _devices(_slices("fake:l4x2", MigOffering.DYNAMIC)):
        assert "nvlinkDomain" not in dev["attributes"]
        assert dev["attributes"]["migCapable"] == {"bool": False}


def test_static_mig_devices_replace_the_whole_gpu() -> None:
    backend, _ = _inventory("fake:dgx-a100")
    gpu0 = backend.gpus()[0].uuid
    for profile_id, placement, ci_profile in ((9, Placement(4, 4), 2), (19, Placement(0, 1), 0)):
        gi = backend.create_gpu_instance(gpu0, profile_id, placement)
        backend.create_compute_instance(gpu0, gi.id, ci_profile)
    inv = discover(backend)
    slices = build_slices(inv.system, catalog(inv, MigOffering.STATIC), SliceSettings(DRIVER, "node-a"), generation=1)
    _assert_valid(slices, (1, 35))
    devices = {d["name"]: d for d in _devices(slices)}
    assert "gpu-0" not in devices  # MIG on: not offered whole
    assert {"gpu-0-mig-3g20gb-9-4", "gpu-0-mig-1g5gb-19-0"} <= set(devices)
    mig = devices["gpu-0-mig-3g20gb-9-4"]
    assert mig["attributes"]["type"] == {"string": "mig"}
    assert mig["attributes"]["profile"] == {"string": "3g.20gb"}
    assert mig["attributes"]["parentUUID"] == {"string": gpu0}
    assert mig["attributes"]["uuid"]["string"].startswith("MIG-")
    assert mig["capacity"]["multiprocessors"] == {"value": "42"}
    assert mig["capacity"]["memory"] == {"value": "19968Mi"}  # 19968 * 2**20 bytes, in canonical form
    assert mig["capacity"]["decoders"] == {"value": "2"}


def test_dynamic_mig_counters_on_hopper() -> None:
    slices = _slices("fake:dgx-h100", MigOffering.DYNAMIC)
    counter_slices = [s for s in slices if "sharedCounters" in s["spec"]]
    assert len(counter_slices) == 1 and "devices" not in counter_slices[0]["spec"]
    sets = {c["name"]: c["counters"] for c in counter_slices[0]["spec"]["sharedCounters"]}
    assert sorted(sets) == sorted(f"gpu-{i}-counter-set" for i in range(8))
    gpu0 = sets["gpu-0-counter-set"]
    assert [k for k in gpu0 if k.startswith("memory-slice-")] == [f"memory-slice-{i}" for i in range(8)]
    assert gpu0["multiprocessors"] == {"value": "132"}
    assert gpu0["profile-20-instances"] == {"value": "1"}  # 1g.10gb+me: 7 placements, 1 instance
    devices = {d["name"]: d for d in _devices(slices)}
    per_gpu = [n for n in devices if n.startswith("gpu-0-")]
    assert len(per_gpu) == 7 + 7 + 4 + 3 + 2 + 1 + 1  # every (profile, placement)
    three_g = devices["gpu-0-mig-3g40gb-9-4"]["consumesCounters"][0]
    assert three_g["counterSet"] == "gpu-0-counter-set"
    assert {k for k in three_g["counters"] if k.startswith("memory-slice")} == {
        f"memory-slice-{i}" for i in range(4, 8)
    }
    whole = devices["gpu-0"]["consumesCounters"][0]["counters"]
    assert whole == gpu0  # the whole GPU takes everything
    for s in slices:
        assert len(s["spec"].get("devices", [])) <= 64


def test_dynamic_on_ampere_with_mig_on_offers_partitions_only() -> None:
    devices = {d["name"] for d in _devices(_slices("fake:dgx-a100", MigOffering.DYNAMIC))}
    assert "gpu-0" not in devices
    assert "gpu-0-mig-7g40gb-0-0" in devices


def test_combined_layout_for_1_34() -> None:
    slices = _slices("fake:dgx-h100", MigOffering.DYNAMIC, (1, 34))
    for s in slices:
        assert len(s["spec"].get("sharedCounters", [])) == 1
        owner = s["spec"]["sharedCounters"][0]["name"].removesuffix("-counter-set")
        assert all(d["name"] == owner or d["name"].startswith(owner + "-") for d in s["spec"]["devices"])


def test_taints_force_64_device_slices() -> None:
    _, inv = _inventory("fake:dgx-h100")
    devices = catalog(inv, MigOffering.DYNAMIC)
    taint = [{"key": "gpu.dra.dev/xid", "value": "79", "effect": "NoSchedule"}]
    settings = SliceSettings(DRIVER, "node-a", taints={"gpu-3": taint})
    slices = build_slices(inv.system, devices, settings, generation=1)
    _assert_valid(slices, (1, 35))
    tainted = next(d for d in _devices(slices) if d["name"] == "gpu-3")
    assert tainted["taints"] == taint


@pytest.mark.parametrize("version", [(1, 34), (1, 35), (1, 37)])
def test_effect_none_taints_only_where_the_server_knows_the_effect(version: tuple[int, int]) -> None:
    """DeviceTaint effect None is 1.35+: a 1.34 server refuses it, so informational taints are left out there."""
    _, inv = _inventory("fake:dgx-h100")
    devices = catalog(inv, MigOffering.NONE)
    hard = {"key": "gpu.dra.dev/xid", "value": "79", "effect": "NoSchedule"}
    info = {"key": "gpu.dra.dev/unmonitored", "value": "driver-reload", "effect": "None"}
    settings = SliceSettings(DRIVER, "node-a", kube_version=version, taints={"gpu-1": [hard, info], "gpu-2": [info]})
    slices = build_slices(inv.system, devices, settings, generation=1)
    _assert_valid(slices, version)
    by_name = {d["name"]: d for d in _devices(slices)}
    if version >= (1, 35):
        assert by_name["gpu-1"]["taints"] == [hard, info] and by_name["gpu-2"]["taints"] == [info]
    else:
        assert by_name["gpu-1"]["taints"] == [hard] and "taints" not in by_name["gpu-2"]


def test_output_is_deterministic() -> None:
    assert _slices("fake:hgx-h200", MigOffering.DYNAMIC) == _slices("fake:hgx-h200", MigOffering.DYNAMIC)


def test_empty_node_still_publishes_one_empty_slice() -> None:
    slices = _slices("fake:dgx-a100", MigOffering.NONE)
    assert len(slices) == 1 and slices[0]["spec"]["devices"] == []
    _assert_valid(slices, (1, 35))


def test_standard_numa_node_follows_the_gpu_and_is_omitted_when_unknown() -> None:
    by_name = {d["name"]: d["attributes"] for d in _devices(_slices("fake:dgx-h100", MigOffering.DYNAMIC))}
    numa = {n: a["resource.kubernetes.io/numaNode"]["int"] for n, a in by_name.items()}
    assert {numa[f"gpu-{i}"] for i in range(8)} == {0, 1}
    # MIG devices carry their parent GPU's node.
    assert all(numa[n] == numa[n.split("-mig-")[0]] for n in numa if "-mig-" in n)
    # A single-node fake reports no NUMA node (as sysfs -1): no attribute at all.
    single = _devices(_slices("fake:l4x2", MigOffering.NONE))
    assert single and all("resource.kubernetes.io/numaNode" not in d["attributes"] for d in single)


def test_list_attributes_only_when_asked_and_the_server_has_them() -> None:
    """listAttributes: numaNode becomes [node, same-socket nearest]; before 1.36 the int stays (no list fields)."""
    on_136 = _slices("fake:dgx-h100", MigOffering.DYNAMIC, (1, 36), list_attributes=True)
    values = {d["name"]: d["attributes"]["resource.kubernetes.io/numaNode"] for d in _devices(on_136)}
    assert values["gpu-0"] == {"ints": [0]} and values["gpu-7"] == {"ints": [1]}
    assert all(len(s["spec"].get("devices", [])) <= 64 for s in on_136)  # lists make a slice "advanced"
    lists_on = ValidationOptions(kube_version=(1, 36), list_type_attributes=True)
    for obj in on_136:
        errors = validate_resource_slice(obj, lists_on)
        assert not errors, format_errors(errors)
    # The same slices on a 1.36 server whose gate is off are refused: why the value is off by default.
    assert validate_resource_slice(on_136[-1], ValidationOptions(kube_version=(1, 36)))
    on_135 = _slices("fake:dgx-h100", MigOffering.DYNAMIC, (1, 35), list_attributes=True)
    assert {d["attributes"]["resource.kubernetes.io/numaNode"]["int"] for d in _devices(on_135)} == {0, 1}
    assert _slices("fake:dgx-h100", MigOffering.DYNAMIC, (1, 36)) == _slices(
        "fake:dgx-h100", MigOffering.DYNAMIC, (1, 36), list_attributes=False)


def test_numa_node_attribute_list_form_orders_the_physical_node_first() -> None:
    from dra_driver.inventory.model import GpuTopology
    from dra_driver.slices.attributes import numa_node_attribute

    topo = GpuTopology(numa_node=2, cpu_affinity=(), pcie_root=None, nvlink_peers=(), nvlink_domain=None,
                       fabric_clique=None, numa_neighbours=(3,))
    assert numa_node_attribute(topo, list_form=True) == {"ints": [2, 3]}
    assert numa_node_attribute(topo, list_form=False) == {"int": 2}
    unknown = GpuTopology(numa_node=None, cpu_affinity=(), pcie_root=None, nvlink_peers=(), nvlink_domain=None,
                          fabric_clique=None)
    assert numa_node_attribute(unknown, list_form=True) is None
