"""The fake node's vGPUs with NVML's and NVIDIA's per-VF sysfs rules (docs/vgpu.md, docs/fake-nvml.md "vGPU").

On with the fake knob `vgpu=true` (NVIDIA vGPU Manager installed on the host). Then every GPU of the Ampere
architecture or later supports four time-sliced Compute types, the whole GPU and its half, quarter and eighth
("NVIDIA A100-40C", "-20C", "-10C", "-5C": 1, 2, 4, 8 instances), and has eight SR-IOV virtual functions,
`<bus>:<dev>.<fn>` from function 4 of its own slot on (`00.4` … `01.3`), each in an IOMMU group of its own.

The rules (pure functions on values; the state holds the type id of each VF that has one):
- a GPU in MIG mode, or not bound to nvidia (passed through: bound to vfio-pci), creates no vGPU;
- a GPU hosts one type at a time: once a VF has type T, T is the only creatable type until the last vGPU is gone,
  and only while fewer than T's max instances exist;
- writing a type to a VF that has one fails EBUSY; a type the VF cannot create now (not in its
  creatable_vgpu_types: another type on the GPU, the GPU full, in MIG mode, unsupported) fails EINVAL; writing 0
  destroys (0 on a VF without a type is a no-op).

With the knob `vgpu_mdev=true` as well, the GPUs are mediated-device parents instead (as GPUs before Ampere, and
older vGPU releases, are): no VFs; `mdev_supported_types/nvidia-<type id>` per type, `available_instances` the
type's instances left while the GPU can create it (else 0); creating with a UUID in use fails EEXIST (the kernel's
mdev core), a type with no instance available EINVAL; removing an unknown UUID ENOENT. Each mdev gets the lowest
free IOMMU group from 400 on.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass, replace

from dra_driver.nvml.fake.models import GpuModel
from dra_driver.nvml.fake.node import GpuSlot, NodeSpec
from dra_driver.nvml.fake.pci import NVIDIA, FakePciError
from dra_driver.nvml.fake.state import FakeNodeState
from dra_driver.nvml.fake.store import StateStore
from dra_driver.nvml.types import Architecture, VgpuState, VgpuType
from dra_driver.pci.model import PciError
from dra_driver.pci.vgpu import NO_VGPU_TYPE, Mdev, MdevType, VirtualFunction, mdev_type_dir

MIB = 1024 * 1024
VF_COUNT = 8
FIRST_VF_FUNCTION = 4  # NVIDIA GPUs put their VFs after the PF's own functions
SPLITS = (1, 2, 4, 8)  # instances per GPU of the fake's types
TYPE_ID_BASE = 900  # type ids: 901, 902, 904, 908 (the real ones are the driver's, per board)
FIRST_VF_GROUP = 300  # IOMMU groups of the VFs: 300 + 8 * GPU index + VF number
FIRST_VFIO_DEV = 100  # /dev/vfio/devices/vfio<N> of a VF with a vGPU
FIRST_MDEV_GROUP = 400  # IOMMU groups of mediated devices


@dataclass(frozen=True)
class FakeVf:
    """An SR-IOV virtual function of a fake vGPU-capable GPU."""

    gpu_uuid: str
    address: str
    iommu_group: int
    vfio_dev: int


def supported_types(model: GpuModel) -> tuple[VgpuType, ...]:
    """The fake's vGPU types of a model: none before Ampere (those boards use mdev, which the fake does not model)."""
    if not Architecture.AMPERE <= model.architecture < Architecture.UNKNOWN:
        return ()
    short = model.key.split("-")[0]
    out = []
    for split in SPLITS:
        framebuffer_mib = model.memory_mib // split
        out.append(VgpuType(
            id=TYPE_ID_BASE + split,
            name=f"NVIDIA {short}-{round(model.memory_mib / 1024 / split)}C",  # NVIDIA names types by nominal GB
            type_class="Compute",
            framebuffer_bytes=framebuffer_mib * MIB,
            max_instances=split,
        ))  # fmt: skip
    return tuple(out)


