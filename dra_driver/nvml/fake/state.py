"""Runtime state of a fake node (what real hardware keeps across a plugin restart) and its file format.

The state is a tree of frozen values; the MIG rules (fake_mig) map one state to the next. On disk it
is a small JSON document written atomically, so a reader in another process never sees half a file.
"""

from __future__ import annotations

import json
import uuid as uuid_module
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Final, Literal, Self

from pydantic import AfterValidator, Field, model_validator

from dra_driver.fsutil import atomic_write
from dra_driver.nvml.fake.pci import PciState, PciStateDoc, pci_to_dict
from dra_driver.nvml.mps import MpsDaemonSpec
from dra_driver.nvml.types import (
    THROTTLE_REASONS,
    ZERO_CLUSTER_UUID,
    ComputeMode,
    DeviceUtilisation,
    FabricHealth,
    FabricInfo,
    FabricState,
    NvmlReturn,
    NvmlUnavailableError,
    Placement,
    TimeSlice,
    throttle_reason_names,
)
from dra_driver.strictdecode import (
    DecodeError,
    Decoder,
    Items,
    NonEmpty,
    NonNegative,
    Positive,
    StrictModel,
    by_name,
    invalid,
)

STATE_KIND = "FakeNvmlState"
STATE_VERSION = 1
ZERO_UUID = ZERO_CLUSTER_UUID


class FakeStateError(NvmlUnavailableError):
    """The fake's state file cannot be used (corrupt, or written for another node). Names the path."""


@dataclass(frozen=True)
class CiState:
    id: int
    profile_id: int
    start: int  # first compute slice inside the GPU instance
    slice_count: int


@dataclass(frozen=True)
class GiState:
    id: int
    profile_id: int
    placement: Placement
    cis: tuple[CiState, ...] = ()  # ordered by CI id


@dataclass(frozen=True)
class BusyEntry:
    """Processes running on a whole GPU (gi None), on a GPU instance (ci None) or on a compute instance."""

    gi: int | None
    ci: int | None
    pids: tuple[int, ...]


@dataclass(frozen=True)
class GpuState:
    uuid: str
    mig_current: bool = False
    mig_pending: bool = False
    compute_mode: ComputeMode = ComputeMode.DEFAULT
    time_slice: TimeSlice = TimeSlice.DEFAULT  # compute-policy time-slice (per physical GPU)
    gis: tuple[GiState, ...] = ()  # ordered by GI id
    busy: tuple[BusyEntry, ...] = ()
    persistence_mode: bool = False  # driver state: lost when the GPU is unbound from nvidia

    def gi(self, gi_id: int) -> GiState | None:
        return next((g for g in self.gis if g.id == gi_id), None)

    def pids(self, gi: int | None = None, ci: int | None = None) -> tuple[int, ...]:
        """Pids at exactly this scope."""
        entry = next((b for b in self.busy if b.gi == gi and b.ci == ci), None)
        return entry.pids if entry is not None else ()

    def pids_within(self, gi: int | None = None, ci: int | None = None) -> tuple[int, ...]:
        """Pids at this scope or any scope below it (a GI's pids include its CIs' pids)."""
        found: list[int] = []
        for b in self.busy:
            if gi is not None and b.gi != gi:
                continue
            if ci is not None and b.ci != ci:
                continue
            found.extend(b.pids)
        return tuple(found)


@dataclass(frozen=True)
class MpsShareState:
    share_id: str
    claim: str
    active_thread_percentage: int | None = None
    pinned_memory_limit: int | None = None  # bytes


