"""Runtime state of a fake node (what real hardware keeps across a plugin restart) and its file format.

The state is a tree of frozen values; the MIG rules (fake_mig) map one state to the next. On disk it
is a small JSON document written atomically, so a reader in another process never sees half a file.
"""

from __future__ import annotations

import json
import uuid as uuid_module
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from dra_driver.errors import DecodeError
from dra_driver.fsutil import atomic_write
from dra_driver.nvml.fake import docread as dr
from dra_driver.nvml.fake.pci import PciState, pci_to_dict, read_pci_state
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

STATE_KIND = "FakeNvmlState"
STATE_VERSION = 1
ZERO_UUID = ZERO_CLUSTER_UUID


class FakeStateError(NvmlUnavailableError):
    """The fake's state file cannot be used (corrupt, or written for another node). Names the path."""


@dataclass(frozen=True)
class CiState:
    """A compute instance the fake holds, inside its GPU instance."""

    id: int
    profile_id: int
    start: int  # first compute slice inside the GPU instance
    slice_count: int


@dataclass(frozen=True)
class GiState:
    """A GPU instance the fake holds, with its compute instances."""

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
    """One fake GPU's mutable state: MIG mode, instances, compute mode, time slice, busy processes."""

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
    """One MPS share a fake daemon serves, for a claim."""

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
    def of(cls, daemon: MpsDaemonSpec) -> MpsDaemonState:
        """The state of a daemon started as `daemon` says."""
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
    """The fake node's whole state file: its GPUs and MPS daemons."""

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


# --- decoding (docread.py: strict, every problem at once, each at its field path) ------------------------------

_CI_FIELDS = (dr.Field("id", dr.NON_NEGATIVE), dr.Field("profile_id", dr.NON_NEGATIVE),
              dr.Field("start", dr.NON_NEGATIVE), dr.Field("slice_count", dr.POSITIVE))  # fmt: skip


def _ci(value: object, path: str) -> CiState:
    return CiState(**dr.fields(value, path, _CI_FIELDS))


_PLACEMENT_FIELDS = (dr.Field("start", dr.NON_NEGATIVE), dr.Field("size", dr.POSITIVE))


def _placement(value: object, path: str) -> Placement:
    return Placement(**dr.fields(value, path, _PLACEMENT_FIELDS))


_GI_FIELDS = (dr.Field("id", dr.NON_NEGATIVE), dr.Field("profile_id", dr.NON_NEGATIVE),
              dr.Field("placement", _placement), dr.Field("compute_instances", dr.items(_ci)))  # fmt: skip


def _gi(value: object, path: str) -> GiState:
    doc = dr.fields(value, path, _GI_FIELDS)
    return GiState(doc["id"], doc["profile_id"], doc["placement"], tuple(sorted(doc["compute_instances"], key=_id)))


_MIG_MODE_FIELDS = (dr.Field("current", dr.boolean), dr.Field("pending", dr.boolean))
_WHOLE = dr.nullable(dr.NON_NEGATIVE)  # None: the whole GPU (gi) or the whole GPU instance (ci)
_BUSY_FIELDS = (dr.Field("gi", _WHOLE), dr.Field("ci", _WHOLE), dr.Field("pids", dr.items(dr.POSITIVE)))


def _busy(value: object, path: str) -> BusyEntry:
    return BusyEntry(**dr.fields(value, path, _BUSY_FIELDS))


_GPU_FIELDS = (
    dr.Field("uuid", dr.NON_EMPTY),
    dr.Field("mig", lambda value, path: dr.fields(value, path, _MIG_MODE_FIELDS)),
    dr.Field("compute_mode", dr.member_named(ComputeMode, upper=True), choices=tuple(m.name for m in ComputeMode)),
    # Absent in files written before time-slicing existed: the GPU is at its default.
    dr.Field("time_slice", dr.member_named(TimeSlice, upper=True), TimeSlice.DEFAULT),
    dr.Field("gpu_instances", dr.items(_gi)),
    dr.Field("busy", dr.items(_busy)),
    dr.Field("persistence_mode", dr.boolean, False),
)


