"""The device order of published slices is the placement policy (docs/resourceslices.md, "Device order"):
kube-scheduler, like `dra_driver.allocation`, takes the first device that fits in slice order."""

from __future__ import annotations

from typing import Any

from dra_driver.allocation import allocate
from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_sandbox.deviceclasses import device_classes
from tests.narrow import present

NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "labels": {}}}
CEL = DraCelEnvironment()
CLASSES = device_classes(DRIVER_NAME)  # the chart's: gpu.dra.dev (whole GPUs), mig.gpu.dra.dev (any MIG device)
MIG_CLASS = f"mig.{DRIVER_NAME}"


def _published_slices() -> list[dict[str, Any]]:
    backend = open_backend("fake:dgx-h100")
    backend.init()
    inv = discover(backend)
    return build_slices(inv.system, catalog(inv, MigOffering.DYNAMIC), SliceSettings(DRIVER_NAME, "node-a"), 1)


SLICES = _published_slices()


def _claim(name: str, cls: str, selector: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": exactly}]}},
    }


def _allocate(claim: dict[str, Any], granted: list[dict[str, Any]]) -> str:
    outcome = allocate(claim, node=NODE, classes=CLASSES, slices=SLICES, allocated_claims=granted, cel=CEL)
    assert outcome.ok, outcome.explanation
    granted.append({**claim, "status": {"allocation": outcome.allocation}})
    return str(present(outcome.allocation)["devices"]["results"][0]["device"])


def _device_names() -> list[str]:
    return [d["name"] for s in SLICES for d in s["spec"].get("devices") or []]


def test_any_mig_device_gets_the_smallest_partition() -> None:
    granted: list[dict[str, Any]] = []
    assert _allocate(_claim("any-mig", MIG_CLASS), granted) == "gpu-0-mig-1g10gb-19-6"
    # The next ones fill GPU 0 from its top, one memory slice at a time.
    assert _allocate(_claim("any-mig-2", MIG_CLASS), granted) == "gpu-0-mig-1g10gb-19-5"


def test_a_large_request_goes_to_an_untouched_gpu() -> None:
    granted: list[dict[str, Any]] = []
    assert _allocate(_claim("small", MIG_CLASS), granted).startswith("gpu-0-mig-1g")
    seven_g = f"device.attributes['{DRIVER_NAME}'].profile == '7g.80gb'"
    assert _allocate(_claim("seven-g", MIG_CLASS, seven_g), granted) == "gpu-1-mig-7g80gb-0-0"
    big = f"device.capacity['{DRIVER_NAME}'].memory.compareTo(quantity('30Gi')) >= 0"
    # The smallest partition with >= 30Gi is a 3g.40gb; GPU 0 still has room for one at 0:4 (the 1g took slice 6),
    # so it lands there and GPUs 2-7 stay untouched.
    assert _allocate(_claim("thirty", MIG_CLASS, big), granted) == "gpu-0-mig-3g40gb-9-0"
    assert _allocate(_claim("whole", DRIVER_NAME), granted) == "gpu-2"


def test_order_within_a_gpu_is_whole_then_smallest_partition_first() -> None:
    names = [n for n in _device_names() if n == "gpu-0" or n.startswith("gpu-0-")]
    assert names[0] == "gpu-0"
    profiles = [n.split("-")[3] for n in names[1:]]
    sizes = {"1g10gb": 0, "1g10gb-me": 1, "1g20gb": 2, "2g20gb": 3, "3g40gb": 4, "4g40gb": 5, "7g80gb": 6}
    assert [sizes[p] for p in profiles] == sorted(sizes[p] for p in profiles)
    one_g = [int(n.rsplit("-", 1)[1]) for n in names if "-1g10gb-19-" in n]
    assert one_g == sorted(one_g, reverse=True)  # placements from the end of the GPU


def test_order_is_deterministic() -> None:
    assert _published_slices() == SLICES
