"""The go-nvlib MIG profile-name formula (docs/reference/nvml-mig.md §2.4) on the real GPU tables of §2.2."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.nvml.profile_name import (
    GI_SLICES_BY_INDEX,
    gi_slices_for_index,
    mig_memory_gb,
    mig_profile_name,
    round_half_away_from_zero,
)

MIB = 1024 * 1024
# Framebuffer totals reported by nvidia-smi / NVML (MiB).
H100_80GB = 81559 * MIB
H200_141GB = 143771 * MIB
A100_40GB = 40960 * MIB
A30_24GB = 24576 * MIB

# (profile index, memorySizeMB, total bytes, expected name)
TABLE = [
    # H100 80GB HBM3
    (0x0, 9984, H100_80GB, "1g.10gb"),
    (0x7, 9984, H100_80GB, "1g.10gb+me"),
    (0x9, 20096, H100_80GB, "1g.20gb"),
    (0x1, 20096, H100_80GB, "2g.20gb"),
    (0x2, 40448, H100_80GB, "3g.40gb"),
    (0x3, 40448, H100_80GB, "4g.40gb"),
    (0x4, 81152, H100_80GB, "7g.80gb"),
    # A100-SXM4-40GB
    (0x0, 4864, A100_40GB, "1g.5gb"),
    (0x7, 4864, A100_40GB, "1g.5gb+me"),
    (0x9, 9856, A100_40GB, "1g.10gb"),
    (0x1, 9856, A100_40GB, "2g.10gb"),
    (0x2, 19968, A100_40GB, "3g.20gb"),
    (0x3, 19968, A100_40GB, "4g.20gb"),
    (0x4, 40192, A100_40GB, "7g.40gb"),
    # H200: 3g is 0.5 * 141 = 70.5 -> Go rounds to 71, Python's round() would say 70
    (0x0, 16384, H200_141GB, "1g.18gb"),
    (0x7, 16384, H200_141GB, "1g.18gb+me"),
    (0x9, 33024, H200_141GB, "1g.35gb"),
    (0x1, 33024, H200_141GB, "2g.35gb"),
    (0x2, 71168, H200_141GB, "3g.71gb"),
    (0x3, 71168, H200_141GB, "4g.71gb"),
    (0x4, 143104, H200_141GB, "7g.141gb"),
    # A30-24GB
    (0x0, 5952, A30_24GB, "1g.6gb"),
    (0x7, 5952, A30_24GB, "1g.6gb+me"),
    (0x1, 11968, A30_24GB, "2g.12gb"),
    (0x8, 11968, A30_24GB, "2g.12gb+me"),
    (0x3, 24000, A30_24GB, "4g.24gb"),
]


@pytest.mark.parametrize(("index", "memory_mib", "total", "expected"), TABLE)
def test_real_gpu_tables(index: int, memory_mib: int, total: int, expected: str) -> None:
    assert mig_profile_name(index, memory_mib, total) == expected


def test_h200_3g_is_the_go_rounding_case() -> None:
    # The exact product is 70.5: Python's banker's round() gives 70, Go's math.Round 71.
    assert round(70.5) == 70
    assert mig_memory_gb(71168, H200_141GB) == 71


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (0xA, "1g.10gb+gfx"),
        (0xB, "2g.20gb+gfx"),
        (0xC, "4g.40gb+gfx"),
        (0x11, "3g.40gb+gfx"),
        (0xD, "1g.10gb-me"),
        (0xE, "2g.20gb-me"),
        (0xF, "1g.10gb+me.all"),
        (0x10, "2g.20gb+me.all"),
    ],
)
def test_attribute_suffixes(index: int, expected: str) -> None:
    memory = {1: 9984, 2: 20096, 3: 40448, 4: 40448}[GI_SLICES_BY_INDEX[index]]
    assert mig_profile_name(index, memory, H100_80GB) == expected


def test_ci_smaller_than_gi_gives_the_three_part_form() -> None:
    assert mig_profile_name(0x1, 20096, H100_80GB, ci_slices=1) == "1c.2g.20gb"
    assert mig_profile_name(0x4, 81152, H100_80GB, ci_slices=3) == "3c.7g.80gb"
    assert mig_profile_name(0x8, 11968, A30_24GB, ci_slices=1) == "1c.2g.12gb+me"
    # Equal to G is the plain form.
    assert mig_profile_name(0x2, 40448, H100_80GB, ci_slices=3) == "3g.40gb"


@pytest.mark.parametrize(
    ("value", "expected"),
    [(70.5, 71), (2.5, 3), (3.5, 4), (0.5, 1), (2.4999, 2), (-2.5, -3), (-0.4, 0), (0.49999999999999994, 0), (7.0, 7)],
)
def test_round_half_away_from_zero(value: float, expected: int) -> None:
    assert round_half_away_from_zero(value) == expected


@given(st.floats(min_value=-1e9, max_value=1e9, allow_nan=False))
def test_rounding_is_never_more_than_half_away(value: float) -> None:
    r = round_half_away_from_zero(value)
    assert abs(r - value) <= 0.5
    if abs(r - value) == 0.5:
        assert abs(r) > abs(value)  # ties go away from zero


def test_rev2_profile_is_one_compute_slice() -> None:
    assert gi_slices_for_index(0x9) == 1
    assert gi_slices_for_index(0x6) == 6
    assert gi_slices_for_index(0x5) == 8


def test_unknown_index_names_the_field_and_the_mixup() -> None:
    with pytest.raises(ValueError, match=r"profile_index 0x13 .*INDEX, not the profile ID"):
        mig_profile_name(19, 9984, H100_80GB)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"memory_mib": -1, "device_memory_bytes": H100_80GB}, "memory_mib"),
        ({"memory_mib": 9984, "device_memory_bytes": 0}, "device_memory_bytes"),
    ],
)
def test_bad_memory_numbers_name_the_field(kwargs: dict[str, int], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        mig_memory_gb(**kwargs)


def test_bad_ci_slices_names_the_field() -> None:
    with pytest.raises(ValueError, match="ci_slices"):
        mig_profile_name(0, 9984, H100_80GB, ci_slices=0)
