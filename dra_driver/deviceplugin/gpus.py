"""What the device plugin offers (whole GPUs of the catalog, by UUID) and which of them it prefers together.

Pure: values in, values out. Device IDs are GPU UUIDs, as NVIDIA's device plugin names them by default, so the
kubelet's allocations of a pod started under that plugin still name the same GPUs after a migration
(docs/device-plugin.md "Migrating from NVIDIA's device plugin").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind

WHOLE_GPU_KINDS = frozenset({DeviceKind.GPU, DeviceKind.GPU_CONSUMABLE})


@dataclass(frozen=True)
class OfferedGpu:
    uuid: str
    device_name: str  # the catalog's (and the ResourceSlice's) name, gpu-<minor>
    minor: int
    numa_node: int | None
    pcie_root: str | None
    nvlink_peers: frozenset[str]


def offered_gpus(catalog: Mapping[str, AllocatableDevice]) -> dict[str, OfferedGpu]:
    """GPU UUID -> the whole GPU the catalog offers (a GPU in MIG mode offers no whole GPU, so none here)."""
    offered = {}
    for device in catalog.values():
        if device.kind not in WHOLE_GPU_KINDS:
            continue
        gpu, topology = device.gpu, device.gpu.topology
        offered[gpu.uuid] = OfferedGpu(gpu.uuid, device.name, gpu.info.minor, topology.numa_node,
                                       topology.pcie_root, frozenset(topology.nvlink_peers))  # fmt: skip
    return offered


def gpus_of_devices(catalog: Mapping[str, AllocatableDevice], names: Iterable[str]) -> set[str]:
    """The GPU UUIDs under these catalog device names (a MIG device, a share, a VFIO device: its GPU)."""
    return {catalog[n].gpu.uuid for n in names if n in catalog}


def _closeness(gpus: Sequence[OfferedGpu]) -> tuple[int, int, int]:
    """How well a set of GPUs works together: NVLink-connected pairs, then pairs on one NUMA node, then pairs under
    one PCIe root (higher is better in each; compared in that order)."""
    pairs = list(combinations(gpus, 2))
    nvlink = sum(1 for a, b in pairs if b.uuid in a.nvlink_peers or a.uuid in b.nvlink_peers)
    numa = sum(1 for a, b in pairs if a.numa_node is not None and a.numa_node == b.numa_node)
    pcie = sum(1 for a, b in pairs if a.pcie_root is not None and a.pcie_root == b.pcie_root)
    return nvlink, numa, pcie


def preferred(offered: Mapping[str, OfferedGpu], available: Sequence[str], must_include: Sequence[str],
              size: int) -> list[str]:
    """`size` IDs out of `available`, `must_include` first, grown one GPU at a time by closeness to the chosen ones
    (every available GPU tried as the seed when nothing is required); ties go to the lower minor number. Unknown IDs
    are passed over; fewer than `size` known ones: as many as there are (the kubelet then chooses)."""
    known = [i for i in dict.fromkeys(available) if i in offered]
    required = [i for i in dict.fromkeys(must_include) if i in offered]
    if size <= 0:
        return []
    seeds = [required] if required else [[i] for i in sorted(known, key=lambda i: offered[i].minor)]
    best: list[str] = list(required)
    best_score: tuple[int, int, int] | None = None
    for seed in seeds:
        chosen = _grow(offered, known, seed, size)
        score = _closeness([offered[i] for i in chosen])
        if best_score is None or (len(chosen), score) > (len(best), best_score):
            best, best_score = chosen, score
    return best[:size] if len(best) > size else best


def _grow(offered: Mapping[str, OfferedGpu], known: Sequence[str], seed: Sequence[str], size: int) -> list[str]:
    chosen = list(seed)
    while len(chosen) < size:
        rest = [i for i in known if i not in chosen]
        if not rest:
            break
        nxt = max(rest, key=lambda i: (_closeness([offered[c] for c in [*chosen, i]]), -offered[i].minor))
        chosen.append(nxt)
    return chosen