def virtual_functions(slot: GpuSlot) -> tuple[FakeVf, ...]:
    domain_bus, device_function = slot.bus_id.rsplit(":", 1)
    device = int(device_function.split(".")[0], 16)
    out = []
    for n in range(VF_COUNT):
        number = FIRST_VF_FUNCTION + n
        address = f"{domain_bus}:{device + number // 8:02x}.{number % 8}"
        group = FIRST_VF_GROUP + VF_COUNT * slot.index + n
        out.append(FakeVf(slot.uuid, address, group, FIRST_VFIO_DEV + VF_COUNT * slot.index + n))
    return tuple(out)


def type_of(state: FakeNodeState, address: str) -> int:
    return next((t for a, t in state.vgpu if a == address), NO_VGPU_TYPE)


def live_types(state: FakeNodeState, slot: GpuSlot) -> tuple[int, ...]:
    on_vfs = tuple(t for vf in virtual_functions(slot) if (t := type_of(state, vf.address)) != NO_VGPU_TYPE)
    return on_vfs + tuple(t for _, gpu, t, _ in state.mdevs if gpu == slot.bus_id)


def creatable(node: NodeSpec, state: FakeNodeState, slot: GpuSlot) -> tuple[int, ...]:
    """What the GPU can create now (nvmlDeviceGetCreatableVgpus; every free VF's creatable_vgpu_types)."""
    types = supported_types(slot.model)
    pci = state.pci if state.pci is not None else node.initial_pci()
    if not types or state.gpu(slot.uuid).mig_current or pci.driver_of(slot.bus_id) != NVIDIA:
        return ()
    live = live_types(state, slot)
    if not live:
        return tuple(t.id for t in types)
    held = next(t for t in types if t.id == live[0])
    return (held.id,) if len(live) < held.max_instances else ()


def vgpus_of(node: NodeSpec, state: FakeNodeState, slot: GpuSlot) -> VgpuState | None:
    types = supported_types(slot.model)
    if not types:
        return None
    return VgpuState(types, creatable(node, state, slot), live_types(state, slot))


def set_type(node: NodeSpec, state: FakeNodeState, address: str, type_id: int) -> FakeNodeState:
    """`echo <type_id> > <vf>/nvidia/current_vgpu_type`; raises FakePciError with the driver's errno."""
    found = next(((s, vf) for s in node.gpus for vf in virtual_functions(s) if vf.address == address), None)
    if found is None or not supported_types(found[0].model):
        raise FakePciError(errno.ENOENT, f"no virtual function {address} with nvidia/current_vgpu_type")
    slot, _ = found
    rest = tuple((a, t) for a, t in state.vgpu if a != address)
    current = type_of(state, address)
    if type_id == NO_VGPU_TYPE:
        return replace(state, vgpu=rest)
    if current != NO_VGPU_TYPE:
        raise FakePciError(errno.EBUSY, f"virtual function {address} already has vGPU type {current}")
    if type_id not in creatable(node, state, slot):
        raise FakePciError(errno.EINVAL, f"vGPU type {type_id} is not in creatable_vgpu_types of {address}")
    return replace(state, vgpu=tuple(sorted((*rest, (address, type_id)))))


def create_mdev(node: NodeSpec, state: FakeNodeState, gpu: str, type_dir: str, uuid: str) -> FakeNodeState:
    """`echo <uuid> > <gpu>/mdev_supported_types/<type_dir>/create`; raises FakePciError with the errno."""
    slot = next((g for g in node.gpus if g.bus_id == gpu), None)
    types = supported_types(slot.model) if slot is not None else ()
    vgpu_type = next((t for t in types if mdev_type_dir(t.id) == type_dir), None)
    if slot is None or vgpu_type is None:
        raise FakePciError(errno.ENOENT, f"no mediated-device type {type_dir} on {gpu}")
    if any(u == uuid for u, *_ in state.mdevs):
        raise FakePciError(errno.EEXIST, f"a mediated device {uuid} exists")
    if vgpu_type.id not in creatable(node, state, slot):
        raise FakePciError(errno.EINVAL, f"no instance of {type_dir} available on {gpu}")
    used = {group for *_, group in state.mdevs}
    group = next(g for g in range(FIRST_MDEV_GROUP, FIRST_MDEV_GROUP + 1 + len(used)) if g not in used)
    return replace(state, mdevs=tuple(sorted((*state.mdevs, (uuid, gpu, vgpu_type.id, group)))))


