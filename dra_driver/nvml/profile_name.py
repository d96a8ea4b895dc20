"""Canonical MIG profile names ("1g.10gb", "3g.71gb", "1g.10gb+me", "1c.2g.10gb") from NVML numbers.

The name is not read from NVML: like go-nvlib (and so mig-parted, GFD and NVIDIA's DRA driver) it is
derived from the profile index and the memory sizes, so that the real and the fake backends agree with
the names users see everywhere else. The formula (docs/reference/nvml-mig.md §2.4):

    frac    = ceil(memorySizeMB * 2**20 / total_bytes * 8) / 8
    totalGB = ceil(total_bytes / 2**30)
    GB      = round_half_away_from_zero(frac * totalGB)

Pure functions only; no pynvml import, so the fake backend can reuse this module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

_MIB = 1024 * 1024
_GIB = 1024 * 1024 * 1024
# go-nvlib rounds the memory fraction up to eighths of the GPU.
_FRACTION_DENOMINATOR = 8

# NVML_GPU_INSTANCE_PROFILE_* index -> compute slices G of the name. REV2 (index 9) is one compute slice
# with double memory, so G stays 1.
GI_SLICES_BY_INDEX: Mapping[int, int] = MappingProxyType(
    {
        0x0: 1,  # 1_SLICE
        0x1: 2,  # 2_SLICE
        0x2: 3,  # 3_SLICE
        0x3: 4,  # 4_SLICE
        0x4: 7,  # 7_SLICE
        0x5: 8,  # 8_SLICE
        0x6: 6,  # 6_SLICE
        0x7: 1,  # 1_SLICE_REV1
        0x8: 2,  # 2_SLICE_REV1
        0x9: 1,  # 1_SLICE_REV2
        0xA: 1,  # 1_SLICE_GFX
        0xB: 2,  # 2_SLICE_GFX
        0xC: 4,  # 4_SLICE_GFX
        0xD: 1,  # 1_SLICE_NO_ME
        0xE: 2,  # 2_SLICE_NO_ME
        0xF: 1,  # 1_SLICE_ALL_ME
        0x10: 2,  # 2_SLICE_ALL_ME
        0x11: 3,  # 3_SLICE_GFX
    }
)

# Attribute suffixes: "+me" media extensions, "+me.all" all media engines, "+gfx" graphics, "-me" none.
_SUFFIX_BY_INDEX: Mapping[int, str] = MappingProxyType(
    {
        0x7: "+me",
        0x8: "+me",
        0xF: "+me.all",
        0x10: "+me.all",
        0xA: "+gfx",
        0xB: "+gfx",
        0xC: "+gfx",
        0x11: "+gfx",
        0xD: "-me",
        0xE: "-me",
    }
)


def round_half_away_from_zero(value: float) -> int:
    """Go's math.Round. Python's round() is banker's rounding (70.5 -> 70), which would turn the
    H200 "3g.71gb" into "3g.70gb"."""
    magnitude = abs(value)
    whole = math.floor(magnitude)
    # magnitude - whole is exact for floats, unlike floor(magnitude + 0.5) near x.4999…
    rounded = whole + 1 if magnitude - whole >= 0.5 else whole
    return int(math.copysign(rounded, value))


def gi_slices_for_index(profile_index: int) -> int:
    """Compute slices (the G of "Gg.Xgb") for an NVML_GPU_INSTANCE_PROFILE_* index."""
    try:
        return GI_SLICES_BY_INDEX[profile_index]
    except KeyError:
        raise ValueError(
            f"profile_index {profile_index:#x} is not a known NVML_GPU_INSTANCE_PROFILE_* index "
            f"(valid: 0x0..0x11); pass the profile INDEX, not the profile ID"
        ) from None


def mig_memory_gb(memory_mib: int, device_memory_bytes: int) -> int:
    """The GB figure of a profile name: the profile's share of the GPU in eighths, times the GPU's
    size in whole GiB rounded up (float64 arithmetic in the same order as go-nvlib)."""
    if memory_mib < 0:
        raise ValueError(f"memory_mib must be >= 0 (the profile's memorySizeMB), got {memory_mib}")
    if device_memory_bytes <= 0:
        raise ValueError(
            f"device_memory_bytes must be > 0 (the parent GPU's total memory in bytes), got {device_memory_bytes}"
        )
    fraction = (float(memory_mib) * _MIB) / float(device_memory_bytes)
    fraction = math.ceil(fraction * _FRACTION_DENOMINATOR) / _FRACTION_DENOMINATOR
    total_gb = float((device_memory_bytes + _GIB - 1) // _GIB)
    return round_half_away_from_zero(fraction * total_gb)


def mig_profile_name(
    profile_index: int,
    memory_mib: int,
    device_memory_bytes: int,
    ci_slices: int | None = None,
) -> str:
    """Canonical name of a GPU-instance profile, e.g. ``mig_profile_name(0, 9984, 81559 * 2**20) == "1g.10gb"``.

    `ci_slices` is the compute-instance slice count when the CI is smaller than the GI; the name then
    takes the "Cc.Gg.GBgb" form. None (or equal to G) gives the plain "Gg.GBgb" form.
    """
    g = gi_slices_for_index(profile_index)
    if ci_slices is not None and ci_slices <= 0:
        raise ValueError(f"ci_slices must be > 0 (compute-instance slice count) or None, got {ci_slices}")
    gb = mig_memory_gb(memory_mib, device_memory_bytes)
    suffix = _SUFFIX_BY_INDEX.get(profile_index, "")
    if ci_slices is None or ci_slices == g:
        return f"{g}g.{gb}gb{suffix}"
    return f"{ci_slices}c.{g}g.{gb}gb{suffix}"
