"""Plain values exchanged with an NVML backend.

Everything here is immutable and free of ctypes, so the inventory, the slice builder and the
prepare engine never see pynvml's handles, byref arrays or c_uint quirks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from dra_driver.errors import DraDriverError
from dra_driver.observability.usage import UsageSample


class NvmlReturn(enum.IntEnum):
    """NVML return codes the driver distinguishes (values as in nvml.h)."""

    SUCCESS = 0
    UNINITIALIZED = 1
    INVALID_ARGUMENT = 2
    NOT_SUPPORTED = 3
    NO_PERMISSION = 4
    ALREADY_INITIALIZED = 5
    NOT_FOUND = 6
    INSUFFICIENT_SIZE = 7
    INSUFFICIENT_POWER = 8
    DRIVER_NOT_LOADED = 9
    TIMEOUT = 10
    IRQ_ISSUE = 11
    LIBRARY_NOT_FOUND = 12
    FUNCTION_NOT_FOUND = 13
    CORRUPTED_INFOROM = 14
    GPU_IS_LOST = 15
    RESET_REQUIRED = 16
    OPERATING_SYSTEM = 17
    LIB_RM_VERSION_MISMATCH = 18
    IN_USE = 19
    MEMORY = 20
    NO_DATA = 21
    VGPU_ECC_NOT_SUPPORTED = 22
    INSUFFICIENT_RESOURCES = 23
    FREQ_NOT_SUPPORTED = 24
    ARGUMENT_VERSION_MISMATCH = 25
    DEPRECATED = 26
    NOT_READY = 27
    GPU_NOT_FOUND = 28
    INVALID_STATE = 29
    UNKNOWN = 999

    @classmethod
    def from_code(cls, code: int) -> NvmlReturn:
        try:
            return cls(code)
        except ValueError:
            return cls.UNKNOWN


class NvmlError(DraDriverError):
    """An NVML call failed. `code` is the NVML return code; `call` names the operation."""

    def __init__(self, code: NvmlReturn | int, call: str = "", detail: str = "") -> None:
        self.code = NvmlReturn.from_code(int(code))
        self.call = call
        self.detail = detail
        text = f"{call}: " if call else ""
        text += f"NVML_ERROR_{self.code.name}"
        if detail:
            text += f" ({detail})"
        super().__init__(text)


class NvmlUnavailableError(DraDriverError, RuntimeError):
    """NVML cannot be used at all on this machine (no library, no kernel driver)."""


class NvmlLibraryStaleError(NvmlUnavailableError):
    """A re-init after a driver upgrade: the NVML library this process loaded belongs to the old driver
    (LIB_RM_VERSION_MISMATCH). A process cannot unload it (pynvml holds it for the process's life), so only a new
    process gets the new driver's library (docs/nvml-real.md, "After a driver upgrade")."""


class Architecture(enum.IntEnum):
    """nvmlDeviceArchitecture_t values."""

    KEPLER = 2
    MAXWELL = 3
    PASCAL = 4
    VOLTA = 5
    TURING = 6
    AMPERE = 7
    ADA = 8
    HOPPER = 9
    BLACKWELL = 10
    UNKNOWN = 0xFFFFFFFF

    @classmethod
    def from_code(cls, code: int) -> Architecture:
        try:
            return cls(code)
        except ValueError:
            return cls.UNKNOWN

    @property
    def label(self) -> str:
        return self.name.capitalize() if self is not Architecture.UNKNOWN else "Unknown"


class TopologyLevel(enum.IntEnum):
    """nvmlGpuTopologyLevel_t: PCIe distance between two GPUs (not NVLink)."""

    INTERNAL = 0
    SINGLE = 10
    MULTIPLE = 20
    HOSTBRIDGE = 30
    NODE = 40
    SYSTEM = 50


class NvLinkRemoteType(enum.IntEnum):
    GPU = 0
    IBMNPU = 1
    SWITCH = 2
    UNKNOWN = 0xFF


class FabricState(enum.IntEnum):
    """nvmlGpuFabricState_t: how far the GPU's registration with the NVLink fabric (Fabric Manager) got."""

    NOT_SUPPORTED = 0
    NOT_STARTED = 1
    IN_PROGRESS = 2
    COMPLETED = 3


class FabricHealth(enum.IntEnum):
    """The v3 struct's healthSummary (NVML_GPU_FABRIC_HEALTH_SUMMARY_*); NOT_SUPPORTED is what nvidia-smi shows as
    "N/A" (older drivers and structs have no summary at all)."""

    NOT_SUPPORTED = 0
    HEALTHY = 1
    UNHEALTHY = 2
    LIMITED_CAPACITY = 3

    @classmethod
    def from_code(cls, code: int) -> FabricHealth:
        try:
            return cls(code)
        except ValueError:
            return cls.NOT_SUPPORTED


class ComputeMode(enum.IntEnum):
    DEFAULT = 0
    EXCLUSIVE_THREAD = 1
    PROHIBITED = 2
    EXCLUSIVE_PROCESS = 3


class TimeSlice(enum.IntEnum):
    """The compute-policy time-slice of a physical GPU (`nvidia-smi compute-policy --set-timeslice <n>`)."""

    DEFAULT = 0
    SHORT = 1
    MEDIUM = 2
    LONG = 3

    @property
    def label(self) -> str:
        """The name the opaque config and the inventory use: Default, Short, Medium, Long."""
        return self.name.capitalize()


# nvmlEventType masks.
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID_CRITICAL = 0x8
# gpuInstanceId / computeInstanceId in an event that is not attributable to a MIG instance.
NO_INSTANCE = 0xFFFFFFFF


@dataclass(frozen=True)
class SystemInfo:
    """The node's NVIDIA driver, CUDA driver API and NVML versions."""

    driver_version: str  # e.g. "580.105.08"
    cuda_driver_version: int  # e.g. 13000 == 13.0
    nvml_version: str

    @property
    def cuda_version(self) -> str:
        """CUDA driver API version as "major.minor"."""
        v = self.cuda_driver_version
        return f"{v // 1000}.{(v % 1000) // 10}"


@dataclass(frozen=True)
class GpuInfo:
    """Identity of one physical GPU."""

    index: int
    minor: int
    uuid: str
    name: str
    brand: str  # e.g. "Nvidia", "Tesla"
    architecture: Architecture
    cuda_compute_capability: tuple[int, int]
    memory_total_bytes: int | None  # None when NVML reports NOT_SUPPORTED
    pci_bus_id: str  # normalised: lower case, 4-digit domain, e.g. "0000:53:00.0"
    pci_device_id: int  # e.g. 0x233010DE
    serial: str | None = None
    multiprocessors: int | None = None  # SM count of the whole GPU, None when NVML cannot tell


@dataclass(frozen=True)
class MigMode:
    """A GPU's MIG mode now and after its next reset."""

    current: bool
    pending: bool

    @property
    def change_pending(self) -> bool:
        return self.current != self.pending


@dataclass(frozen=True)
class Placement:
    """A GPU-instance placement in memory slices: [start, start + size)."""

    start: int
    size: int

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.size)

    def overlaps(self, other: Placement) -> bool:
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(frozen=True)
class GpuInstanceProfile:
    """One GPU-instance profile: `index` is the NVML_GPU_INSTANCE_PROFILE_* constant, `id` the
    profile ID used by every other call (and shown by `nvidia-smi mig -lgip`)."""

    index: int
    id: int
    name: str  # canonical, e.g. "1g.10gb", "1g.10gb+me"
    slice_count: int  # compute slices
    instance_count: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    memory_mib: int
    placements: tuple[Placement, ...] = ()

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 1024 * 1024


