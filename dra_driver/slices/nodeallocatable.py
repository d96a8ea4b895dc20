"""KEP-5517 node allocatable resources (gate DRANodeAllocatableResources, alpha in 1.36 and 1.37), as far as this driver
uses them: an overhead the administrator declares (`--node-allocatable-overhead memory=<q>[,cpu=<q>]`, env
DRA_DRIVER_NODE_ALLOCATABLE_OVERHEAD, none by default) that every pod using one of the node's container devices
costs the node beyond what it requests, e.g. the host memory a CUDA process pins (pure).

Each container device (whole GPU, share, MIG partition) then carries `nodeAllocatableResources: {<name>: {overhead:
{perPod: <q>}}}` (k8s.io/api v0.37.2 resource/v1 `NodeAllocatableOverhead`): kube-scheduler adds it to the pod's
requests once per pod referencing the claim (KEP-5517 with the gate) and the kubelet to the pod's cgroups. Devices
for virtual machines (VFIO, vGPU) carry none: what a VM costs its host is the VM's own business. Nothing is declared
by default: the right figure depends on the application, not on the device, and a wrong one is worse than none
(docs/reference/dra-in-flight.md). The field is sent only where the API server keeps it (k8s/serverfeatures.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from dra_driver.errors import DraDriverError
from dra_driver.inventory.catalog import DeviceKind
from dra_driver.k8s.quantity import QuantityError, parse_quantity

FLAG: Final = "--node-allocatable-overhead"
HELP: Final = (
    "host resources each pod using a GPU, MIG or share device costs the node beyond its requests, as NAME=QUANTITY,... "
    "with NAME cpu, memory or hugepages-<size> (e.g. memory=2Gi,cpu=500m); published as the devices' KEP-5517 "
    "nodeAllocatableResources overhead (perPod) where the API server keeps it (gate DRANodeAllocatableResources, "
    "alpha); none by default"
)
# k8s.io/kubernetes pkg/apis/core/helper IsNodeAllocatableResourceName: cpu, memory, hugepages-<size>.
_NAME: Final = re.compile(r"cpu|memory|hugepages-[0-9]+[a-zA-Z]*")
# The kinds a container uses (VFIO and vGPU devices go to virtual machines).
CONTAINER_KINDS: Final = frozenset(
    {DeviceKind.GPU, DeviceKind.GPU_CONSUMABLE, DeviceKind.GPU_SHARED, DeviceKind.MIG_STATIC, DeviceKind.MIG_DYNAMIC}
)
NO_OVERHEAD: Final[Mapping[str, str]] = MappingProxyType({})


class OverheadError(DraDriverError, ValueError):
    """A `--node-allocatable-overhead` value that is not NAME=QUANTITY,...; the message names the flag and the fix."""


def parse_overhead(text: str) -> Mapping[str, str]:
    """`memory=2Gi,cpu=500m` -> {"cpu": "500m", "memory": "2Gi"} (canonical quantities, as the API server stores
    them, so the published slice never differs from the stored one); "" or "none" -> none."""
    if text.strip() in ("", "none"):
        return NO_OVERHEAD
    out: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise OverheadError(f"{FLAG}: {item!r} is not NAME=QUANTITY (e.g. memory=2Gi,cpu=500m)")
        if not _NAME.fullmatch(name):
            raise OverheadError(f"{FLAG}: {name!r} is not a node allocatable resource; use cpu, memory or "
                                "hugepages-<size>")
        if name in out:
            raise OverheadError(f"{FLAG}: {name} is given twice")
        try:
            quantity = parse_quantity(value)
        except QuantityError as exc:
            raise OverheadError(f"{FLAG}: {name}={value}: {exc}") from exc
        if quantity.sign() < 0:
            raise OverheadError(f"{FLAG}: {name}={value} is negative; an overhead is zero or more")
        out[name] = str(quantity)
    return MappingProxyType(dict(sorted(out.items())))


def node_allocatable(kind: DeviceKind, overhead: Mapping[str, str]) -> dict[str, Any] | None:
    """The device's `nodeAllocatableResources`, or None (nothing declared, or a device for a VM)."""
    if not overhead or kind not in CONTAINER_KINDS:
        return None
    return {name: {"overhead": {"perPod": value}} for name, value in overhead.items()}
