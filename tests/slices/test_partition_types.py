"""KEP-5677 partition types (slices/partitiontypes.py, gate DRAPartitionableDevicesType): where the API server keeps
`spec.partitionTypeAttribute`, every counter-consuming device carries the string `partitionType` and each slice with
such a device names it, as 1.37.2's validation wants; the pool is one kube-controller-manager 1.37.2 can summarise
(the devices of a type consume the same counters, at most 32 types) or it gets neither; nothing where not served."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.passthrough import PassthroughScope, PassthroughSettings
from dra_driver.inventory.sharing import EXCLUSIVE
from dra_driver.inventory.vgpu import vgpu_settings
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_driver.slices.partitiontypes import MAX_PARTITION_TYPES, summarizable

DRIVER = "gpu.dra.dev"
ATTRIBUTE = f"{DRIVER}/partitionType"
MAX_ATTRIBUTES_AND_CAPACITIES = 32  # resource.k8s.io/v1: per device


def _slices(spec: str, mig: MigOffering = MigOffering.NONE, *, served: bool = True, vgpu: str = "none",
            passthrough: bool = True) -> list[dict[str, Any]]:
    backend = open_backend(spec)
    backend.init()
    inventory = discover(backend)
    through = PassthroughSettings(PassthroughScope.ALL if passthrough else PassthroughScope.NONE)
    devices = catalog(inventory, mig, EXCLUSIVE, through, vgpu_settings(vgpu))
    settings = SliceSettings(DRIVER, "n", kube_version=(1, 37), passthrough=through, vgpu=vgpu_settings(vgpu),
                             partition_types_served=served)
    return build_slices(inventory.system, devices, settings, 1)


def _devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


def _type(device: dict[str, Any]) -> str | None:
    value = device["attributes"].get("partitionType")
    return None if value is None else str(value["string"])


def _check_as_the_api_server(slices: list[dict[str, Any]]) -> None:
    """1.37.2 validatePartitionTypeAttribute: only on a slice with a counter-consuming device, each of which carries
    the attribute as a string; the device limit on attributes and capacities still holds."""
    for s in slices:
        spec = s["spec"]
        consuming = [d for d in spec.get("devices", []) if d.get("consumesCounters")]
        if "partitionTypeAttribute" in spec:
            assert spec["partitionTypeAttribute"] == ATTRIBUTE and consuming
            assert all(isinstance(_type(d), str) for d in consuming)
        for d in spec.get("devices", []):
            assert len(d["attributes"]) + len(d.get("capacity", {})) <= MAX_ATTRIBUTES_AND_CAPACITIES, d["name"]


def test_a_passthrough_node_names_a_type_per_gpu_and_shape(tmp_path: Path) -> None:
    slices = _slices("fake:l4x2")
    _check_as_the_api_server(slices)
    types = {d["name"]: _type(d) for d in _devices(slices)}
    assert types == {"gpu-0": "gpu-0/whole", "gpu-0-vfio": "gpu-0/vfio", "gpu-1": "gpu-1/whole",
                     "gpu-1-vfio": "gpu-1/vfio"}
    device_slices = [s for s in slices if s["spec"].get("devices")]
    assert device_slices and all(s["spec"]["partitionTypeAttribute"] == ATTRIBUTE for s in device_slices)
    # The counter sets' own slice has no device: the API server would refuse the field there.
    assert all("partitionTypeAttribute" not in s["spec"] for s in slices if not s["spec"].get("devices"))


def test_nothing_where_the_server_does_not_keep_the_field() -> None:
    slices = _slices("fake:l4x2", served=False)
    assert not any("partitionTypeAttribute" in s["spec"] for s in slices)
    assert not any(_type(d) for d in _devices(slices))


def test_devices_without_counters_carry_nothing_and_their_slices_name_nothing() -> None:
    slices = _slices("fake:l4x2", passthrough=False)  # plain whole GPUs: no counter set at all
    assert not any("partitionTypeAttribute" in s["spec"] for s in slices)
    assert not any(_type(d) for d in _devices(slices))


def test_vgpu_slots_of_a_type_are_one_partition_type_of_equal_cost(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text("name: vgpu-node\ngpus:\n  - model: H100-SXM5-80GB\n    count: 1\n")
    slices = _slices(f"fake:{node},vgpu=true", vgpu="all")
    _check_as_the_api_server(slices)
    devices = _devices(slices)
    slots = [d for d in devices if "-vgpu-" in d["name"]]
    assert slots and all(_type(d) == f"gpu-0/vgpu-{d['attributes']['vgpuTypeId']['int']}" for d in slots)
    by_type: dict[str | None, set[str]] = {}
    for d in slots:
        by_type.setdefault(_type(d), set()).add(repr(d["consumesCounters"]))
    assert len(by_type) > 1 and all(len(costs) == 1 for costs in by_type.values())
    assert summarizable(devices)


def test_one_dynamic_mig_gpu_is_summarised_per_placement(tmp_path: Path) -> None:
    """Each MIG placement consumes its own memory slices, so its type names the placement; one H100 stays under 32."""
    node = tmp_path / "node.yaml"
    node.write_text("name: mig-node\ngpus:\n  - model: H100-SXM5-80GB\n    count: 1\n")
    slices = _slices(f"fake:{node}", MigOffering.DYNAMIC, passthrough=False)
    _check_as_the_api_server(slices)
    types = {d["name"]: _type(d) for d in _devices(slices)}
    assert types["gpu-0"] == "gpu-0/whole"
    mig = {t for n, t in types.items() if n != "gpu-0"}
    assert "gpu-0/1g.10gb@6" in mig and "gpu-0/7g.80gb@0" in mig and len(mig) == len(types) - 1
    assert len(types) <= 32 and all("partitionTypeAttribute" in s["spec"] for s in slices if s["spec"].get("devices"))


def test_a_pool_over_the_controllers_cap_gets_neither_the_attribute_nor_the_field() -> None:
    """Dynamic MIG on eight H100s: one type per placement per GPU, far over 32 (PartitionSummaryOverCap)."""
    slices = _slices("fake:dgx-h100", MigOffering.DYNAMIC)
    assert not any("partitionTypeAttribute" in s["spec"] for s in slices)
    assert not any(_type(d) for d in _devices(slices))


def test_summarizable_follows_the_controllers_rules() -> None:
    def dev(name: str, typ: str | None, counters: dict[str, str]) -> dict[str, Any]:
        attrs = {} if typ is None else {"partitionType": {"string": typ}}
        return {"name": name, "attributes": attrs,
                "consumesCounters": [{"counterSet": "s", "counters": {k: {"value": v} for k, v in counters.items()}}]}
    assert summarizable([dev("a", "t", {"c": "1"}), dev("b", "t", {"c": "1"})])
    assert not summarizable([dev("a", "t", {"c": "1"}), dev("b", "t", {"c": "2"})])  # PartitionCostMismatch
    assert not summarizable([dev("a", None, {"c": "1"})])  # PartitionTypeMissing
    assert not summarizable([{"name": "plain", "attributes": {}}])  # nothing to summarise
    many = [dev(f"d{i}", f"t{i}", {"c": "1"}) for i in range(MAX_PARTITION_TYPES + 1)]
    assert summarizable(many[:MAX_PARTITION_TYPES]) and not summarizable(many)


def test_the_sandbox_api_server_with_the_gate_stores_the_slices_as_built(tmp_path: Path) -> None:
    from dra_sandbox.apiserver import ApiServer

    node = tmp_path / "node.yaml"
    node.write_text("name: mig-node\ngpus:\n  - model: H100-SXM5-80GB\n    count: 1\n")
    slices = _slices(f"fake:{node}", MigOffering.DYNAMIC)
    with ApiServer(kube_version="1.37.0", feature_gates={"DRAPartitionableDevicesType": True}) as srv, \
            srv.rest() as rest:
        for s in slices:
            stored = rest.request("POST", "/apis/resource.k8s.io/v1/resourceslices",
                                  query={"fieldValidation": "Strict"}, body=s)
            assert stored["spec"] == s["spec"]


def test_a_fabric_manager_partition_is_a_type_of_its_own(tmp_path: Path) -> None:
    """A device over several GPUs consumes each member's whole set: no other device has its cost, so its name is its
    type."""
    from dra_driver.inventory.fmpartitions import with_partitions

    node = tmp_path / "node.yaml"
    node.write_text("name: hgx\ngpus:\n  - model: H100-SXM5-80GB\n    count: 4\n")
    backend = open_backend(f"fake:{node},fabric_partitions=true")
    backend.init()
    inventory = discover(backend)
    devices = with_partitions(catalog(inventory, MigOffering.NONE, EXCLUSIVE),
                              inventory, backend.fabric_manager().supported_partitions())
    settings = SliceSettings(DRIVER, "n", kube_version=(1, 37), partition_types_served=True)
    slices = build_slices(inventory.system, devices, settings, 1)
    _check_as_the_api_server(slices)
    built = _devices(slices)
    partitions = [d for d in built if d["name"].startswith("fm-partition-")]
    assert partitions and all(_type(d) == d["name"] for d in partitions)
    assert summarizable(built) and any("partitionTypeAttribute" in s["spec"] for s in slices)
