"""What an HGX node in shared NVSwitch mode offers (docs/passthrough.md "Fabric Manager partitions"): one
`fm-partition-<id>` device per partition, consuming every member GPU's whole counter set, so it excludes the members'
other uses and overlapping partitions; schema-valid slices from 1.35 on; none in the 1.34 layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_driver.inventory.catalog import DeviceKind, MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.fmpartitions import with_partitions
from dra_driver.inventory.model import NodeInventory
from dra_driver.inventory.passthrough import passthrough_settings
from dra_driver.inventory.sharing import EXCLUSIVE
from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_driver.slices.offer import offered
from tests import kubeschema

NODE = "name: hgx\ngpus:\n  - model: H100-SXM5-80GB\n    count: 4\n"


@pytest.fixture
def nvml(tmp_path: Path) -> FakeNvml:
    node = tmp_path / "node.yaml"
    node.write_text(NODE)
    backend = open_backend(f"fake:{node},fabric_partitions=true")
    assert isinstance(backend, FakeNvml)
    backend.init()
    return backend


def _devices(nvml: FakeNvml) -> tuple[NodeInventory, dict[str, Any]]:
    inventory = discover(nvml)
    devices = catalog(inventory, MigOffering.DYNAMIC, EXCLUSIVE, passthrough_settings("all"))
    return inventory, with_partitions(devices, inventory, nvml.fabric_manager().supported_partitions())


def _built(nvml: FakeNvml, version: tuple[int, int]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    inventory, devices = _devices(nvml)
    settings = SliceSettings(driver_name="gpu.dra.dev", node_name="n", kube_version=version)
    slices = build_slices(inventory.system, devices, settings, 1)
    return slices, {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def test_a_partition_takes_all_of_its_members_fabric_counters(nvml: FakeNvml) -> None:
    _, devices = _devices(nvml)
    partitions = sorted(n for n, d in devices.items() if d.kind is DeviceKind.FM_PARTITION)
    assert partitions == [f"fm-partition-{i}" for i in range(7)]
    slices, built = _built(nvml, (1, 35))
    sets = {s["name"]: s["counters"] for sl in slices for s in sl["spec"].get("sharedCounters", [])}
    # One counter per member GPU: its number of other devices (whole GPU, VFIO, MIG placements on this H100).
    fabric = sets["fabric-partitions-counter-set"]
    per_gpu = {n: sum(1 for d in devices.values() if d.gpu.info.minor == int(n.split("-")[1])
                      and d.kind is not DeviceKind.FM_PARTITION) for n in fabric}  # fmt: skip
    assert {n: int(c["value"]) for n, c in fabric.items()} == per_gpu
    assert sorted(fabric) == [f"gpu-{i}" for i in range(4)]
    whole = built["fm-partition-0"]
    assert whole["consumesCounters"] == [{"counterSet": "fabric-partitions-counter-set", "counters": fabric}]
    assert whole["attributes"]["type"] == {"string": "fm-partition"}
    assert whole["attributes"]["gpuCount"] == {"int": 4} and whole["attributes"]["partitionID"] == {"int": 0}
    pair = built["fm-partition-1"]["consumesCounters"]
    assert [sorted(c["counters"]) for c in pair] == [["gpu-0", "gpu-1"]]
    # Every other device of a member GPU takes 1 of its GPU's counter, beside its own set (two sets at most).
    for name in ("gpu-0", "gpu-0-vfio"):
        fabric_use = [c for c in built[name]["consumesCounters"] if c["counterSet"] == "fabric-partitions-counter-set"]
        assert fabric_use == [{"counterSet": "fabric-partitions-counter-set", "counters": {"gpu-0": {"value": "1"}}}]
    assert all(len(d.get("consumesCounters", [])) <= 2 for d in built.values())
    for item in slices:
        kubeschema.validate(item, "1.35.0")


def test_the_1_34_layout_leaves_partitions_out(nvml: FakeNvml) -> None:
    slices, built = _built(nvml, (1, 34))
    assert not any(n.startswith("fm-partition-") for n in built)
    assert "gpu-0" in built
    for item in slices:
        kubeschema.validate(item, "1.34.0")


def test_the_plugins_offer_follows_the_flag(nvml: FakeNvml) -> None:
    inventory = discover(nvml)
    assert [p.id for p in inventory.fabric_partitions] == list(range(7))
    on = SliceSettings(driver_name="gpu.dra.dev", node_name="n", fabric_partitions=True)
    off = SliceSettings(driver_name="gpu.dra.dev", node_name="n")
    with_fm = offered(inventory, MigOffering.STATIC, on, on.passthrough)
    assert sum(d.kind is DeviceKind.FM_PARTITION for d in with_fm.values()) == 7
    assert not any(
        d.kind is DeviceKind.FM_PARTITION for d in offered(inventory, MigOffering.STATIC, off, off.passthrough).values()
    )


def test_a_node_without_fm_lists_no_partitions(tmp_path: Path) -> None:
    node = tmp_path / "plain.yaml"
    node.write_text(NODE)
    backend = open_backend(f"fake:{node}")
    backend.init()
    assert discover(backend).fabric_partitions == ()