@dataclass(frozen=True)
class ComputeInstanceProfile:
    """One compute-instance profile inside a GPU instance: `index` the NVML constant, `id` the profile ID."""

    index: int
    id: int
    slice_count: int
    instance_count: int
    multiprocessors: int


@dataclass(frozen=True)
class GpuInstance:
    """A live GPU instance on a MIG-enabled GPU."""

    gpu_uuid: str
    id: int
    profile_id: int
    placement: Placement


@dataclass(frozen=True)
class ComputeInstance:
    """A live compute instance inside a GPU instance."""

    gpu_uuid: str
    gpu_instance_id: int
    id: int
    profile_id: int


@dataclass(frozen=True)
class MigDevice:
    """A live MIG device (a compute instance inside a GPU instance)."""

    uuid: str  # "MIG-…"
    parent_uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    index: int  # position under the parent (GetMigDeviceHandleByIndex)
    memory_bytes: int | None = None


@dataclass(frozen=True)
class NvLink:
    """One active NVLink of a GPU and what is on its far end."""

    link: int
    remote_type: NvLinkRemoteType
    remote_pci_bus_id: str  # normalised like GpuInfo.pci_bus_id


ZERO_CLUSTER_UUID = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class FabricInfo:
    """One GPU's NVLink fabric info (nvmlDeviceGetGpuFabricInfoV, docs/reference/compute-domains.md "NVML fabric")."""

    state: FabricState
    status: NvmlReturn  # the registration's NVML return code; meaningful only when state is COMPLETED
    clique_id: int  # cliqueId, decimal
    cluster_uuid: str  # lower-case dashed UUID text; all zeros on NVLink systems that are not multi-node (HGX)
    health_summary: FabricHealth = FabricHealth.NOT_SUPPORTED  # v3 struct only; NOT_SUPPORTED before it

    @property
    def registered(self) -> bool:
        """The GPU finished joining the fabric without error (the only state in which `status` means anything)."""
        return self.state is FabricState.COMPLETED and self.status is NvmlReturn.SUCCESS

    @property
    def multi_node(self) -> bool:
        """A non-zero cluster UUID: the GPU is in a multi-node NVLink domain (MNNVL), not a single HGX board."""
        return self.cluster_uuid.replace("-", "").strip("0") != ""

    @property
    def clique(self) -> str | None:
        """ "<clusterUuid>.<cliqueId>" when the GPU is registered in a multi-node NVLink fabric, else None."""
        if not self.registered or not self.multi_node:
            return None
        return f"{self.cluster_uuid}.{self.clique_id}"