@dataclass(frozen=True)
class MpsDaemonState:
    """A running MPS control daemon (what `nvidia-cuda-mps-control -d` would be on a real node)."""

    id: str
    pipe_directory: str
    visible_uuids: tuple[str, ...]
    active_thread_percentage: int | None = None
    pinned_memory_limits: tuple[tuple[str, int], ...] = ()  # (visible uuid, bytes), sorted
    shares: tuple[MpsShareState, ...] = ()
    multi_user: bool = False

    @classmethod
    def of(cls, daemon: MpsDaemonSpec | _MpsDaemonDoc) -> MpsDaemonState:
        """The state of a daemon started as `daemon` says (an MpsDaemonSpec, or a daemon read from the state file)."""
        return cls(
            id=daemon.id,
            pipe_directory=daemon.pipe_directory,
            visible_uuids=tuple(daemon.visible_uuids),
            active_thread_percentage=daemon.active_thread_percentage,
            pinned_memory_limits=tuple(sorted(daemon.pinned_memory_limits.items())),
            shares=tuple(
                MpsShareState(s.share_id, s.claim, s.active_thread_percentage, s.pinned_memory_limit)
                for s in daemon.shares
            ),
            multi_user=daemon.multi_user,
        )


@dataclass(frozen=True)
class FakeNodeState:
    node: str
    gpus: tuple[GpuState, ...]  # ordered by GPU index
    mps_daemons: tuple[MpsDaemonState, ...] = ()  # ordered by id
    # Usage set explicitly per device UUID (GPU or MIG); None fields fall back to the load model.
    usage: tuple[tuple[str, DeviceUtilisation], ...] = ()  # ordered by uuid
    # Fabric info set at run time per GPU UUID (a fault: registration IN_PROGRESS, an error status, UNHEALTHY);
    # it replaces what the node description says for that GPU until cleared.
    fabric: tuple[tuple[str, FabricInfo], ...] = ()  # ordered by uuid

    def fabric_of(self, uuid: str) -> FabricInfo | None:
        return next((f for k, f in self.fabric if k == uuid), None)

    def with_fabric(self, uuid: str, fabric: FabricInfo | None) -> FakeNodeState:
        rest = [(k, f) for k, f in self.fabric if k != uuid]
        return replace(self, fabric=tuple(sorted(rest + ([(uuid, fabric)] if fabric is not None else []))))
    # PCI functions, drivers and IOMMU groups (nvml/fake/pci.py); None: as the node booted (older state files)
    pci: PciState | None = None
    # vGPUs (nvml/fake/vgpu.py): the type id of each SR-IOV virtual function that has one, by VF address, sorted.
    vgpu: tuple[tuple[str, int], ...] = ()
    # Mediated devices (nvml/fake/vgpu.py, `vgpu_mdev=true`): (UUID, parent GPU bus id, type id, IOMMU group), sorted.
    mdevs: tuple[tuple[str, str, int, int], ...] = ()
    # Fabric Manager partitions active (nvml/fake/fmpartitions.py, `fabric_partitions=true`): their ids, sorted.
    fm_active: tuple[int, ...] = ()

    def usage_of(self, uuid: str) -> DeviceUtilisation | None:
        return next((u for k, u in self.usage if k == uuid), None)

    def with_usage(self, uuid: str, usage: DeviceUtilisation | None) -> FakeNodeState:
        rest = [(k, u) for k, u in self.usage if k != uuid]
        return replace(self, usage=tuple(sorted(rest + ([(uuid, usage)] if usage is not None else []))))

    def gpu(self, uuid: str) -> GpuState:
        for g in self.gpus:
            if g.uuid == uuid:
                return g
        raise KeyError(uuid)

    def with_gpu(self, new: GpuState) -> FakeNodeState:
        return replace(self, gpus=tuple(new if g.uuid == new.uuid else g for g in self.gpus))


# --- JSON codec ---------------------------------------------------------------------------------


def state_to_dict(state: FakeNodeState) -> dict[str, object]:
    return {
        "kind": STATE_KIND,
        "version": STATE_VERSION,
        "node": state.node,
        "gpus": [_gpu_to_dict(g) for g in state.gpus],
        "mps_daemons": [_mps_to_dict(d) for d in state.mps_daemons],
        "usage": {uuid: _usage_to_dict(u) for uuid, u in state.usage},
        "fabric": {uuid: fabric_to_dict(f) for uuid, f in state.fabric},
        **({"pci": pci_to_dict(state.pci)} if state.pci is not None else {}),
        **({"vgpu": dict(state.vgpu)} if state.vgpu else {}),
        **({"mdevs": {u: {"gpu": g, "type": t, "group": n} for u, g, t, n in state.mdevs}} if state.mdevs else {}),
        **({"fm_active": list(state.fm_active)} if state.fm_active else {}),
    }


