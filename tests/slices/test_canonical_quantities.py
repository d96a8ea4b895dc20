"""Every quantity the plugin publishes in a ResourceSlice is already in the canonical form kube-apiserver stores
(apimachinery `Quantity.String()`: `24Gi`, not `25769803776`), so what kubectl shows is what was sent and a
round trip through the API server changes nothing (issue 38)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.sharing import EXCLUSIVE, SharingSettings, sharing_settings
from dra_driver.k8s.quantity import parse_quantity
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_sandbox.apiserver import ApiServer

SHARINGS = {
    "exclusive": EXCLUSIVE,
    "shares": sharing_settings("shares"),
    "consumable-memory": sharing_settings("exclusive", consumable="memory"),
    "consumable-4": sharing_settings("exclusive", consumable="4"),
}


def _slices(preset: str, policy: MigOffering, sharing: SharingSettings) -> list[dict[str, Any]]:
    backend = open_backend(f"fake:{preset}")
    backend.init()
    try:
        inv = discover(backend)
    finally:
        backend.shutdown()
    settings = SliceSettings(DRIVER_NAME, "node-a", kube_version=(1, 37), sharing=sharing)
    return build_slices(inv.system, catalog(inv, policy, sharing), settings, generation=1)


def _quantities(spec: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, text) of every Quantity in a slice spec: capacity values and request policies, counters."""
    for device in spec.get("devices") or ():
        for name, cap in (device.get("capacity") or {}).items():
            yield f"{device['name']}.{name}", cap["value"]
            policy = cap.get("requestPolicy") or {}
            if "default" in policy:
                yield f"{device['name']}.{name}.default", policy["default"]
            for key, text in (policy.get("validRange") or {}).items():
                yield f"{device['name']}.{name}.validRange.{key}", text
            for i, text in enumerate(policy.get("validValues") or ()):
                yield f"{device['name']}.{name}.validValues[{i}]", text
        for use in device.get("consumesCounters") or ():
            for key, counter in use["counters"].items():
                yield f"{device['name']}.{use['counterSet']}.{key}", counter["value"]
    for counter_set in spec.get("sharedCounters") or ():
        for key, counter in counter_set["counters"].items():
            yield f"{counter_set['name']}.{key}", counter["value"]


@pytest.mark.parametrize("sharing", sorted(SHARINGS))
@pytest.mark.parametrize(("preset", "policy"), [("dgx-h100", MigOffering.DYNAMIC), ("a30x4", MigOffering.STATIC),
                                                ("l4x2", MigOffering.NONE)])
def test_every_published_quantity_is_canonical(preset: str, policy: MigOffering, sharing: str) -> None:
    slices = _slices(preset, policy, SHARINGS[sharing])
    found = [(where, text) for s in slices for where, text in _quantities(s["spec"])]
    assert found
    assert [(w, t) for w, t in found if str(parse_quantity(t)) != t] == []


def test_memory_is_published_with_a_binary_suffix() -> None:
    devices = {d["name"]: d for s in _slices("dgx-h100", MigOffering.DYNAMIC, EXCLUSIVE)
               for d in s["spec"].get("devices") or ()}
    assert devices["gpu-0"]["capacity"]["memory"] == {"value": "81559Mi"}  # 85520809984 bytes
    assert devices["gpu-0"]["capacity"]["multiprocessors"] == {"value": "132"}
    mig = next(d for d in devices.values() if d["name"].startswith("gpu-0-mig-1g"))
    assert mig["capacity"]["memory"]["value"].endswith("Mi")
    [use] = mig["consumesCounters"]
    assert use["counters"]["memory"]["value"] == mig["capacity"]["memory"]["value"]  # bytes as bytes, counters too
    counters = {c["name"]: c["counters"] for s in _slices("dgx-h100", MigOffering.DYNAMIC, EXCLUSIVE)
                for c in s["spec"].get("sharedCounters") or ()}
    assert counters["gpu-0-counter-set"]["memory"]["value"].endswith("Mi")
    assert counters["gpu-0-counter-set"]["memory-slice-0"] == {"value": "1"}


def test_what_the_api_server_returns_is_what_was_sent() -> None:
    slices = _slices("dgx-h100", MigOffering.DYNAMIC, SHARINGS["consumable-4"])
    with ApiServer(kube_version="1.37.0") as srv:
        rest = srv.rest()
        for obj in slices:
            rest.request("POST", "/apis/resource.k8s.io/v1/resourceslices", body=obj)
            stored = rest.request("GET", f"/apis/resource.k8s.io/v1/resourceslices/{obj['metadata']['name']}")
            assert list(_quantities(stored["spec"])) == list(_quantities(obj["spec"]))
