"""A resolved fake node: every GPU slot with its identity, locality and wiring, plus pure topology queries.

Built by fake_nodefile from a preset or a YAML file; everything is fixed at construction, so the
backend only looks values up. Runtime state (MIG mode, instances) lives in fake_state instead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dra_driver.nvml.fake.models import GpuModel
from dra_driver.nvml.fake.pci import NO_PCI_SPEC, PciGpu, PciSpec, PciState, initial_pci
from dra_driver.nvml.fake.state import FakeNodeState, GiState, GpuState
from dra_driver.nvml.types import FabricInfo, NvLink, SystemInfo, TopologyLevel


@dataclass(frozen=True)
class GpuSlot:
    """One GPU of a fake node as built from its node file: identity, PCIe and NUMA place, links, initial MIG."""

    index: int
    minor: int
    uuid: str
    bus_id: str  # normalised "0000:1b:00.0"
    serial: str
    numa_node: int
    pcie_root: str  # e.g. "pci0000:1b"
    pcie_switch: int  # GPUs with the same number share a PCIe switch
    model: GpuModel
    nvlinks: tuple[NvLink, ...] = ()
    nvlink_peers: frozenset[int] = frozenset()  # GPU indices reachable by NVLink P2P
    fabric: FabricInfo | None = None
    mig_enabled: bool = False  # initial MIG mode
    instances: tuple[GiState, ...] = ()  # pre-created ("static MIG") instances, ids resolved
    time_slice_supported: bool = True  # False: compute-policy time-slice calls answer NOT_SUPPORTED
    vga: bool = False  # PCI class VGA (display outputs, an HD-audio function .1) rather than 3D controller


@dataclass(frozen=True)
class NodeSpec:
    """A fake node resolved from its node file or preset: its GPUs, system versions and NUMA layout."""

    name: str
    system: SystemInfo
    numa_nodes: tuple[tuple[int, tuple[int, ...]], ...]  # (node id, CPUs), sorted by id
    gpus: tuple[GpuSlot, ...]  # ordered by index
    pci: PciSpec = NO_PCI_SPEC  # the node file's `pci` block

    def slot(self, uuid: str) -> GpuSlot | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)

    def cpus_of(self, numa_node: int) -> tuple[int, ...]:
        return next((cpus for node, cpus in self.numa_nodes if node == numa_node), ())

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(g.uuid for g in self.gpus)

    def initial_pci(self) -> PciState:
        """The PCI functions as the node booted (every GPU bound to nvidia)."""
        return initial_pci(self.pci, tuple(PciGpu(g.bus_id, g.model.pci_device_id >> 16, g.vga) for g in self.gpus))


def pcie_level(a: GpuSlot, b: GpuSlot) -> TopologyLevel:
    """PCIe distance as nvmlDeviceGetTopologyCommonAncestor reports it (NVLink not considered)."""
    if a.index == b.index:
        return TopologyLevel.INTERNAL
    if a.pcie_switch == b.pcie_switch:
        return TopologyLevel.SINGLE
    if a.pcie_root == b.pcie_root:
        return TopologyLevel.HOSTBRIDGE
    if a.numa_node == b.numa_node:
        return TopologyLevel.NODE
    return TopologyLevel.SYSTEM


def initial_state(node: NodeSpec) -> FakeNodeState:
    """The state a freshly booted node has: configured MIG mode and pre-created instances."""
    return FakeNodeState(
        node=node.name,
        gpus=tuple(
            GpuState(uuid=g.uuid, mig_current=g.mig_enabled, mig_pending=g.mig_enabled, gis=g.instances)
            for g in node.gpus
        ),
        pci=node.initial_pci(),
    )


def with_initial_mig(node: NodeSpec, enabled: bool) -> NodeSpec:
    """Override the initial MIG mode of every MIG-capable GPU (the `mig=on|off` backend knob)."""
    if not enabled:
        static = [g.index for g in node.gpus if g.instances]
        if static:
            raise ValueError(f"mig=off: GPUs {static} of node {node.name!r} have pre-created MIG instances")
    return replace(
        node,
        gpus=tuple(replace(g, mig_enabled=enabled) if g.model.mig_capable else g for g in node.gpus),
    )


def with_clique(node: NodeSpec, clique_id: int) -> NodeSpec:
    """Put every GPU of a multi-node NVLink fabric (non-zero cluster UUID) into clique `clique_id` (the `clique=N`
    backend knob: which rack of a GB200 NVL72 cluster the node is in)."""
    if not 0 <= clique_id <= 0xFFFFFFFF:
        raise ValueError(f"clique={clique_id}: a clique id is a 32-bit unsigned number (0..4294967295)")
    if not any(g.fabric is not None and g.fabric.multi_node for g in node.gpus):
        raise ValueError(
            f"clique={clique_id}: node {node.name!r} has no GPU in a multi-node NVLink fabric (no fabric with a "
            "non-zero cluster_uuid); use a preset such as gb200-nvl72 or set fabric.cluster_uuid in the node file"
        )
    return replace(
        node,
        gpus=tuple(
            replace(g, fabric=replace(g.fabric, clique_id=clique_id))
            if g.fabric is not None and g.fabric.multi_node
            else g
            for g in node.gpus
        ),
    )