def fabric_to_dict(f: FabricInfo) -> dict[str, object]:
    """The node file's and the state file's spelling of one GPU's fabric info."""
    return {
        "state": f.state.name.lower(),
        "status": f.status.name.lower(),
        "clique_id": f.clique_id,
        "cluster_uuid": f.cluster_uuid,
        "health": f.health_summary.name.lower(),
    }


# The state file's key of each DeviceUtilisation field it stores as is, for the encoder and the decoder alike;
# sm_clock_mhz and throttle are converted (MHz, reason names) and written out on their own.
_USAGE_KEYS: Final = (
    ("utilization", "gpu_utilization_percent"),
    ("memory_utilization", "memory_utilization_percent"),
    ("memory_used", "memory_used_bytes"),
    ("power", "power_watts"),
    ("temperature", "temperature_celsius"),
    ("ecc_corrected", "ecc_corrected_total"),
    ("ecc_uncorrected", "ecc_uncorrected_total"),
)


def _usage_to_dict(u: DeviceUtilisation) -> dict[str, object]:
    doc: dict[str, object] = {key: getattr(u, field) for key, field in _USAGE_KEYS}
    if u.sm_clock_hertz is not None:
        doc["sm_clock_mhz"] = u.sm_clock_hertz // 1_000_000
    if u.throttle_reasons is not None:
        doc["throttle"] = list(throttle_reason_names(u.throttle_reasons))
    return {k: v for k, v in doc.items() if v is not None}


def _mps_to_dict(d: MpsDaemonState) -> dict[str, object]:
    return {
        "id": d.id,
        "pipe_directory": d.pipe_directory,
        "visible_uuids": list(d.visible_uuids),
        "active_thread_percentage": d.active_thread_percentage,
        "pinned_memory_limits": dict(d.pinned_memory_limits),
        "multi_user": d.multi_user,
        "shares": [
            {
                "share_id": s.share_id,
                "claim": s.claim,
                "active_thread_percentage": s.active_thread_percentage,
                "pinned_memory_limit": s.pinned_memory_limit,
            }
            for s in d.shares
        ],
    }


def _gpu_to_dict(g: GpuState) -> dict[str, object]:
    return {
        "uuid": g.uuid,
        "mig": {"current": g.mig_current, "pending": g.mig_pending},
        "compute_mode": g.compute_mode.name,
        "time_slice": g.time_slice.name,
        "gpu_instances": [
            {
                "id": gi.id,
                "profile_id": gi.profile_id,
                "placement": {"start": gi.placement.start, "size": gi.placement.size},
                "compute_instances": [
                    {"id": ci.id, "profile_id": ci.profile_id, "start": ci.start, "slice_count": ci.slice_count}
                    for ci in gi.cis
                ],
            }
            for gi in g.gis
        ],
        "busy": [{"gi": b.gi, "ci": b.ci, "pids": list(b.pids)} for b in g.busy],
        **({"persistence_mode": True} if g.persistence_mode else {}),
    }


class _CiDoc(StrictModel):
    id: NonNegative
    profile_id: NonNegative
    start: NonNegative
    slice_count: Positive


class _PlacementDoc(StrictModel):
    start: NonNegative
    size: Positive


class _GiDoc(StrictModel):
    id: NonNegative
    profile_id: NonNegative
    placement: _PlacementDoc
    compute_instances: Items[_CiDoc]

    def value(self) -> GiState:
        cis = sorted((CiState(c.id, c.profile_id, c.start, c.slice_count) for c in self.compute_instances), key=_id)
        return GiState(self.id, self.profile_id, Placement(self.placement.start, self.placement.size), tuple(cis))


class _MigModeDoc(StrictModel):
    current: bool
    pending: bool


class _BusyDoc(StrictModel):
    gi: NonNegative | None  # None: the whole GPU
    ci: NonNegative | None  # None: the whole GPU instance
    pids: Items[Positive]


