"""Inventory -> plain JSON-able dicts (for `dra-driver inventory -o json|yaml`)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any

from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.inventory.model import GpuInventory, NodeInventory


def to_plain(value: Any) -> Any:
    """Dataclasses -> dicts with camelCase keys, enums -> names, tuples -> lists."""
    if is_dataclass(value) and not isinstance(value, type):
        return {_camel(f.name): to_plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    return value


def inventory_document(
    inventory: NodeInventory, devices: Mapping[str, AllocatableDevice] | None = None
) -> dict[str, Any]:
    """With `devices` (the catalog) holding shared devices (`--sharing-mode shares`), each GPU also names
    its `sharedDevice` (null where the GPU is not offered in shares); otherwise the document is unchanged."""
    gpus = [_gpu_document(g) for g in inventory.gpus]
    shared = {d.gpu.uuid: d.name for d in (devices or {}).values() if d.kind.shared}
    if shared:
        for gpu, doc in zip(inventory.gpus, gpus, strict=True):
            doc["sharedDevice"] = shared.get(gpu.uuid)
    return {
        "system": {**to_plain(inventory.system), "cudaVersion": inventory.system.cuda_version},
        # The node's NVLink clique (<clusterUUID>.<cliqueID>) and, when the fabric is not usable, why.
        "clique": to_plain(inventory.clique),
        "gpus": gpus,
    }


def _gpu_document(gpu: GpuInventory) -> dict[str, Any]:
    doc: dict[str, Any] = to_plain(gpu)
    doc["migCapable"] = gpu.mig_capable
    doc["multiprocessors"] = gpu.multiprocessors
    doc["info"]["cudaComputeCapability"] = ".".join(map(str, gpu.info.cuda_compute_capability))
    doc["info"]["pciDeviceId"] = f"0x{gpu.info.pci_device_id:08X}"
    return doc


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)