def remove_mdev(state: FakeNodeState, uuid: str) -> FakeNodeState:
    if not any(u == uuid for u, *_ in state.mdevs):
        raise FakePciError(errno.ENOENT, f"no mediated device {uuid}")
    return replace(state, mdevs=tuple(m for m in state.mdevs if m[0] != uuid))


class FakeVgpuSysfs:
    """The VgpuSysfs of a fake node, over the same state (file) as its GPUs and PCI functions. `mdev`: the GPUs are
    mediated-device parents, not SR-IOV GPUs."""

    def __init__(self, store: StateStore, node: NodeSpec, enabled: bool, mdev: bool = False) -> None:
        self._store = store
        self._node = node
        self._enabled = enabled
        self._mdev = mdev

    def virtual_functions(self, pf_address: str) -> tuple[VirtualFunction, ...]:
        slot = next((g for g in self._node.gpus if g.bus_id == pf_address), None)
        if not self._enabled or self._mdev or slot is None or not supported_types(slot.model):
            return ()
        state = self._store.snapshot()
        free = creatable(self._node, state, slot)
        out = []
        for vf in virtual_functions(slot):
            current = type_of(state, vf.address)
            out.append(VirtualFunction(
                address=vf.address,
                iommu_group=vf.iommu_group,
                current_type=current,
                creatable=free if current == NO_VGPU_TYPE else (),
                vfio_dev=f"vfio{vf.vfio_dev}" if current != NO_VGPU_TYPE else None,
            ))  # fmt: skip
        return tuple(out)

    def set_vgpu_type(self, vf_address: str, type_id: int) -> None:
        if not self._enabled:
            raise PciError(f"no virtual function {vf_address}: the fake has no vGPU Manager (knob vgpu=true)",
                           errno=errno.ENOENT)  # fmt: skip

        def apply(state: FakeNodeState) -> tuple[FakeNodeState, None]:
            try:
                return set_type(self._node, state, vf_address, type_id), None
            except FakePciError as exc:
                raise PciError(
                    f"writing {type_id} to {vf_address}/nvidia/current_vgpu_type failed: {exc} (errno {exc.errno})",
                    errno=exc.errno,
                ) from None

        self._store.update(apply)

    def mdev_types(self, gpu_address: str) -> tuple[MdevType, ...]:
        slot = next((g for g in self._node.gpus if g.bus_id == gpu_address), None)
        if not (self._enabled and self._mdev) or slot is None:
            return ()
        state = self._store.snapshot()
        free = creatable(self._node, state, slot)
        live = live_types(state, slot)
        return tuple(
            MdevType(mdev_type_dir(t.id), t.name, t.max_instances - live.count(t.id) if t.id in free else 0)
            for t in supported_types(slot.model)
        )

    def mdev(self, uuid: str) -> Mdev | None:
        found = next((m for m in self._store.snapshot().mdevs if m[0] == uuid), None)
        if found is None:
            return None
        _, gpu, type_id, group = found
        return Mdev(uuid, gpu, mdev_type_dir(type_id), group)

    def create_mdev(self, gpu_address: str, type_dir: str, uuid: str) -> None:
        self._change(f"writing {uuid} to {gpu_address}/mdev_supported_types/{type_dir}/create",
                     lambda s: create_mdev(self._node, s, gpu_address, type_dir, uuid))  # fmt: skip

    def remove_mdev(self, uuid: str) -> None:
        self._change(f"writing 1 to the remove of mediated device {uuid}", lambda s: remove_mdev(s, uuid))

    def _change(self, what: str, change: Callable[[FakeNodeState], FakeNodeState]) -> None:
        if not (self._enabled and self._mdev):
            raise PciError(f"{what} failed: the fake's GPUs are no mdev parents (knobs vgpu=true,vgpu_mdev=true)",
                           errno=errno.ENOENT)  # fmt: skip

        def apply(state: FakeNodeState) -> tuple[FakeNodeState, None]:
            try:
                return change(state), None
            except FakePciError as exc:
                raise PciError(f"{what} failed: {exc} (errno {exc.errno})", errno=exc.errno) from None

        self._store.update(apply)