class _GpuDoc(StrictModel):
    uuid: NonEmpty
    mig: _MigModeDoc
    compute_mode: Annotated[ComputeMode, by_name(ComputeMode, upper=True)]
    # Absent in files written before time-slicing existed: the GPU is at its default.
    time_slice: Annotated[TimeSlice, by_name(TimeSlice, upper=True)] = TimeSlice.DEFAULT
    gpu_instances: Items[_GiDoc]
    busy: Items[_BusyDoc]
    persistence_mode: bool = False

    def value(self) -> GpuState:
        return GpuState(
            uuid=self.uuid,
            mig_current=self.mig.current,
            mig_pending=self.mig.pending,
            compute_mode=self.compute_mode,
            time_slice=self.time_slice,
            gis=tuple(sorted((gi.value() for gi in self.gpu_instances), key=_id)),
            busy=tuple(BusyEntry(b.gi, b.ci, b.pids) for b in self.busy),
            persistence_mode=self.persistence_mode,
        )


class _MpsShareDoc(StrictModel):
    share_id: NonEmpty
    claim: str
    active_thread_percentage: Positive | None
    pinned_memory_limit: Positive | None


class _MpsDaemonDoc(StrictModel):
    id: NonEmpty
    pipe_directory: NonEmpty
    visible_uuids: Items[NonEmpty]
    active_thread_percentage: Positive | None
    pinned_memory_limits: dict[str, Positive]
    shares: Items[_MpsShareDoc]
    multi_user: bool = False

    def value(self) -> MpsDaemonState:
        return MpsDaemonState.of(self)


Percent = Annotated[int, Field(ge=0, le=100)]
# THROTTLE_REASONS' names (a test holds them equal).
ThrottleName = Literal[
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
]


class _UsageDoc(StrictModel):
    """What a test or a demo sets by hand; every field optional (unset: the load model decides)."""

    utilization: Percent | None = None
    memory_utilization: Percent | None = None
    memory_used: NonNegative | None = None  # bytes
    power: Annotated[float, Field(ge=0)] | None = None  # watts
    temperature: int | None = None  # Celsius
    sm_clock_mhz: NonNegative | None = None
    ecc_corrected: NonNegative | None = None
    ecc_uncorrected: NonNegative | None = None
    throttle: Items[ThrottleName] | None = None

    def value(self) -> DeviceUtilisation:
        bits = dict((name, bit) for bit, name in THROTTLE_REASONS)
        return DeviceUtilisation(
            **{field: getattr(self, key) for key, field in _USAGE_KEYS},
            sm_clock_hertz=self.sm_clock_mhz * 1_000_000 if self.sm_clock_mhz is not None else None,
            throttle_reasons=sum(bits[n] for n in set(self.throttle)) if self.throttle is not None else None,
        )


def _uuid_text(text: str) -> str:
    try:
        return str(uuid_module.UUID(text))
    except ValueError:
        raise ValueError(f'not a UUID: {text!r}; write it like "{ZERO_UUID}"') from None


class FabricDoc(StrictModel):
    """One GPU's fabric info as node files and the state file write it (docs/fake-nvml.md)."""

    state: Annotated[FabricState, by_name(FabricState)]
    status: Annotated[NvmlReturn, by_name(NvmlReturn)] = NvmlReturn.SUCCESS
    clique_id: Annotated[int, Field(ge=0, le=0xFFFFFFFF)] = 0
    cluster_uuid: Annotated[str, AfterValidator(_uuid_text)] = ZERO_UUID
    health: Annotated[FabricHealth, by_name(FabricHealth)] = FabricHealth.NOT_SUPPORTED

    def value(self) -> FabricInfo:
        return FabricInfo(self.state, self.status, self.clique_id, self.cluster_uuid, self.health)


def usage_from_dict(doc: object) -> DeviceUtilisation:
    """Decode one device's usage (the state file's `usage.<uuid>`); raises DecodeError naming bad fields."""
    return _decode_usage(doc).value()


