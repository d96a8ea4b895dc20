"""The immutable inventory of one node: what the GPUs are, how they connect, and how they can be split."""

from __future__ import annotations

from dataclasses import dataclass

from dra_driver.inventory.fabric import NO_CLIQUE, NodeClique
from dra_driver.nvml.fabricmanager import FabricPartition
from dra_driver.nvml.types import FabricInfo, GpuInfo, GpuInstanceProfile, MigMode, Placement, SystemInfo, VgpuState


@dataclass(frozen=True)
class GpuTopology:
    numa_node: int | None  # closest host NUMA node
    cpu_affinity: tuple[int, ...]
    pcie_root: str | None  # e.g. "pci0000:00"
    nvlink_peers: tuple[str, ...]  # UUIDs this GPU reaches over NVLink (direct or through NVSwitch)
    nvlink_domain: str | None  # shared by every GPU of one NVLink-connected group; None without NVLink
    fabric_clique: str | None  # "<clusterUuid>.<cliqueId>" in a multi-node NVLink fabric
    # Same-socket NUMA nodes nearest to numa_node (KEP-6072's list form), ascending; () when none or unknown.
    numa_neighbours: tuple[int, ...] = ()


@dataclass(frozen=True)
class MigDeviceInventory:
    """A MIG device that exists right now (a GI with a CI), as found on the GPU."""

    uuid: str
    parent_uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: GpuInstanceProfile
    placement: Placement
    memory_bytes: int | None


@dataclass(frozen=True)
class GpuInventory:
    info: GpuInfo
    topology: GpuTopology
    mig_mode: MigMode | None  # None: not MIG-capable
    mig_profiles: tuple[GpuInstanceProfile, ...]  # every GI profile with its possible placements
    mig_devices: tuple[MigDeviceInventory, ...]  # live MIG devices (static MIG)
    memory_slices: int  # memory slices of the MIG geometry (8 on A100/H100/H200, 4 on A30); 0 without MIG
    fabric: FabricInfo | None = None  # NVLink fabric registration; None where the GPU has none (NOT_SUPPORTED)
    vgpu: VgpuState | None = None  # its vGPU types on a vGPU host (docs/vgpu.md); None: no vGPU here

    @property
    def uuid(self) -> str:
        return self.info.uuid

    @property
    def mig_capable(self) -> bool:
        # NVML answers the MIG-mode query only on MIG-capable GPUs. (Profiles may be unreadable while MIG
        # is off on Ampere, so they do not decide capability.)
        return self.mig_mode is not None

    @property
    def mig_enabled(self) -> bool:
        return self.mig_mode is not None and self.mig_mode.current

    @property
    def multiprocessors(self) -> int | None:
        """SM count of the whole GPU; falls back to the largest MIG profile (the full 7g/4g instance)."""
        if self.info.multiprocessors is not None:
            return self.info.multiprocessors
        return max((p.multiprocessors for p in self.mig_profiles), default=None)

    def profile_by_id(self, profile_id: int) -> GpuInstanceProfile | None:
        return next((p for p in self.mig_profiles if p.id == profile_id), None)


@dataclass(frozen=True)
class NodeInventory:
    system: SystemInfo
    gpus: tuple[GpuInventory, ...]
    clique: NodeClique = NO_CLIQUE  # the node's NVLink clique (inventory/fabric.py), from the GPUs' fabric info
    # Fabric Manager's predefined partitions (shared NVSwitch mode; empty where FM does not answer).
    fabric_partitions: tuple[FabricPartition, ...] = ()

    def gpu(self, uuid: str) -> GpuInventory:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise KeyError(f"no GPU with UUID {uuid} on this node")
