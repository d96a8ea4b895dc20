"""The MIG rules of the fake NVML, as pure functions from one GPU state to the next.

Each function takes the GPU's model and its current `GpuState` and either returns the new state (plus
what NVML would return) or raises `NvmlError` with the code real NVML uses (docs/reference/nvml-mig.md §1.6, §3.3,
§4). Nothing here does I/O, so the rules are tested directly and reused by the node-file parser to
validate pre-created instances.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace

from dra_driver.nvml.fake.models import MIB, GpuModel, MigSpec
from dra_driver.nvml.fake.state import BusyEntry, CiState, GiState, GpuState
from dra_driver.nvml.types import (
    ComputeInstance,
    ComputeInstanceProfile,
    GpuInstance,
    GpuInstanceProfile,
    MigDevice,
    NvmlError,
    NvmlReturn,
    Placement,
)

# NVML_COMPUTE_INSTANCE_PROFILE_* index by compute-slice count; the CI profile ID equals the index
# (captures show 1/2/3-slice -> 0/1/2; 4 -> 3 and 7 -> 4 are [inferred], docs/reference/nvml-mig.md §2.3).
CI_INDEX_BY_SLICES: dict[int, int] = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
# CI sizes a GI of N compute slices offers (A100 real values, A30 -lcip; docs/reference/nvml-mig.md §2.3).
CI_SLICES_BY_GI_SLICES: dict[int, tuple[int, ...]] = {
    1: (1,),
    2: (1, 2),
    3: (1, 2, 3),
    4: (1, 2, 4),
    7: (1, 2, 3, 4, 7),
}


@dataclass(frozen=True)
class MigResetBehaviour:
    """How a MIG-mode change that needs a GPU reset (Ampere) is activated."""

    auto_reset: bool = False  # the driver's reset succeeds (bare metal, idle GPU): apply at once
    passthrough: bool = False  # reset not exposed (VM passthrough): activation says RESET_REQUIRED


def mig_spec(model: GpuModel, call: str) -> MigSpec:
    if model.mig is None:
        raise NvmlError(NvmlReturn.NOT_SUPPORTED, call=call, detail=f"{model.name} is not MIG-capable")
    return model.mig


def require_mig_on(model: GpuModel, gpu: GpuState, call: str) -> MigSpec:
    spec = mig_spec(model, call)
    if not gpu.mig_current:
        raise NvmlError(NvmlReturn.NOT_SUPPORTED, call=call, detail="MIG mode is disabled")
    return spec


def _gi(gpu: GpuState, gi_id: int, call: str) -> GiState:
    gi = gpu.gi(gi_id)
    if gi is None:
        raise NvmlError(NvmlReturn.NOT_FOUND, call=call, detail=f"no GPU instance {gi_id}")
    return gi


def _gi_profile(spec: MigSpec, gi: GiState, call: str) -> GpuInstanceProfile:
    profile = spec.profile(gi.profile_id)
    if profile is None:  # only reachable with a hand-edited state file
        raise NvmlError(
            NvmlReturn.UNKNOWN, call=call, detail=f"GPU instance {gi.id} has unknown profile {gi.profile_id}"
        )
    return profile


# --- GPU instances -------------------------------------------------------------------------------


def create_gpu_instance(
    model: GpuModel, gpu: GpuState, profile_id: int, placement: Placement, call: str = "create_gpu_instance"
) -> tuple[GpuState, GiState]:
    spec = require_mig_on(model, gpu, call)
    profile = spec.profile(profile_id)
    if profile is None:
        known = ", ".join(str(p.id) for p in spec.profiles)
        raise NvmlError(
            NvmlReturn.INVALID_ARGUMENT, call=call, detail=f"unknown profile id {profile_id}; known: {known}"
        )
    if placement not in profile.placements:
        allowed = ", ".join(f"{p.start}:{p.size}" for p in profile.placements)
        raise NvmlError(
            NvmlReturn.INVALID_ARGUMENT,
            call=call,
            detail=f"placement {placement.start}:{placement.size} is not valid for {profile.name}; valid: {allowed}",
        )
    same_profile = sum(1 for g in gpu.gis if g.profile_id == profile_id)
    if same_profile >= profile.instance_count:
        raise NvmlError(
            NvmlReturn.INSUFFICIENT_RESOURCES,
            call=call,
            detail=f"{profile.name} already has its maximum of {profile.instance_count} instance(s)",
        )
    clash = next((g for g in gpu.gis if g.placement.overlaps(placement)), None)
    if clash is not None:
        raise NvmlError(
            NvmlReturn.INSUFFICIENT_RESOURCES,
            call=call,
            detail=f"memory slices {placement.start}:{placement.size} overlap GPU instance {clash.id}",
        )
    used = {g.id for g in gpu.gis}
    gi_id = next((i for i in spec.gi_ids_for_size(placement.size) if i not in used), None)
    if gi_id is None:  # the overlap check makes this unreachable with consistent tables
        raise NvmlError(NvmlReturn.INSUFFICIENT_RESOURCES, call=call, detail="no free GPU instance id")
    gi = GiState(id=gi_id, profile_id=profile_id, placement=placement)
    return replace(gpu, gis=tuple(sorted((*gpu.gis, gi), key=lambda g: g.id))), gi


def destroy_gpu_instance(model: GpuModel, gpu: GpuState, gi_id: int, call: str = "destroy_gpu_instance") -> GpuState:
    require_mig_on(model, gpu, call)
    gi = _gi(gpu, gi_id, call)
    if gi.cis:
        raise NvmlError(NvmlReturn.IN_USE, call=call, detail=f"GPU instance {gi_id} still has compute instances")
    if gpu.pids_within(gi=gi_id):
        raise NvmlError(NvmlReturn.IN_USE, call=call, detail=f"processes run on GPU instance {gi_id}")
    return replace(gpu, gis=tuple(g for g in gpu.gis if g.id != gi_id))


def gpu_instance_value(gpu_uuid: str, gi: GiState) -> GpuInstance:
    return GpuInstance(gpu_uuid=gpu_uuid, id=gi.id, profile_id=gi.profile_id, placement=gi.placement)


# --- compute instances ---------------------------------------------------------------------------


def ci_sizes(gi_slices: int) -> tuple[int, ...]:
    """CI sizes offered inside a GI; for GI sizes outside the table: 1, powers of two below, itself."""
    if gi_slices in CI_SLICES_BY_GI_SLICES:
        return CI_SLICES_BY_GI_SLICES[gi_slices]
    return tuple(sorted({1, gi_slices} | {p for p in (2, 4) if p < gi_slices}))


def ci_starts(gi_slices: int, ci_slices: int) -> tuple[int, ...]:
    """Compute-slice placements of a CI inside its GI, aligned like GI placements (3 aligns to 4)
    [inferred: no -lcipp capture in the spec]. 7g: 1c -> 0..6, 2c -> 0,2,4, 3c -> 0,4, 4c -> 0."""
    align = 1 << (ci_slices - 1).bit_length()
    return tuple(range(0, gi_slices - ci_slices + 1, align))


def ci_profiles_for(profile: GpuInstanceProfile) -> list[ComputeInstanceProfile]:
    """The CI profiles a GI of `profile` offers, ordered by index. A full CI has the GI's SMs; a
    partial one a proportional share, rounded down (exact on A100's 14 SMs per slice)."""
    g = profile.slice_count
    found = []
    for c in ci_sizes(g):
        index = CI_INDEX_BY_SLICES.get(c, c)
        found.append(
            ComputeInstanceProfile(
                index=index,
                id=index,
                slice_count=c,
                instance_count=len(ci_starts(g, c)),
                multiprocessors=profile.multiprocessors if c == g else profile.multiprocessors * c // g,
            )
        )
    return sorted(found, key=lambda p: p.index)


def compute_instance_profiles(
    model: GpuModel, gpu: GpuState, gi_id: int, call: str = "compute_instance_profiles"
) -> list[ComputeInstanceProfile]:
    spec = require_mig_on(model, gpu, call)
    gi = _gi(gpu, gi_id, call)
    return ci_profiles_for(_gi_profile(spec, gi, call))


def create_compute_instance(
    model: GpuModel, gpu: GpuState, gi_id: int, ci_profile_id: int, call: str = "create_compute_instance"
) -> tuple[GpuState, CiState]:
    spec = require_mig_on(model, gpu, call)
    gi = _gi(gpu, gi_id, call)
    gi_profile = _gi_profile(spec, gi, call)
    if ci_profile_id not in CI_INDEX_BY_SLICES.values():
        raise NvmlError(
            NvmlReturn.INVALID_ARGUMENT, call=call, detail=f"unknown compute-instance profile {ci_profile_id}"
        )
    ci_profile = next((p for p in ci_profiles_for(gi_profile) if p.id == ci_profile_id), None)
    if ci_profile is None:
        raise NvmlError(
            NvmlReturn.NOT_SUPPORTED,
            call=call,
            detail=f"compute-instance profile {ci_profile_id} is not offered by a {gi_profile.name} GPU instance",
        )
    size = ci_profile.slice_count
    taken = [range(c.start, c.start + c.slice_count) for c in gi.cis]
    start = next(
        (
            s
            for s in ci_starts(gi_profile.slice_count, size)
            if not any(s < r.stop and r.start < s + size for r in taken)
        ),
        None,
    )
    if start is None:
        raise NvmlError(
            NvmlReturn.INSUFFICIENT_RESOURCES,
            call=call,
            detail=f"no free {size} compute slice(s) left in GPU instance {gi_id}",
        )
    used = {c.id for c in gi.cis}
    ci = CiState(
        id=next(i for i in range(len(used) + 1) if i not in used),
        profile_id=ci_profile_id,
        start=start,
        slice_count=size,
    )
    new_gi = replace(gi, cis=tuple(sorted((*gi.cis, ci), key=lambda c: c.id)))
    return replace(gpu, gis=tuple(new_gi if g.id == gi_id else g for g in gpu.gis)), ci


def destroy_compute_instance(
    model: GpuModel, gpu: GpuState, gi_id: int, ci_id: int, call: str = "destroy_compute_instance"
) -> GpuState:
    require_mig_on(model, gpu, call)
    gi = _gi(gpu, gi_id, call)
    if not any(c.id == ci_id for c in gi.cis):
        raise NvmlError(NvmlReturn.NOT_FOUND, call=call, detail=f"no compute instance {ci_id} in GPU instance {gi_id}")
    if gpu.pids(gi=gi_id, ci=ci_id):
        raise NvmlError(NvmlReturn.IN_USE, call=call, detail=f"processes run on compute instance {gi_id}/{ci_id}")
    new_gi = replace(gi, cis=tuple(c for c in gi.cis if c.id != ci_id))
    return replace(gpu, gis=tuple(new_gi if g.id == gi_id else g for g in gpu.gis))


def compute_instance_value(gpu_uuid: str, gi_id: int, ci: CiState) -> ComputeInstance:
    return ComputeInstance(gpu_uuid=gpu_uuid, gpu_instance_id=gi_id, id=ci.id, profile_id=ci.profile_id)


# --- MIG devices ---------------------------------------------------------------------------------


def mig_device_uuid(parent_uuid: str, gi_id: int, ci_id: int) -> str:
    """Deterministic "MIG-" UUID (version 5, as in real captures) derived from parent and ids."""
    namespace = uuid.UUID(parent_uuid.removeprefix("GPU-"))
    return "MIG-" + str(uuid.uuid5(namespace, f"{gi_id}/{ci_id}"))


def mig_devices(model: GpuModel, gpu: GpuState, call: str = "mig_devices") -> list[MigDevice]:
    """Live MIG devices, indexed densely in (GI id, CI id) order; empty while MIG is off."""
    spec = mig_spec(model, call)
    if not gpu.mig_current:
        return []
    devices: list[MigDevice] = []
    for gi in gpu.gis:  # ordered by GI id
        profile = spec.profile(gi.profile_id)
        memory = profile.memory_mib * MIB if profile is not None else None
        for ci in gi.cis:  # ordered by CI id
            devices.append(
                MigDevice(
                    uuid=mig_device_uuid(gpu.uuid, gi.id, ci.id),
                    parent_uuid=gpu.uuid,
                    gpu_instance_id=gi.id,
                    compute_instance_id=ci.id,
                    index=len(devices),
                    memory_bytes=memory,
                )
            )
    return devices


# --- MIG mode, reset, processes ------------------------------------------------------------------


def set_mig_mode(
    model: GpuModel, gpu: GpuState, enabled: bool, policy: MigResetBehaviour, call: str = "set_mig_mode"
) -> tuple[GpuState, NvmlReturn]:
    """Returns the new state and the activation status (nvmlDeviceSetMigMode's out value)."""
    mig_spec(model, call)
    if not enabled and gpu.gis:
        # [unverified] real behaviour; tools always clear instances first (docs/reference/nvml-mig.md §4).
        return gpu, NvmlReturn.IN_USE
    busy = bool(gpu.pids_within())
    if not model.mig_toggle_needs_reset:
        if enabled == gpu.mig_current:
            return replace(gpu, mig_pending=enabled), NvmlReturn.SUCCESS
        if busy:
            return gpu, NvmlReturn.IN_USE
        return replace(gpu, mig_current=enabled, mig_pending=enabled), NvmlReturn.SUCCESS
    # Ampere: the request always records the pending mode; activation needs a GPU reset.
    pending = replace(gpu, mig_pending=enabled)
    if enabled == gpu.mig_current:
        return pending, NvmlReturn.SUCCESS
    if policy.passthrough:
        return pending, NvmlReturn.RESET_REQUIRED
    if busy:
        return pending, NvmlReturn.IN_USE
    if policy.auto_reset:
        return replace(pending, mig_current=enabled, gis=()), NvmlReturn.SUCCESS
    return pending, NvmlReturn.SUCCESS


def reset_gpu(gpu: GpuState, call: str = "reset_gpu") -> GpuState:
    """`nvidia-smi -r`: refuses a busy GPU; drops every GI/CI and activates the pending MIG mode."""
    if gpu.pids_within():
        raise NvmlError(NvmlReturn.IN_USE, call=call, detail="processes are running on the GPU")
    return replace(gpu, gis=(), mig_current=gpu.mig_pending)


def set_busy(
    model: GpuModel, gpu: GpuState, pids: tuple[int, ...], gi: int | None, ci: int | None, call: str = "set_busy"
) -> GpuState:
    """Replace the pids running at one scope (GPU, GI or CI); an empty tuple clears it."""
    if ci is not None and gi is None:
        raise ValueError("set_busy: a compute instance needs its gpu instance (gi=...)")
    if gi is not None:
        require_mig_on(model, gpu, call)
        target = _gi(gpu, gi, call)
        if ci is not None and not any(c.id == ci for c in target.cis):
            raise NvmlError(NvmlReturn.NOT_FOUND, call=call, detail=f"no compute instance {ci} in GPU instance {gi}")
    others = tuple(b for b in gpu.busy if (b.gi, b.ci) != (gi, ci))
    if not pids:
        return replace(gpu, busy=others)
    return replace(gpu, busy=(*others, BusyEntry(gi=gi, ci=ci, pids=tuple(pids))))