def _state_version(version: int) -> int:
    if version != STATE_VERSION:
        raise ValueError(f"unsupported state version {version}; this driver reads {STATE_VERSION}")
    return version


class _MdevDoc(StrictModel):
    gpu: NonEmpty
    type: Positive
    group: NonNegative


class _StateDoc(StrictModel):
    kind: Literal["FakeNvmlState"]
    version: Annotated[int, AfterValidator(_state_version)]
    node: NonEmpty
    gpus: Items[_GpuDoc]
    # Absent in files written before MPS existed: no daemon runs.
    mps_daemons: Items[_MpsDaemonDoc] = ()
    # Absent in files written before usage existed: every device follows the load model.
    usage: dict[NonEmpty, _UsageDoc] = {}
    # Absent in files written before fabric faults existed: every GPU reports what its node description says.
    fabric: dict[NonEmpty, FabricDoc] = {}
    # Absent in files written before PCI existed: the functions are as the node booted.
    pci: PciStateDoc | None = None
    # Absent in files written before vGPU existed, or with no vGPU: no VF has a vGPU type.
    vgpu: dict[NonEmpty, Positive] = {}
    # Absent without mediated devices.
    mdevs: dict[NonEmpty, _MdevDoc] = {}
    # Absent without an active Fabric Manager partition.
    fm_active: Items[NonNegative] = ()

    @model_validator(mode="after")
    def _unique_gpus(self) -> Self:
        uuids = [g.uuid for g in self.gpus]
        if len(set(uuids)) != len(uuids):
            raise invalid("duplicate GPU uuid", "gpus")
        return self


def _id(item: GiState | CiState) -> int:
    return item.id


_decode = Decoder[_StateDoc](_StateDoc)
_decode_usage = Decoder[_UsageDoc](_UsageDoc)


def state_from_dict(doc: object) -> FakeNodeState:
    """Strictly decode a state document; raises DecodeError naming every bad field."""
    state = _decode(doc)
    daemons = tuple(sorted((d.value() for d in state.mps_daemons), key=lambda d: d.id))
    usage = tuple(sorted((uuid, u.value()) for uuid, u in state.usage.items()))
    fabric = tuple(sorted((uuid, f.value()) for uuid, f in state.fabric.items()))
    pci = state.pci.value() if state.pci is not None else None
    return FakeNodeState(
        node=state.node, gpus=tuple(g.value() for g in state.gpus), mps_daemons=daemons, usage=usage, fabric=fabric,
        pci=pci, vgpu=tuple(sorted(state.vgpu.items())),
        mdevs=tuple(sorted((u, m.gpu, m.type, m.group) for u, m in state.mdevs.items())),
        fm_active=tuple(sorted(set(state.fm_active))),
    )


# --- files ---------------------------------------------------------------------------------------


def encode_state(state: FakeNodeState) -> bytes:
    return (json.dumps(state_to_dict(state), indent=1, sort_keys=True) + "\n").encode()


def decode_state(data: bytes, path: Path | str) -> FakeNodeState:
    """Parse state file bytes; any problem becomes a FakeStateError that names the file."""
    try:
        doc: object = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FakeStateError(
            f"fake NVML state file {path} is corrupt (not JSON: {exc}); delete it to start over"
        ) from None
    try:
        return state_from_dict(doc)
    except DecodeError as exc:
        raise FakeStateError(f"fake NVML state file {path} is invalid: {exc}; delete it to start over") from None


def read_fake_state(path: Path | str) -> FakeNodeState:
    """Read a state file (for tests and tools). Needs no lock: writers replace the file atomically."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise FakeStateError(f"fake NVML state file {path} does not exist") from None
    return decode_state(data, path)


def write_state_file(path: Path, state: FakeNodeState) -> bytes:
    """Replace `path` atomically: temp file in the same directory, fsync, rename, fsync the directory.
    Returns the bytes written."""
    data = encode_state(state)
    atomic_write(path, data, mode=0o600)
    return data


def state_matches(state: FakeNodeState, uuids: tuple[str, ...]) -> bool:
    return tuple(g.uuid for g in state.gpus) == uuids