@dataclass(frozen=True)
class GpuEvent:
    """One NVML event (an Xid, an ECC error) on a GPU, or on one of its MIG instances."""

    gpu_uuid: str
    event_type: int
    data: int  # the Xid for XID events
    gpu_instance_id: int = NO_INSTANCE
    compute_instance_id: int = NO_INSTANCE


@dataclass(frozen=True)
class ProcessInfo:
    """A process NVML lists on a GPU, with its GPU memory when known."""

    pid: int
    used_memory_bytes: int | None = None
    extra: dict[str, str] = field(default_factory=dict, compare=False, hash=False)


# --- usage samples --------------------------------------------------------------------------------

# NVML clock-event (throttle) reason bits (nvml.h `nvmlClocksEventReason*`) and the names the metrics use.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x0000000000000001, "gpu_idle"),
    (0x0000000000000002, "applications_clocks_setting"),
    (0x0000000000000004, "sw_power_cap"),
    (0x0000000000000008, "hw_slowdown"),
    (0x0000000000000010, "sync_boost"),
    (0x0000000000000020, "sw_thermal_slowdown"),
    (0x0000000000000040, "hw_thermal_slowdown"),
    (0x0000000000000080, "hw_power_brake_slowdown"),
    (0x0000000000000100, "display_clock_setting"),
)
# Reasons that mean the GPU runs slower than asked for while working (idle and settings are not throttling).
THROTTLING_REASONS: frozenset[str] = frozenset(
    {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
)


def throttle_reason_names(mask: int) -> tuple[str, ...]:
    """The named reasons set in an NVML clock-event reason mask, in bit order."""
    return tuple(name for bit, name in THROTTLE_REASONS if mask & bit)


@dataclass(frozen=True)
class DeviceUtilisation(UsageSample):
    """One read-only usage sample of a GPU or a MIG device: the metrics' figures (a MIG device reports memory only;
    a GPU without ECC has no ECC counters) and NVML's clock-event mask."""

    throttle_reasons: int | None = None  # nvmlClocksEventReason* bit mask

    @property
    def throttling(self) -> tuple[str, ...] | None:
        """The active throttling reasons (see THROTTLING_REASONS), None when the device cannot tell."""
        if self.throttle_reasons is None:
            return None
        return tuple(n for n in throttle_reason_names(self.throttle_reasons) if n in THROTTLING_REASONS)


def _stable_fraction(key: str, low: float, high: float) -> float:
    """A number in [low, high) fixed by `key` (a small string hash that does not change between processes)."""
    h = 0
    for ch in key:
        h = (h * 131 + ord(ch)) % 1_000_003
    return low + (high - low) * (h / 1_000_003)


def modelled_usage(uuid: str, *, held: bool, memory_total_bytes: int | None, mig: bool) -> DeviceUtilisation:
    """The fake's load model: a device held by a workload runs a steady, deterministic load (utilization 40-90 %,
    memory 30-80 % of the total, power and temperature to match); an idle one reports zero load. A MIG device
    reports memory only, as NVML does."""
    load = _stable_fraction(uuid, 0.40, 0.90) if held else 0.0
    memory_share = _stable_fraction(uuid + "/mem", 0.30, 0.80) if held else 0.0
    used = int(memory_total_bytes * memory_share) if memory_total_bytes is not None else None
    if mig:
        return DeviceUtilisation(memory_used_bytes=used, memory_total_bytes=memory_total_bytes)
    percent = round(load * 100)
    return DeviceUtilisation(
        gpu_utilization_percent=percent,
        memory_utilization_percent=round(percent * 0.6),
        memory_used_bytes=used,
        memory_total_bytes=memory_total_bytes,
        power_watts=round(70.0 + 630.0 * load, 1),
        temperature_celsius=round(32 + 45 * load),
        sm_clock_hertz=(1980 if held else 345) * 1_000_000,
        ecc_corrected_total=0,
        ecc_uncorrected_total=0,
        throttle_reasons=0 if held else 0x1,  # idle GPUs report "gpu_idle", which is not throttling
    )


@dataclass(frozen=True)
class VgpuType:
    """One vGPU type a GPU supports (NVML's nvmlVgpuTypeGet*; docs/vgpu.md): its id, the name NVIDIA's tools print
    ("NVIDIA A100-4C"), its class ("Compute", "Quadro", "NVS"), its framebuffer and how many of it fit on one GPU."""

    id: int
    name: str
    type_class: str
    framebuffer_bytes: int
    max_instances: int


@dataclass(frozen=True)
class VgpuState:
    """What NVML says of one GPU's vGPUs on a vGPU host (docs/vgpu.md): the types it supports
    (nvmlDeviceGetSupportedVgpus), the ids of those it can create now (nvmlDeviceGetCreatableVgpus: empty in MIG
    mode, when full, and, on GPUs that host one type at a time, every other type once a vGPU exists), and the type
    id of each live vGPU (nvmlDeviceGetActiveVgpus, nvmlVgpuInstanceGetType)."""

    supported: tuple[VgpuType, ...]
    creatable: tuple[int, ...] = ()
    active: tuple[int, ...] = ()

    def type_by_id(self, type_id: int) -> VgpuType | None:
        return next((t for t in self.supported if t.id == type_id), None)
