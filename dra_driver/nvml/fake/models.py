"""GPU models the fake NVML knows: identity facts and MIG profile tables.

Values are the ones in docs/reference/nvml-mig.md: §1.3 (names, memory totals, PCI device ids) and
§2.2 (GPU-instance profile tables, verbatim: IDs, slice/instance counts, engines, MiB, placements).
Facts not in the spec are marked where they are defined.
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_driver.nvml.types import Architecture, GpuInstanceProfile, Placement

# NVML_GPU_INSTANCE_PROFILE_* indices (docs/reference/nvml-mig.md §1.6).
PROFILE_1_SLICE = 0
PROFILE_2_SLICE = 1
PROFILE_3_SLICE = 2
PROFILE_4_SLICE = 3
PROFILE_7_SLICE = 4
PROFILE_1_SLICE_REV1 = 7
PROFILE_2_SLICE_REV1 = 8
PROFILE_1_SLICE_REV2 = 9

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


def _row(
    index: int,
    profile_id: int,
    name: str,
    slices: int,
    instances: int,
    sm: int,
    ce: int,
    dec: int,
    enc: int,
    jpeg: int,
    ofa: int,
    mib: int,
    starts: tuple[int, ...],
    size: int,
) -> GpuInstanceProfile:
    return GpuInstanceProfile(
        index=index,
        id=profile_id,
        name=name,
        slice_count=slices,
        instance_count=instances,
        multiprocessors=sm,
        copy_engines=ce,
        decoders=dec,
        encoders=enc,
        jpeg_engines=jpeg,
        ofa_engines=ofa,
        memory_mib=mib,
        placements=tuple(Placement(start, size) for start in starts),
    )


def _by_index(*rows: GpuInstanceProfile) -> tuple[GpuInstanceProfile, ...]:
    return tuple(sorted(rows, key=lambda p: p.index))


_SEVEN = (0, 1, 2, 3, 4, 5, 6)
_EVEN = (0, 2, 4, 6)

# docs/reference/nvml-mig.md §2.2 tables.
# Columns: index, ID, name, sl, inst, SM, CE, DEC, ENC, JPG, OFA, MiB, starts, size.
A100_40GB_MIG = MigSpec(
    memory_slices=8,
    compute_slices=7,
    profiles=_by_index(
        _row(PROFILE_1_SLICE, 19, "1g.5gb", 1, 7, 14, 1, 0, 0, 0, 0, 4864, _SEVEN, 1),
        _row(PROFILE_1_SLICE_REV1, 20, "1g.5gb+me", 1, 1, 14, 1, 1, 0, 1, 1, 4864, _SEVEN, 1),
        _row(PROFILE_1_SLICE_REV2, 15, "1g.10gb", 1, 4, 14, 1, 1, 0, 0, 0, 9856, _EVEN, 2),
        _row(PROFILE_2_SLICE, 14, "2g.10gb", 2, 3, 28, 2, 1, 0, 0, 0, 9856, (0, 2, 4), 2),
        _row(PROFILE_3_SLICE, 9, "3g.20gb", 3, 2, 42, 3, 2, 0, 0, 0, 19968, (0, 4), 4),
        _row(PROFILE_4_SLICE, 5, "4g.20gb", 4, 1, 56, 4, 2, 0, 0, 0, 19968, (0,), 4),
        _row(PROFILE_7_SLICE, 0, "7g.40gb", 7, 1, 98, 7, 5, 0, 1, 1, 40192, (0,), 8),
    ),
)

A100_80GB_MIG = MigSpec(
    memory_slices=8,
    compute_slices=7,
    profiles=_by_index(
        _row(PROFILE_1_SLICE, 19, "1g.10gb", 1, 7, 14, 1, 0, 0, 0, 0, 9728, _SEVEN, 1),
        _row(PROFILE_1_SLICE_REV1, 20, "1g.10gb+me", 1, 1, 14, 1, 1, 0, 1, 1, 9728, _SEVEN, 1),
        # MiB and placements of this row are [inferred] in the spec.
        _row(PROFILE_1_SLICE_REV2, 15, "1g.20gb", 1, 4, 14, 1, 1, 0, 0, 0, 19968, _EVEN, 2),
        _row(PROFILE_2_SLICE, 14, "2g.20gb", 2, 3, 28, 2, 1, 0, 0, 0, 19968, (0, 2, 4), 2),
        _row(PROFILE_3_SLICE, 9, "3g.40gb", 3, 2, 42, 3, 2, 0, 0, 0, 40192, (0, 4), 4),
        _row(PROFILE_4_SLICE, 5, "4g.40gb", 4, 1, 56, 4, 2, 0, 0, 0, 40192, (0,), 4),
        _row(PROFILE_7_SLICE, 0, "7g.80gb", 7, 1, 98, 7, 5, 0, 1, 1, 80896, (0,), 8),
    ),
)

H100_80GB_MIG = MigSpec(
    memory_slices=8,
    compute_slices=7,
    profiles=_by_index(
        _row(PROFILE_1_SLICE, 19, "1g.10gb", 1, 7, 16, 1, 1, 0, 1, 0, 9984, _SEVEN, 1),
        _row(PROFILE_1_SLICE_REV1, 20, "1g.10gb+me", 1, 1, 16, 1, 1, 0, 1, 1, 9984, _SEVEN, 1),
        _row(PROFILE_1_SLICE_REV2, 15, "1g.20gb", 1, 4, 26, 1, 1, 0, 1, 0, 20096, _EVEN, 2),
        _row(PROFILE_2_SLICE, 14, "2g.20gb", 2, 3, 32, 2, 2, 0, 2, 0, 20096, (0, 2, 4), 2),
        _row(PROFILE_3_SLICE, 9, "3g.40gb", 3, 2, 60, 3, 3, 0, 3, 0, 40448, (0, 4), 4),
        _row(PROFILE_4_SLICE, 5, "4g.40gb", 4, 1, 64, 4, 4, 0, 4, 0, 40448, (0,), 4),
        _row(PROFILE_7_SLICE, 0, "7g.80gb", 7, 1, 132, 8, 7, 0, 7, 1, 81152, (0,), 8),
    ),
)

# Placements [inferred] in the spec: equal to H100 (same GH100 die, IDs and instance counts).
H200_MIG = MigSpec(
    memory_slices=8,
    compute_slices=7,
    profiles=_by_index(
        _row(PROFILE_1_SLICE, 19, "1g.18gb", 1, 7, 16, 1, 1, 0, 1, 0, 16384, _SEVEN, 1),
        _row(PROFILE_1_SLICE_REV1, 20, "1g.18gb+me", 1, 1, 16, 1, 1, 0, 1, 1, 16384, _SEVEN, 1),
        _row(PROFILE_1_SLICE_REV2, 15, "1g.35gb", 1, 4, 26, 1, 1, 0, 1, 0, 33024, _EVEN, 2),
        _row(PROFILE_2_SLICE, 14, "2g.35gb", 2, 3, 32, 2, 2, 0, 2, 0, 33024, (0, 2, 4), 2),
        _row(PROFILE_3_SLICE, 9, "3g.71gb", 3, 2, 60, 3, 3, 0, 3, 0, 71168, (0, 4), 4),
        _row(PROFILE_4_SLICE, 5, "4g.71gb", 4, 1, 64, 4, 4, 0, 4, 0, 71168, (0,), 4),
        _row(PROFILE_7_SLICE, 0, "7g.141gb", 7, 1, 132, 8, 7, 0, 7, 1, 143104, (0,), 8),
    ),
)

A30_MIG = MigSpec(
    memory_slices=4,
    compute_slices=4,
    profiles=_by_index(
        _row(PROFILE_1_SLICE, 14, "1g.6gb", 1, 4, 14, 1, 1, 0, 0, 0, 5952, (0, 1, 2, 3), 1),
        _row(PROFILE_1_SLICE_REV1, 21, "1g.6gb+me", 1, 1, 14, 1, 1, 0, 1, 1, 5952, (0, 1, 2, 3), 1),
        _row(PROFILE_2_SLICE, 5, "2g.12gb", 2, 2, 28, 2, 2, 0, 0, 0, 11968, (0, 2), 2),
        _row(PROFILE_2_SLICE_REV1, 6, "2g.12gb+me", 2, 1, 28, 2, 2, 0, 1, 1, 11968, (0, 2), 2),
        _row(PROFILE_4_SLICE, 0, "4g.24gb", 4, 1, 56, 4, 4, 0, 1, 1, 24000, (0,), 4),
    ),
)

# Whole-GPU SM counts are public datasheet figures (not in the spec): A100 108, H100/H200 SXM 132,
# A30 56, L4 58. NVLink counts per GPU: H100/H200 SXM 18, A100 SXM4 12 (spec §1.5); A30 4 over its
# bridge [inferred: 200 GB/s bridge / 50 GB/s per NVLink3 link]. L4: device id 0x27B8 and the
# 24 GiB total are not in the spec (boards report slightly less than 24576 MiB) [unverified].
CATALOG: tuple[GpuModel, ...] = (
    GpuModel(
        key="A100-SXM4-40GB",
        name="NVIDIA A100-SXM4-40GB",
        architecture=Architecture.AMPERE,
        compute_capability=(8, 0),
        memory_mib=40960,
        pci_device_id=0x20B010DE,
        multiprocessors=108,
        nvlink_links=12,
        mig=A100_40GB_MIG,
    ),
    GpuModel(
        key="A100-SXM4-80GB",
        name="NVIDIA A100-SXM4-80GB",
        architecture=Architecture.AMPERE,
        compute_capability=(8, 0),
        memory_mib=81920,
        pci_device_id=0x20B210DE,
        multiprocessors=108,
        nvlink_links=12,
        mig=A100_80GB_MIG,
    ),
    GpuModel(
        key="A30",
        name="NVIDIA A30",
        architecture=Architecture.AMPERE,
        compute_capability=(8, 0),
        memory_mib=24576,
        pci_device_id=0x20B710DE,
        multiprocessors=56,
        nvlink_links=4,
        mig=A30_MIG,
    ),
    GpuModel(
        key="H100-SXM5-80GB",
        name="NVIDIA H100 80GB HBM3",
        architecture=Architecture.HOPPER,
        compute_capability=(9, 0),
        memory_mib=81559,
        pci_device_id=0x233010DE,
        multiprocessors=132,
        nvlink_links=18,
        mig=H100_80GB_MIG,
    ),
    GpuModel(
        key="H200",
        name="NVIDIA H200",
        architecture=Architecture.HOPPER,
        compute_capability=(9, 0),
        memory_mib=143771,
        pci_device_id=0x233510DE,
        multiprocessors=132,
        nvlink_links=18,
        mig=H200_MIG,
    ),
    # GB200 (one Blackwell GPU of a Grace-Blackwell superchip; an NVL72 compute tray has 4). Name, architecture,
    # compute capability 10.0, 189471 MiB and device id 0x2941 as NVML reports them on GB200 NVL72 trays (public
    # captures; not in docs/reference/nvml-mig.md). The SM count (148) is the B200 datasheet figure [unverified for
    # GB200]. 18 NVLink5 links, one to each NVLink switch chip of the rack. Real GB200s are MIG-capable (profiles
    # such as 1g.23gb, 2g.47gb, 3g.93gb), but the spec has no verified GB200 profile table, so this model has none:
    # MIG is off and the GPU reports itself as not MIG-capable (docs/fake-nvml.md "Gaps").
    GpuModel(
        key="GB200",
        name="NVIDIA GB200",
        architecture=Architecture.BLACKWELL,
        compute_capability=(10, 0),
        memory_mib=189471,
        pci_device_id=0x294110DE,
        multiprocessors=148,
        nvlink_links=18,
    ),
    GpuModel(
        key="L4",
        name="NVIDIA L4",
        architecture=Architecture.ADA,
        compute_capability=(8, 9),
        memory_mib=24576,
        pci_device_id=0x27B810DE,
        multiprocessors=58,
        nvlink_links=0,
    ),
)


def known_model_keys() -> tuple[str, ...]:
    return tuple(m.key for m in CATALOG)


def find_model(key: str) -> GpuModel | None:
    return next((m for m in CATALOG if m.key == key), None)
