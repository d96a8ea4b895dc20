"""MIG over pynvml, per parent-GPU handle: mode, GI/CI profiles and placements, create/destroy/list, MIG devices.

Two numbers are easy to confuse and are kept apart here: the profile INDEX (the
NVML_GPU_INSTANCE_PROFILE_* constant, only passed to nvmlDeviceGetGpuInstanceProfileInfo) and the
profile ID (`info.id`, used by every other call and shown by `nvidia-smi mig -lgip`).
Stateless: the caller (real.py) resolves UUIDs to handles.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pynvml

from dra_driver.nvml.profile_name import GI_SLICES_BY_INDEX, mig_profile_name
from dra_driver.nvml.real.calls import fill, nv
from dra_driver.nvml.real.device import memory_total
from dra_driver.nvml.types import (
    ComputeInstance,
    ComputeInstanceProfile,
    GpuInstance,
    GpuInstanceProfile,
    MigDevice,
    MigMode,
    NvmlError,
    NvmlReturn,
    Placement,
)

MIG_ENABLE = 1
MIG_DISABLE = 0
COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0

# Profile enumeration: NOT_SUPPORTED = this GPU lacks the profile; INVALID_ARGUMENT = index unknown to
# this driver. Both are skipped rather than ending the walk, since the index range has gaps (GFX/NO_ME).
_SKIP_PROFILE = frozenset({NvmlReturn.NOT_SUPPORTED, NvmlReturn.INVALID_ARGUMENT})
# nvmlDeviceGetMigDeviceHandleByIndex on an empty slot.
_EMPTY_MIG_SLOT = frozenset({NvmlReturn.NOT_FOUND, NvmlReturn.INVALID_ARGUMENT})


def mig_mode(handle: Any) -> MigMode | None:
    try:
        current, pending = nv("nvmlDeviceGetMigMode", handle)
    except NvmlError as err:
        if err.code is NvmlReturn.NOT_SUPPORTED:
            return None  # not MIG-capable
        raise
    return MigMode(current=bool(current), pending=bool(pending))


def set_mig_mode(handle: Any, enabled: bool) -> NvmlReturn:
    # NVML hands the activation status back instead of raising it: IN_USE / RESET_REQUIRED mean the
    # request was taken but the mode is pending. Only the request's own failure raises.
    status = nv("nvmlDeviceSetMigMode", handle, MIG_ENABLE if enabled else MIG_DISABLE)
    return NvmlReturn.from_code(int(status))


def _answered(count: int, ask: Callable[[int], Any], absent: frozenset[NvmlReturn]) -> list[tuple[int, Any]]:
    """(index, answer) for each index below `count` that `ask` answers; an index whose call fails with a code of
    `absent` has nothing there (no such profile, an empty slot) and is left out; any other failure is raised."""
    out: list[tuple[int, Any]] = []
    for index in range(count):
        try:
            out.append((index, ask(index)))
        except NvmlError as err:
            if err.code not in absent:
                raise
    return out


def gi_profile_infos(handle: Any) -> list[tuple[int, Any]]:
    """(profile INDEX, v2 info struct) for every profile the GPU answers for."""
    return _answered(int(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT),
                     lambda index: nv("nvmlDeviceGetGpuInstanceProfileInfo", handle, index), _SKIP_PROFILE)


def profile_name(index: int, info: Any, device_memory_bytes: int | None) -> str:
    if device_memory_bytes and index in GI_SLICES_BY_INDEX:
        return mig_profile_name(index, int(info.memorySizeMB), device_memory_bytes)
    # No GPU memory total, or a profile index newer than the formula: NVML's own label ("MIG 1g.10gb").
    return str(info.name).strip().removeprefix("MIG ").strip()


def possible_placements(handle: Any, profile_id: int, instance_count: int) -> tuple[Placement, ...]:
    try:
        raw = fill(
            "nvmlDeviceGetGpuInstancePossiblePlacements",
            pynvml.c_nvmlGpuInstancePlacement_t,
            instance_count,
            handle,
            profile_id,
        )
    except NvmlError as err:
        if err.code is NvmlReturn.NOT_SUPPORTED:
            return ()
        raise
    return tuple(sorted((Placement(int(p.start), int(p.size)) for p in raw), key=lambda p: p.start))


def gpu_instance_profiles(handle: Any) -> list[GpuInstanceProfile]:
    infos = gi_profile_infos(handle)
    if not infos:
        return []
    total = memory_total(handle)
    return [
        GpuInstanceProfile(
            index=index,
            id=int(info.id),
            name=profile_name(index, info, total),
            slice_count=int(info.sliceCount),
            instance_count=int(info.instanceCount),
            multiprocessors=int(info.multiprocessorCount),
            copy_engines=int(info.copyEngineCount),
            decoders=int(info.decoderCount),
            encoders=int(info.encoderCount),
            jpeg_engines=int(info.jpegCount),
            ofa_engines=int(info.ofaCount),
            memory_mib=int(info.memorySizeMB),
            placements=possible_placements(handle, int(info.id), int(info.instanceCount)),
        )
        for index, info in infos
    ]


def _gi_value(gpu_uuid: str, gi: Any) -> GpuInstance:
    info = nv("nvmlGpuInstanceGetInfo", gi)
    return GpuInstance(
        gpu_uuid=gpu_uuid,
        id=int(info.id),
        profile_id=int(info.profileId),
        placement=Placement(int(info.placement.start), int(info.placement.size)),
    )


def create_gpu_instance(handle: Any, gpu_uuid: str, profile_id: int, placement: Placement) -> GpuInstance:
    if placement.start < 0 or placement.size <= 0:
        raise ValueError(
            f"placement must have start >= 0 and size > 0 (memory slices, as listed by gpu_instance_profiles), "
            f"got start={placement.start} size={placement.size}"
        )
    raw = pynvml.c_nvmlGpuInstancePlacement_t(placement.start, placement.size)
    gi = nv(
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        handle,
        int(profile_id),
        ctypes.byref(raw),
        detail=f"profile ID {profile_id} at {placement.start}:{placement.size}",
    )
    return _gi_value(gpu_uuid, gi)


def gpu_instance(handle: Any, gpu_instance_id: int) -> Any:
    return nv("nvmlDeviceGetGpuInstanceById", handle, int(gpu_instance_id), detail=f"GI {gpu_instance_id}")


def destroy_gpu_instance(handle: Any, gpu_instance_id: int) -> None:
    nv("nvmlGpuInstanceDestroy", gpu_instance(handle, gpu_instance_id), detail=f"GI {gpu_instance_id}")


def gpu_instances(handle: Any, gpu_uuid: str) -> list[GpuInstance]:
    """Every live GI, found profile by profile (NVML lists GIs per profile ID), ordered by GI id."""
    found: dict[int, GpuInstance] = {}
    seen_ids: set[int] = set()
    for _, info in gi_profile_infos(handle):
        profile_id = int(info.id)
        if profile_id in seen_ids:
            continue
        seen_ids.add(profile_id)
        try:
            gis = fill(
                "nvmlDeviceGetGpuInstances", pynvml.c_nvmlGpuInstance_t, int(info.instanceCount), handle, profile_id
            )
        except NvmlError as err:
            if err.code is NvmlReturn.NOT_SUPPORTED:
                continue  # MIG disabled
            raise
        for gi in gis:
            value = _gi_value(gpu_uuid, gi)
            found[value.id] = value
    return [found[k] for k in sorted(found)]


def _ci_profile_infos(gi: Any) -> list[tuple[int, Any]]:
    # The first argument is a GI handle although pynvml names it `device`.
    return _answered(int(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT), lambda index: nv(
        "nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, index, COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED),
        _SKIP_PROFILE)


def compute_instance_profiles(handle: Any, gpu_instance_id: int) -> list[ComputeInstanceProfile]:
    gi = gpu_instance(handle, gpu_instance_id)
    return [
        ComputeInstanceProfile(
            index=index,
            id=int(info.id),
            slice_count=int(info.sliceCount),
            instance_count=int(info.instanceCount),
            multiprocessors=int(info.multiprocessorCount),
        )
        for index, info in _ci_profile_infos(gi)
    ]


def _ci_value(gpu_uuid: str, gpu_instance_id: int, ci: Any) -> ComputeInstance:
    info = nv("nvmlComputeInstanceGetInfo", ci)
    return ComputeInstance(
        gpu_uuid=gpu_uuid, gpu_instance_id=int(gpu_instance_id), id=int(info.id), profile_id=int(info.profileId)
    )


def create_compute_instance(handle: Any, gpu_uuid: str, gpu_instance_id: int, profile_id: int) -> ComputeInstance:
    gi = gpu_instance(handle, gpu_instance_id)
    where = f"GI {gpu_instance_id}, CI profile ID {profile_id}"
    ci = nv("nvmlGpuInstanceCreateComputeInstance", gi, int(profile_id), detail=where)
    return _ci_value(gpu_uuid, gpu_instance_id, ci)


def destroy_compute_instance(handle: Any, gpu_instance_id: int, compute_instance_id: int) -> None:
    gi = gpu_instance(handle, gpu_instance_id)
    where = f"GI {gpu_instance_id}, CI {compute_instance_id}"
    ci = nv("nvmlGpuInstanceGetComputeInstanceById", gi, int(compute_instance_id), detail=where)
    nv("nvmlComputeInstanceDestroy", ci, detail=where)


def compute_instances(handle: Any, gpu_uuid: str, gpu_instance_id: int) -> list[ComputeInstance]:
    gi = gpu_instance(handle, gpu_instance_id)
    found: dict[int, ComputeInstance] = {}
    for _, info in _ci_profile_infos(gi):
        try:
            cis = fill(
                "nvmlGpuInstanceGetComputeInstances",
                pynvml.c_nvmlComputeInstance_t,
                int(info.instanceCount),
                gi,
                int(info.id),
            )
        except NvmlError as err:
            if err.code is NvmlReturn.NOT_SUPPORTED:
                continue
            raise
        for ci in cis:
            value = _ci_value(gpu_uuid, gpu_instance_id, ci)
            found[value.id] = value
    return [found[k] for k in sorted(found)]


def mig_devices(handle: Any, parent_uuid: str) -> list[MigDevice]:
    try:
        slots = int(nv("nvmlDeviceGetMaxMigDeviceCount", handle))
    except NvmlError as err:
        if err.code is NvmlReturn.NOT_SUPPORTED:
            return []
        raise
    devices: list[MigDevice] = []
    for index, mig in _answered(slots, lambda i: nv("nvmlDeviceGetMigDeviceHandleByIndex", handle, i), _EMPTY_MIG_SLOT):
        # Identity comes from the MIG handle itself. nvmlComputeInstanceGetInfo().device is the PARENT
        # GPU, so its UUID would be the parent's (a bug NVIDIA's DRA driver once shipped).
        devices.append(
            MigDevice(
                uuid=str(nv("nvmlDeviceGetUUID", mig)),
                parent_uuid=parent_uuid,
                gpu_instance_id=int(nv("nvmlDeviceGetGpuInstanceId", mig)),
                compute_instance_id=int(nv("nvmlDeviceGetComputeInstanceId", mig)),
                index=index,
                memory_bytes=memory_total(mig),
            )
        )
    return devices
