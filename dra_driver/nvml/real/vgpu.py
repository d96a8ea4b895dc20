"""A GPU's vGPUs through NVML on a vGPU host (NVIDIA vGPU Manager installed; docs/vgpu.md): the supported and
creatable types (nvmlDeviceGetSupportedVgpus, nvmlDeviceGetCreatableVgpus), each type's name, class, framebuffer and
instances per GPU (nvmlVgpuTypeGetName, …GetClass, …GetFramebufferSize, …GetMaxInstances), and the types of the live
vGPUs (nvmlDeviceGetActiveVgpus, nvmlVgpuInstanceGetType). Stateless: every function takes a pynvml device handle.
"""

from __future__ import annotations

from typing import Any

from dra_driver.nvml.real.calls import nv
from dra_driver.nvml.types import NvmlError, NvmlReturn, VgpuState, VgpuType


def read_vgpu_state(handle: Any) -> VgpuState | None:
    """None where NVML lists no type or cannot answer the first question (NOT_SUPPORTED: no vGPU Manager or a GPU
    without vGPU; any other answer of a bare-metal driver too: discovery of every node reads this, and a node that is
    no vGPU host must not fail on it). A lost GPU still raises."""
    try:
        supported = [int(t) for t in nv("nvmlDeviceGetSupportedVgpus", handle)]
    except NvmlError as exc:
        if exc.code is not NvmlReturn.GPU_IS_LOST:
            return None
        raise
    if not supported:
        return None
    types = tuple(_vgpu_type(handle, t) for t in supported)
    creatable = tuple(int(t) for t in nv("nvmlDeviceGetCreatableVgpus", handle))
    active = tuple(int(nv("nvmlVgpuInstanceGetType", i)) for i in nv("nvmlDeviceGetActiveVgpus", handle))
    return VgpuState(types, creatable, active)


def _vgpu_type(handle: Any, type_id: int) -> VgpuType:
    return VgpuType(
        id=type_id,
        name=str(nv("nvmlVgpuTypeGetName", type_id)),
        type_class=str(nv("nvmlVgpuTypeGetClass", type_id)),
        framebuffer_bytes=int(nv("nvmlVgpuTypeGetFramebufferSize", type_id)),
        max_instances=int(nv("nvmlVgpuTypeGetMaxInstances", handle, type_id)),
    )