def _gpu(value: object, path: str) -> GpuState:
    doc = dr.fields(value, path, _GPU_FIELDS)
    return GpuState(
        uuid=doc["uuid"],
        mig_current=doc["mig"]["current"],
        mig_pending=doc["mig"]["pending"],
        compute_mode=doc["compute_mode"],
        time_slice=doc["time_slice"],
        gis=tuple(sorted(doc["gpu_instances"], key=_id)),
        busy=doc["busy"],
        persistence_mode=doc["persistence_mode"],
    )


_SHARE_FIELDS = (
    dr.Field("share_id", dr.NON_EMPTY),
    dr.Field("claim", dr.STRING),
    dr.Field("active_thread_percentage", dr.nullable(dr.POSITIVE)),
    dr.Field("pinned_memory_limit", dr.nullable(dr.POSITIVE)),
)


def _share(value: object, path: str) -> MpsShareState:
    return MpsShareState(**dr.fields(value, path, _SHARE_FIELDS))


_DAEMON_FIELDS = (
    dr.Field("id", dr.NON_EMPTY),
    dr.Field("pipe_directory", dr.NON_EMPTY),
    dr.Field("visible_uuids", dr.items(dr.NON_EMPTY)),
    dr.Field("active_thread_percentage", dr.nullable(dr.POSITIVE)),
    dr.Field("pinned_memory_limits", dr.mapping(dr.STRING, dr.POSITIVE)),
    dr.Field("shares", dr.items(_share)),
    dr.Field("multi_user", dr.boolean, False),
)


def _daemon(value: object, path: str) -> MpsDaemonState:
    doc = dr.fields(value, path, _DAEMON_FIELDS)
    return MpsDaemonState(
        id=doc["id"], pipe_directory=doc["pipe_directory"], visible_uuids=doc["visible_uuids"],
        active_thread_percentage=doc["active_thread_percentage"],
        pinned_memory_limits=tuple(sorted(doc["pinned_memory_limits"].items())), shares=doc["shares"],
        multi_user=doc["multi_user"],
    )  # fmt: skip


_PERCENT = dr.nullable(dr.integer(0, 100))
_COUNT = dr.nullable(dr.NON_NEGATIVE)
_THROTTLE_NAMES = tuple(name for _, name in THROTTLE_REASONS)
# What a test or a demo sets by hand; every field optional (unset: the load model decides).
_USAGE_FIELDS = (
    dr.Field("utilization", _PERCENT, None),
    dr.Field("memory_utilization", _PERCENT, None),
    dr.Field("memory_used", _COUNT, None),  # bytes
    dr.Field("power", dr.nullable(dr.number(0)), None),  # watts
    dr.Field("temperature", dr.nullable(dr.integer()), None),  # Celsius
    dr.Field("sm_clock_mhz", _COUNT, None),
    dr.Field("ecc_corrected", _COUNT, None),
    dr.Field("ecc_uncorrected", _COUNT, None),
    dr.Field("throttle", dr.nullable(dr.items(dr.choice(*_THROTTLE_NAMES))), None),
)


def _usage(value: object, path: str) -> DeviceUtilisation:
    doc = dr.fields(value, path, _USAGE_FIELDS)
    bits = {name: bit for bit, name in THROTTLE_REASONS}
    throttle, mhz = doc["throttle"], doc["sm_clock_mhz"]
    return DeviceUtilisation(
        **{field: doc[key] for key, field in _USAGE_KEYS},
        sm_clock_hertz=mhz * 1_000_000 if mhz is not None else None,
        throttle_reasons=sum(bits[n] for n in set(throttle)) if throttle is not None else None,
    )


def _uuid_text(text: str) -> str:
    try:
        return str(uuid_module.UUID(text))
    except ValueError:
        raise ValueError(f'not a UUID: {text!r}; write it like "{ZERO_UUID}"') from None


