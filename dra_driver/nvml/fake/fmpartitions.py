"""The fake node's Fabric Manager in shared-NVSwitch mode (docs/passthrough.md "Fabric Manager partitions").

On with the fake knob `fabric_partitions=true` (FM running with FABRIC_MODE=1 on an NVSwitch baseboard such as the
dgx-h100 preset's); off, every call answers FM_ST_NOT_SUPPORTED as an FM in bare-metal mode does.

The partitions are FM's predefined table for the baseboard, built as the HGX tables of NVIDIA's Fabric Manager user
guide are laid out: id 0 holds every GPU, then the halves, the quarters … down to one GPU each (8 GPUs: 15 partitions:
1 of 8, 2 of 4, 4 of 2, 8 of 1). A GPU's physical id is its index + 1 (the baseboard's module id).

The rules (pure functions on values; the state holds the ids of the active partitions):
- activate an unknown id: FM_ST_BADPARAM; an active one, or one sharing a GPU with an active one: FM_ST_IN_USE;
  one with a GPU the host's nvidia driver still holds (not bound to a vfio driver): FM_ST_IN_USE;
- deactivate an unknown id: FM_ST_BADPARAM; one not active: FM_ST_UNINITIALIZED;
- set the activated list (after an FM restart): an unknown id or two overlapping partitions: FM_ST_BADPARAM.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from dra_driver.nvml.fabricmanager import FabricManagerError, FabricPartition, FmReturn, PartitionGpu
from dra_driver.nvml.fake.node import GpuSlot, NodeSpec
from dra_driver.nvml.fake.state import FakeNodeState
from dra_driver.nvml.fake.store import StateStore
from dra_driver.pci.model import is_vfio_driver

NOT_SHARED_MODE = "Fabric Manager is not in shared NVSwitch mode (FABRIC_MODE=1) on this node"


def partition_table(node: NodeSpec) -> tuple[tuple[int, tuple[GpuSlot, ...]], ...]:
    """(id, GPUs) of every predefined partition: the whole board, then each half, quarter … one GPU."""
    gpus = tuple(node.gpus)
    out: list[tuple[int, tuple[GpuSlot, ...]]] = []
    size = len(gpus)
    while size >= 1 and gpus:
        for start in range(0, len(gpus) - size + 1, size):
            out.append((len(out), gpus[start : start + size]))
        size //= 2
    return tuple(out)


def partitions(node: NodeSpec, state: FakeNodeState) -> tuple[FabricPartition, ...]:
    return tuple(
        FabricPartition(pid, pid in state.fm_active, tuple(_gpu(slot) for slot in slots))
        for pid, slots in partition_table(node)
    )


def _gpu(slot: GpuSlot) -> PartitionGpu:
    domain, address = slot.bus_id.split(":", 1)
    return PartitionGpu(slot.index + 1, slot.uuid, f"{int(domain, 16):08X}:{address.upper()}", len(slot.nvlinks))


def _members(node: NodeSpec, pid: int) -> frozenset[str]:
    for known, slots in partition_table(node):
        if known == pid:
            return frozenset(s.uuid for s in slots)
    raise FabricManagerError(FmReturn.BADPARAM, f"no fabric partition {pid}")


def activate(node: NodeSpec, state: FakeNodeState, pid: int) -> FakeNodeState:
    mine = _members(node, pid)
    if pid in state.fm_active:
        raise FabricManagerError(FmReturn.IN_USE, f"fabric partition {pid} is already active")
    for other in state.fm_active:
        if _members(node, other) & mine:
            raise FabricManagerError(
                FmReturn.IN_USE, f"fabric partition {pid} shares GPUs with active partition {other}"
            )
    pci = state.pci if state.pci is not None else node.initial_pci()
    for slot in node.gpus:
        driver = pci.driver_of(slot.bus_id)
        if slot.uuid in mine and not (driver and is_vfio_driver(driver)):
            raise FabricManagerError(
                FmReturn.IN_USE,
                f"GPU {slot.bus_id} of fabric partition {pid} is bound to {driver or 'no driver'}, not a vfio driver",
            )
    return replace(state, fm_active=tuple(sorted({*state.fm_active, pid})))


def deactivate(node: NodeSpec, state: FakeNodeState, pid: int) -> FakeNodeState:
    _members(node, pid)
    if pid not in state.fm_active:
        raise FabricManagerError(FmReturn.UNINITIALIZED, f"fabric partition {pid} is not active")
    return replace(state, fm_active=tuple(p for p in state.fm_active if p != pid))


def set_activated(node: NodeSpec, state: FakeNodeState, pids: tuple[int, ...]) -> FakeNodeState:
    seen: frozenset[str] = frozenset()
    for pid in pids:
        members = _members(node, pid)
        if members & seen:
            raise FabricManagerError(FmReturn.BADPARAM, f"fabric partition {pid} overlaps another in the list")
        seen |= members
    return replace(state, fm_active=tuple(sorted(set(pids))))


class FakeFabricManager:
    """The `FabricManager` of a fake node, over the same state (file) as its GPUs and PCI functions."""

    def __init__(self, store: StateStore, node: NodeSpec, enabled: bool) -> None:
        self._store = store
        self._node = node
        self._enabled = enabled

    def supported_partitions(self) -> tuple[FabricPartition, ...]:
        self._check()
        return partitions(self._node, self._store.snapshot())

    def activate(self, partition_id: int) -> None:
        self._change(lambda s: activate(self._node, s, partition_id))

    def deactivate(self, partition_id: int) -> None:
        self._change(lambda s: deactivate(self._node, s, partition_id))

    def set_activated(self, partition_ids: tuple[int, ...]) -> None:
        self._change(lambda s: set_activated(self._node, s, partition_ids))

    def restart(self) -> None:
        """FM restarted without `--restart` (shared NVSwitch mode activates no partition at start): none is active,
        whatever VMs still run on the GPUs. A test's and the bench's control; no FM call does this."""
        self._change(lambda s: replace(s, fm_active=()))

    def _check(self) -> None:
        if not self._enabled:
            raise FabricManagerError(FmReturn.NOT_SUPPORTED, NOT_SHARED_MODE)

    def _change(self, change: Callable[[FakeNodeState], FakeNodeState]) -> None:
        self._check()

        def apply(state: FakeNodeState) -> tuple[FakeNodeState, None]:
            return change(state), None

        self._store.update(apply)
