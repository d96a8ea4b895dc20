"""GPU models the fake NVML knows: identity facts and MIG profile tables.

The facts are data files of this package: gpu_models.tsv (docs/reference/nvml-mig.md §1.3: names, memory totals,
PCI device ids) and mig_profiles.tsv (§2.2: GPU-instance profile tables, verbatim: IDs, slice/instance counts,
engines, MiB, placements). Facts not in the spec are marked in the files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Final, TypeVar

from dra_driver.nvml.types import Architecture, GpuInstanceProfile, Placement

_T = TypeVar("_T")

MIB = 1024 * 1024


@dataclass(frozen=True)
class MigSpec:
    """The MIG geometry of one GPU model."""

    memory_slices: int  # 8 on A100/H100/H200, 4 on A30
    compute_slices: int  # 7 on A100/H100/H200, 4 on A30
    profiles: tuple[GpuInstanceProfile, ...]  # ordered by profile index

    @property
    def max_mig_devices(self) -> int:
        return self.compute_slices

    def profile(self, profile_id: int) -> GpuInstanceProfile | None:
        return next((p for p in self.profiles if p.id == profile_id), None)

    def profile_named(self, name: str) -> GpuInstanceProfile | None:
        return next((p for p in self.profiles if p.name == name), None)

    def gi_ids_for_size(self, size: int) -> range:
        """GPU-instance IDs the driver hands out for a placement of `size` memory slices.

        The IDs number the nodes of a binary tree over the memory slices: the whole GPU is 0, the
        halves 1-2, the quarters 3-6, the eighths 7-14 (docs/reference/nvml-mig.md §2.3 observed ranges; on the
        4-slice A30 this gives 4g -> 0, 2g -> 1-2, 1g -> 3-6, which matches its capture).
        """
        level = (self.memory_slices // size).bit_length() - 1
        return range(2**level - 1, 2 ** (level + 1) - 1)


@dataclass(frozen=True)
class GpuModel:
    """Identity of a GPU model as NVML reports it."""

    key: str  # catalog key used in node files, e.g. "H100-SXM5-80GB"
    name: str  # nvmlDeviceGetName, e.g. "NVIDIA H100 80GB HBM3"
    architecture: Architecture
    compute_capability: tuple[int, int]
    memory_mib: int
    pci_device_id: int
    multiprocessors: int
    nvlink_links: int  # NVLinks per GPU when wired (0 = the model has none)
    brand: str = "Nvidia"  # NVML_BRAND_NVIDIA (14) on current drivers
    mig: MigSpec | None = None

    @property
    def mig_capable(self) -> bool:
        return self.mig is not None

    @property
    def mig_toggle_needs_reset(self) -> bool:
        """Ampere applies a MIG-mode change only after a GPU reset; Hopper and newer toggle live."""
        return self.architecture < Architecture.HOPPER


# NVML_GPU_INSTANCE_PROFILE_* indices by the constants' suffix, as mig_profiles.tsv names them
# (docs/reference/nvml-mig.md §1.6).
PROFILE_INDEX: Final[Mapping[str, int]] = MappingProxyType(
    {
        "1_SLICE": 0,
        "2_SLICE": 1,
        "3_SLICE": 2,
        "4_SLICE": 3,
        "7_SLICE": 4,
        "1_SLICE_REV1": 7,
        "2_SLICE_REV1": 8,
        "1_SLICE_REV2": 9,
    }
)


def _table(filename: str, convert: Callable[[Mapping[str, str]], _T]) -> Iterator[_T]:
    """Each row of a tab-separated data file of this package, as `convert` makes it of {column: value}. The first
    line that is neither blank nor a comment (`#`) names the columns. A malformed row raises ValueError naming the
    file and line."""
    text = resources.files("dra_driver.nvml.fake").joinpath(filename).read_text(encoding="utf-8")
    header: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if not header:
            header = fields
            continue
        try:
            if len(fields) != len(header):
                raise ValueError(f"{len(fields)} columns where the header has {len(header)}")
            yield convert(dict(zip(header, fields, strict=True)))
        except KeyError as exc:  # a column the header lacks, or an index or architecture name not known
            raise ValueError(f"{filename} line {number}: unknown name {exc}") from None
        except ValueError as exc:
            raise ValueError(f"{filename} line {number}: {exc}") from None


def _profile(row: Mapping[str, str]) -> tuple[str, GpuInstanceProfile]:
    """A row of mig_profiles.tsv: the model's key and the profile."""
    size = int(row["size"])
    return row["model"], GpuInstanceProfile(
        index=PROFILE_INDEX[row["index"]],
        id=int(row["ID"]),
        name=row["name"],
        slice_count=int(row["sl"]),
        instance_count=int(row["inst"]),
        multiprocessors=int(row["SM"]),
        copy_engines=int(row["CE"]),
        decoders=int(row["DEC"]),
        encoders=int(row["ENC"]),
        jpeg_engines=int(row["JPG"]),
        ofa_engines=int(row["OFA"]),
        memory_mib=int(row["MiB"]),
        placements=tuple(Placement(int(start), size) for start in row["starts"].split(",")),
    )


def _model(row: Mapping[str, str], profiles: Mapping[str, tuple[GpuInstanceProfile, ...]]) -> GpuModel:
    """A row of gpu_models.tsv, with its MIG profiles where it gives a MIG geometry."""
    mig = None
    if row["mem_slices"] != "-":
        if row["key"] not in profiles:
            raise ValueError(f"{row['key']} has a MIG geometry but no rows in mig_profiles.tsv")
        mig = MigSpec(int(row["mem_slices"]), int(row["compute_slices"]), profiles[row["key"]])
    major, minor = row["cc"].split(".")
    return GpuModel(
        key=row["key"],
        name=row["name"],
        architecture=Architecture[row["architecture"]],
        compute_capability=(int(major), int(minor)),
        memory_mib=int(row["memory_mib"]),
        pci_device_id=int(row["pci_device_id"], 16),
        multiprocessors=int(row["multiprocessors"]),
        nvlink_links=int(row["nvlink_links"]),
        mig=mig,
    )


def _catalog() -> tuple[GpuModel, ...]:
    grouped: dict[str, list[GpuInstanceProfile]] = {}
    for key, profile in _table("mig_profiles.tsv", _profile):
        grouped.setdefault(key, []).append(profile)
    profiles = {key: tuple(sorted(rows, key=lambda p: p.index)) for key, rows in grouped.items()}
    catalog = tuple(_table("gpu_models.tsv", lambda row: _model(row, profiles)))
    orphans = sorted(set(profiles) - {m.key for m in catalog if m.mig is not None})
    if orphans:
        raise ValueError(f"mig_profiles.tsv has rows for {', '.join(orphans)}, which gpu_models.tsv gives no MIG")
    return catalog


CATALOG: Final[tuple[GpuModel, ...]] = _catalog()


def known_model_keys() -> tuple[str, ...]:
    return tuple(m.key for m in CATALOG)


def find_model(key: str) -> GpuModel | None:
    return next((m for m in CATALOG if m.key == key), None)