# One GPU's fabric info as node files and the state file write it (docs/fake-nvml.md).
_FABRIC_FIELDS = (
    dr.Field("state", dr.member_named(FabricState), choices=tuple(m.name.lower() for m in FabricState)),
    dr.Field("status", dr.member_named(NvmlReturn), NvmlReturn.SUCCESS),
    dr.Field("clique_id", dr.integer(0, 0xFFFFFFFF), 0),
    dr.Field("cluster_uuid", dr.string(check=_uuid_text), ZERO_UUID),
    dr.Field("health", dr.member_named(FabricHealth), FabricHealth.NOT_SUPPORTED),
)


def read_fabric(value: object, path: str) -> FabricInfo:
    """One GPU's fabric info as node files and the state file write it; raises docread.Rejected."""
    doc = dr.fields(value, path, _FABRIC_FIELDS)
    return FabricInfo(doc["state"], doc["status"], doc["clique_id"], doc["cluster_uuid"], doc["health"])


def usage_from_dict(doc: object) -> DeviceUtilisation:
    """Decode one device's usage (the state file's `usage.<uuid>`); raises DecodeError naming bad fields."""
    try:
        return _usage(doc, "")
    except dr.Rejected as exc:
        raise DecodeError.of(exc.problems) from None


def _state_version(version: int) -> int:
    if version != STATE_VERSION:
        raise ValueError(f"unsupported state version {version}; this driver reads {STATE_VERSION}")
    return version


_MDEV_FIELDS = (dr.Field("gpu", dr.NON_EMPTY), dr.Field("type", dr.POSITIVE), dr.Field("group", dr.NON_NEGATIVE))


def _mdev(value: object, path: str) -> tuple[str, int, int]:
    doc = dr.fields(value, path, _MDEV_FIELDS)
    return doc["gpu"], doc["type"], doc["group"]


_STATE_FIELDS = (
    dr.Field("kind", dr.choice(STATE_KIND), choices=(STATE_KIND,)),
    dr.Field("version", dr.then(dr.integer(), _state_version)),
    dr.Field("node", dr.NON_EMPTY),
    dr.Field("gpus", dr.items(_gpu)),
    # Absent in files written before MPS existed: no daemon runs.
    dr.Field("mps_daemons", dr.items(_daemon), ()),
    # Absent in files written before usage existed: every device follows the load model.
    dr.Field("usage", dr.mapping(dr.NON_EMPTY, _usage), {}),
    # Absent in files written before fabric faults existed: every GPU reports what its node description says.
    dr.Field("fabric", dr.mapping(dr.NON_EMPTY, read_fabric), {}),
    # Absent in files written before PCI existed: the functions are as the node booted.
    dr.Field("pci", dr.nullable(read_pci_state), None),
    # Absent in files written before vGPU existed, or with no vGPU: no VF has a vGPU type.
    dr.Field("vgpu", dr.mapping(dr.NON_EMPTY, dr.POSITIVE), {}),
    # Absent without mediated devices.
    dr.Field("mdevs", dr.mapping(dr.NON_EMPTY, _mdev), {}),
    # Absent without an active Fabric Manager partition.
    dr.Field("fm_active", dr.items(dr.NON_NEGATIVE), ()),
)


def _id(item: GiState | CiState) -> int:
    return item.id


def state_from_dict(doc: object) -> FakeNodeState:
    """Strictly decode a state document; raises DecodeError naming every bad field."""
    try:
        state = dr.fields(doc, "", _STATE_FIELDS)
    except dr.Rejected as exc:
        raise DecodeError.of(exc.problems) from None
    gpus: tuple[GpuState, ...] = state["gpus"]
    uuids = [g.uuid for g in gpus]
    if len(set(uuids)) != len(uuids):
        raise DecodeError("gpus", "duplicate GPU uuid")
    mdevs: dict[str, tuple[str, int, int]] = state["mdevs"]
    return FakeNodeState(
        node=state["node"], gpus=gpus, mps_daemons=tuple(sorted(state["mps_daemons"], key=lambda d: d.id)),
        usage=tuple(sorted(state["usage"].items())), fabric=tuple(sorted(state["fabric"].items())),
        pci=state["pci"], vgpu=tuple(sorted(state["vgpu"].items())),
        mdevs=tuple(sorted((u, *m) for u, m in mdevs.items())),
        fm_active=tuple(sorted(set(state["fm_active"]))),
    )  # fmt: skip


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
