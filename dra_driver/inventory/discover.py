"""NVML backend -> NodeInventory. All hardware access goes through the passed-in backend."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TypeVar

from dra_driver.inventory.fabric import node_clique
from dra_driver.inventory.model import GpuInventory, GpuTopology, MigDeviceInventory, NodeInventory
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.fabricmanager import FabricManagerError, FabricPartition
from dra_driver.nvml.types import GpuInfo, GpuInstanceProfile, NvmlError, NvmlReturn

# NVML codes that mean "this GPU cannot tell" rather than "something is broken".
T = TypeVar("T")

_UNANSWERABLE = {NvmlReturn.NOT_SUPPORTED, NvmlReturn.NOT_FOUND, NvmlReturn.FUNCTION_NOT_FOUND}


def discover(backend: NvmlBackend) -> NodeInventory:
    """Read the node's GPUs, topology and MIG state. The backend must already be initialised."""
    system = backend.system_info()
    infos = backend.gpus()
    peers = {info.uuid: _nvlink_peers(backend, info, infos) for info in infos}
    domains = nvlink_domains(peers)
    gpus = tuple(_discover_gpu(backend, info, peers[info.uuid], domains.get(info.uuid)) for info in infos)
    return NodeInventory(system=system, gpus=gpus, clique=node_clique(gpus), fabric_partitions=_partitions(backend))


def _partitions(backend: NvmlBackend) -> tuple[FabricPartition, ...]:
    """Fabric Manager's partitions; none where FM does not answer (no SDK, not in shared NVSwitch mode)."""
    try:
        return backend.fabric_manager().supported_partitions()
    except (FabricManagerError, NvmlError):
        return ()


def nvlink_domains(peers: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """Connected components of the NVLink graph, each named after its lowest-sorted member UUID.

    GPUs without any NVLink peer get no domain, so a `matchAttribute` on the domain never pairs them.
    """
    parent = {uuid: uuid for uuid in peers}

    def find(u: str) -> str:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    for uuid, linked in peers.items():
        for other in linked:
            if other in parent:
                a, b = find(uuid), find(other)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    return {uuid: f"nvlink-{find(uuid)}" for uuid, linked in peers.items() if linked}


def _nvlink_peers(backend: NvmlBackend, info: GpuInfo, infos: list[GpuInfo]) -> tuple[str, ...]:
    if not _tolerant(lambda: bool(backend.nvlinks(info.uuid)), False):
        return ()
    peers = []
    for other in infos:
        if other.uuid == info.uuid:
            continue
        if _tolerant(partial(backend.nvlink_p2p_ok, info.uuid, other.uuid), False):
            peers.append(other.uuid)
    return tuple(peers)


def _discover_gpu(backend: NvmlBackend, info: GpuInfo, peers: tuple[str, ...], domain: str | None) -> GpuInventory:
    fabric = _tolerant(lambda: backend.fabric_info(info.uuid), None)
    numa_node = _tolerant(lambda: backend.numa_node(info.uuid), None)
    topology = GpuTopology(
        numa_node=numa_node,
        cpu_affinity=_tolerant(lambda: backend.cpu_affinity(info.uuid), ()),
        pcie_root=_tolerant(lambda: backend.pcie_root(info.uuid), None),
        nvlink_peers=peers,
        nvlink_domain=(fabric.clique if fabric is not None and fabric.clique else domain),
        fabric_clique=fabric.clique if fabric is not None else None,
        numa_neighbours=() if numa_node is None else _tolerant(lambda: backend.numa_neighbours(numa_node), ()),
    )
    mig_mode = _tolerant(lambda: backend.mig_mode(info.uuid), None)
    profiles: tuple[GpuInstanceProfile, ...] = ()
    mig_devices: tuple[MigDeviceInventory, ...] = ()
    if mig_mode is not None:
        no_profiles: list[GpuInstanceProfile] = []
        listed = _tolerant(lambda: backend.gpu_instance_profiles(info.uuid), no_profiles)
        profiles = tuple(sorted(listed, key=lambda p: p.index))
        if mig_mode.current:
            mig_devices = _live_mig_devices(backend, info.uuid, profiles)
    memory_slices = max((pl.start + pl.size for p in profiles for pl in p.placements), default=0)
    return GpuInventory(
        info=info,
        topology=topology,
        mig_mode=mig_mode,
        mig_profiles=profiles,
        mig_devices=mig_devices,
        memory_slices=memory_slices,
        fabric=fabric,
        vgpu=_tolerant(lambda: backend.vgpu_state(info.uuid), None),
    )


def _live_mig_devices(
    backend: NvmlBackend, gpu_uuid: str, profiles: tuple[GpuInstanceProfile, ...]
) -> tuple[MigDeviceInventory, ...]:
    by_id = {p.id: p for p in profiles}
    instances = {gi.id: gi for gi in backend.gpu_instances(gpu_uuid)}
    found = []
    for dev in backend.mig_devices(gpu_uuid):
        gi = instances.get(dev.gpu_instance_id)
        profile = by_id.get(gi.profile_id) if gi is not None else None
        if gi is None or profile is None:
            # A MIG device whose GI vanished between the two reads, or of a profile we do not model.
            continue
        found.append(
            MigDeviceInventory(
                uuid=dev.uuid,
                parent_uuid=gpu_uuid,
                gpu_instance_id=dev.gpu_instance_id,
                compute_instance_id=dev.compute_instance_id,
                profile=profile,
                placement=gi.placement,
                memory_bytes=dev.memory_bytes,
            )
        )
    return tuple(sorted(found, key=lambda d: (d.placement.start, d.profile.id, d.compute_instance_id)))


def _tolerant(read: Callable[[], T], fallback: T) -> T:
    """Optional facts: a GPU that cannot answer (NOT_SUPPORTED & co.) gets the fallback."""
    try:
        return read()
    except NvmlError as exc:
        if exc.code in _UNANSWERABLE:
            return fallback
        raise
