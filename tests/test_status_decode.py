"""`dra-driver status` decodes each listed ResourceSlice as only the fields it shows (`status.status_slice`): the
status built from them is the status built from the whole objects, and a slice of an unexpected shape is decoded
whole rather than refused or cut."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dra_driver.commands.status import status_slice
from dra_driver.commands.statusview import build_status
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.k8s.client import ApiError
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices

DRIVER = "gpu.dra.dev"


def _published(preset: str, node: str) -> list[dict[str, Any]]:
    backend = open_backend(f"fake:{preset}")
    backend.init()
    inventory = discover(backend)
    slices: list[dict[str, Any]] = build_slices(inventory.system, catalog(inventory, MigOffering.DYNAMIC),
                                                SliceSettings(DRIVER, node), 1)
    return slices


def test_the_status_of_the_shown_fields_is_the_status_of_the_whole_slices() -> None:
    whole = _published("dgx-h100", "node-a") + _published("l4x2", "node-b")
    first = next(i for i, s in enumerate(whole) if s["spec"].get("devices"))
    whole[first]["spec"]["devices"][0]["taints"] = [{"key": "gpu.dra.dev/xid", "value": "79", "effect": "NoSchedule"}]
    shown = [status_slice(json.dumps(s).encode()) for s in whole]
    built = build_status(shown, [], [], driver=DRIVER)
    assert built == build_status(whole, [], [], driver=DRIVER)
    assert [n.name for n in built] == ["node-a", "node-b"] and any(g.taints for g in built[0].gpus)
    device = shown[first]["spec"]["devices"][0]
    assert set(device) <= {"name", "attributes", "taints", "capacity"} and "consumesCounters" not in device
    assert set(device["capacity"]) <= {"memory"}
    assert "sharedCounters" not in json.dumps(shown)
    assert shown[0]["metadata"] == whole[0]["metadata"] and shown[0]["spec"]["pool"] == whole[0]["spec"]["pool"]


def test_a_slice_of_another_shape_is_decoded_whole_and_what_is_not_an_object_is_refused() -> None:
    odd = {"metadata": {"name": "odd"}, "spec": {"driver": DRIVER, "nodeName": "n", "pool": {"name": "n"},
                                                  "devices": [{"name": "d", "attributes": {"uuid": ["a", "list"]}}]}}
    assert status_slice(json.dumps(odd).encode()) == odd
    absent = {"metadata": {"name": "bare"}, "spec": {"driver": DRIVER}}
    assert status_slice(json.dumps(absent).encode()) == absent  # absent fields stay absent
    with pytest.raises(ApiError, match="an item that is not an object"):
        status_slice(b"[1, 2]")
