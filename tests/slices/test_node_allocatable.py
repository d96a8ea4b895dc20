"""KEP-5517 `--node-allocatable-overhead` (slices/nodeallocatable.py): the flag's values and errors, and the devices
that carry the overhead (container devices only, nothing by default or where the API server does not keep it)."""

from __future__ import annotations

import pytest

from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.passthrough import PassthroughScope, PassthroughSettings
from dra_driver.inventory.sharing import EXCLUSIVE
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_driver.slices.nodeallocatable import OverheadError, parse_overhead


@pytest.mark.parametrize(("text", "parsed"), [
    ("", {}), ("none", {}), ("memory=2048Mi,cpu=0.5", {"cpu": "500m", "memory": "2Gi"}),
    ("hugepages-2Mi=4Mi", {"hugepages-2Mi": "4Mi"}), ("memory=0", {"memory": "0"}),
])
def test_the_flag_gives_canonical_quantities(text: str, parsed: dict[str, str]) -> None:
    assert dict(parse_overhead(text)) == parsed


@pytest.mark.parametrize(("text", "words"), [
    ("memory", "is not NAME=QUANTITY"), ("gpu=1", "not a node allocatable resource"),
    ("memory=lots", "memory=lots"), ("memory=-1Gi", "negative"), ("memory=1Gi,memory=2Gi", "given twice"),
])
def test_a_bad_value_names_the_flag_and_the_fix(text: str, words: str) -> None:
    with pytest.raises(OverheadError, match="--node-allocatable-overhead") as caught:
        parse_overhead(text)
    assert words in str(caught.value)


def _devices(overhead: str, served: bool = True) -> dict[str, dict[str, object]]:
    backend = open_backend("fake:l4x2")
    backend.init()
    inventory = discover(backend)
    passthrough = PassthroughSettings(PassthroughScope.ALL)
    devices = catalog(inventory, MigOffering.NONE, EXCLUSIVE, passthrough)
    settings = SliceSettings("gpu.dra.dev", "n", kube_version=(1, 37), passthrough=passthrough,
                             node_allocatable_overhead=parse_overhead(overhead), node_allocatable_served=served)
    return {d["name"]: d for s in build_slices(inventory.system, devices, settings, 1) for d in s["spec"].get("devices", [])}


def test_container_devices_carry_the_overhead_and_vm_devices_none() -> None:
    devices = _devices("memory=2Gi")
    assert devices["gpu-0"]["nodeAllocatableResources"] == {"memory": {"overhead": {"perPod": "2Gi"}}}
    assert "nodeAllocatableResources" not in devices["gpu-0-vfio"]
    assert not any("nodeAllocatableResources" in d for d in _devices("none").values())
    assert not any("nodeAllocatableResources" in d for d in _devices("memory=2Gi", served=False).values())
