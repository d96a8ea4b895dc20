"""The nodes both schedulers see: Node objects, the ResourceSlices the driver renders for them, the DeviceClasses.

Each node has a *shape*: a fake NVML node (`nodes/*.yaml` here, or a preset) rendered by the product's own inventory
and slice builder (`dra_driver.inventory`, `dra_driver.slices.builder`), exactly what its kubelet plugin would
publish on Kubernetes 1.37, plus node taints and device taints the suite adds to test tolerations (the plugin adds
device taints only for unhealthy GPUs). No kubelet runs: the Node is created through the API as a registered,
Ready kubelet would have left it, and pods bound to it never run.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.sharing import EXCLUSIVE, sharing_settings
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.kubelet.nodestatus import ready_node

NODES_DIR: Final = Path(__file__).resolve().parent / "nodes"
KUBE_VERSION: Final = (1, 37)
SHAPE_LABEL: Final = "differential.dra.dev/shape"
NODE_TAINT: Final = {"key": "differential.dra.dev/maintenance", "value": "planned", "effect": "NoSchedule"}
DEVICE_TAINT: Final = {"key": f"{DRIVER_NAME}/xid", "value": "79", "effect": "NoSchedule"}
CONFIG_CLASS: Final = f"configured.{DRIVER_NAME}"
OTHER_DRIVER: Final = "other.example.com"
OTHER_CLASS: Final = f"gpu.{OTHER_DRIVER}"
# The class's config entry (source FromClass in an allocation); the parameters are opaque to Kubernetes.
CLASS_CONFIG: Final = {"opaque": {"driver": DRIVER_NAME, "parameters": {
    "apiVersion": "gpu.dra.dev/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}}}


@dataclass(frozen=True)
class Shape:
    name: str  # short, part of node names
    nvml: str  # a preset or a node file under nodes/
    mig: MigOffering = MigOffering.NONE
    consumable: str = "disabled"  # --consumable-shares
    node_taints: tuple[Mapping[str, str], ...] = ()
    device_taints: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # device name -> its taint


SHAPES: Final = (
    # Whole GPUs and every MIG placement, with the per-GPU counter sets (partitionable devices).
    Shape("h100", str(NODES_DIR / "h100x2.yaml"), mig=MigOffering.DYNAMIC),
    # Two whole GPUs, nothing else.
    Shape("l4", "l4x2"),
    # Two whole GPUs behind a node taint; gpu-0 carries a device taint.
    Shape("taint", "l4x2", node_taints=(NODE_TAINT,), device_taints={"gpu-0": DEVICE_TAINT}),
    # Whole GPUs as consumable capacity (allowMultipleAllocations, memory with a request policy).
    Shape("share", str(NODES_DIR / "a100x2.yaml"), consumable="memory"),
)
SHAPE_NAMES: Final = tuple(s.name for s in SHAPES)


def _render(shape: Shape, node: str) -> list[dict[str, Any]]:
    backend = open_backend(f"fake:{shape.nvml}")
    backend.init()
    try:
        inventory = discover(backend)
    finally:
        backend.shutdown()
    sharing = EXCLUSIVE
    if shape.consumable != "disabled":
        sharing = sharing_settings("exclusive", consumable=shape.consumable)
    devices = catalog(inventory, shape.mig, sharing)
    settings = SliceSettings(DRIVER_NAME, node, kube_version=KUBE_VERSION, sharing=sharing)
    slices = build_slices(inventory.system, devices, settings, generation=1)
    for obj in slices:
        for device in obj["spec"].get("devices", []):
            taint = shape.device_taints.get(device["name"])
            if taint:
                device["taints"] = [dict(taint)]
    return slices


class Fleet:
    """Renders each shape once (under a placeholder node name) and hands out copies for real node names."""

    TEMPLATE_NODE: Final = "template-node"

    def __init__(self) -> None:
        self._templates = {shape.name: _render(shape, self.TEMPLATE_NODE) for shape in SHAPES}
        self._shapes = {shape.name: shape for shape in SHAPES}
        self._node = ready_node(self.TEMPLATE_NODE, now=0.0)
        self._node.pop("status", None)

    def node(self, name: str, shape: str) -> dict[str, Any]:
        """The Node as its kubelet registers it, without status (set after the create, as a kubelet does)."""
        obj = copy.deepcopy(self._node)
        obj["metadata"]["name"] = name
        obj["metadata"]["labels"].update({"kubernetes.io/hostname": name, SHAPE_LABEL: shape})
        taints = [dict(t) for t in self._shapes[shape].node_taints]
        if taints:
            obj.setdefault("spec", {})["taints"] = taints
        return obj

    def node_status(self, name: str) -> dict[str, Any]:
        """A Ready kubelet's status, heartbeat now (the addresses are the template node's)."""
        out = ready_node(self.TEMPLATE_NODE)["status"]
        out["addresses"] = [a if a.get("type") != "Hostname" else {**a, "address": name}
                            for a in out.get("addresses") or []]
        return dict(out)

    def slices(self, node: str, shape: str) -> list[dict[str, Any]]:
        out = []
        for template in self._templates[shape]:
            obj = copy.deepcopy(template)
            obj["metadata"]["name"] = obj["metadata"]["name"].replace(self.TEMPLATE_NODE, node, 1)
            obj["spec"]["nodeName"] = node
            obj["spec"]["pool"]["name"] = node
            out.append(obj)
        return out


def classes() -> list[dict[str, Any]]:
    """The chart's DeviceClasses (the whole-GPU class mapping the extended resource `gpu.dra.dev/gpu`), a class
    with a config entry, and a class for a driver nobody runs."""
    out = device_classes(DRIVER_NAME, extended_resource=True)
    out.append({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": CONFIG_CLASS},
                "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER_NAME}' && "
                                                              f"device.attributes['{DRIVER_NAME}'].type == 'gpu'"}}],
                         "config": [copy.deepcopy(CLASS_CONFIG)]}})
    out.append({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": OTHER_CLASS},
                "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{OTHER_DRIVER}'"}}]}})
    return out
