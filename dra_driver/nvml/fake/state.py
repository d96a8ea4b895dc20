"""Runtime state of a fake node (what real hardware keeps across a plugin restart) and its file format.

The state is a tree of frozen values; the MIG rules (fake_mig) map one state to the next. On disk it
is a small JSON document written atomically, so a reader in another process never sees half a file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from dra_driver.fsutil import atomic_write
from dra_driver.nvml.fake.fields import (
    SpecError,
    as_bool,
    as_choice,
    as_int,
    as_list,
    as_mapping,
    as_str,
    check_keys,
    join,
)
from dra_driver.nvml.types import ComputeMode, NvmlUnavailableError, Placement

STATE_KIND = "FakeNvmlState"
STATE_VERSION = 1


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
    gis: tuple[GiState, ...] = ()  # ordered by GI id
    busy: tuple[BusyEntry, ...] = ()

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
class FakeNodeState:
    node: str
    gpus: tuple[GpuState, ...]  # ordered by GPU index

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
    }


def _gpu_to_dict(g: GpuState) -> dict[str, object]:
    return {
        "uuid": g.uuid,
        "mig": {"current": g.mig_current, "pending": g.mig_pending},
        "compute_mode": g.compute_mode.name,
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
    }


def state_from_dict(doc: object) -> FakeNodeState:
    """Strictly decode a state document; raises SpecError naming the field."""
    top = as_mapping(doc, "")
    check_keys(top, "", ("kind", "version", "node", "gpus"), required=("kind", "version", "node", "gpus"))
    if top["kind"] != STATE_KIND:
        raise SpecError("kind", f"expected {STATE_KIND!r}, got {top['kind']!r}")
    version = as_int(top["version"], "version")
    if version != STATE_VERSION:
        raise SpecError("version", f"unsupported state version {version}; this driver reads {STATE_VERSION}")
    gpus = tuple(_gpu_from_dict(item, join("gpus", i)) for i, item in enumerate(as_list(top["gpus"], "gpus")))
    uuids = [g.uuid for g in gpus]
    if len(set(uuids)) != len(uuids):
        raise SpecError("gpus", "duplicate GPU uuid")
    return FakeNodeState(node=as_str(top["node"], "node"), gpus=gpus)


def _opt_int(value: object, path: str) -> int | None:
    return None if value is None else as_int(value, path, minimum=0)


def _gpu_from_dict(item: object, path: str) -> GpuState:
    m = as_mapping(item, path)
    keys = ("uuid", "mig", "compute_mode", "gpu_instances", "busy")
    check_keys(m, path, keys, required=keys)
    mig = as_mapping(m["mig"], join(path, "mig"))
    check_keys(mig, join(path, "mig"), ("current", "pending"), required=("current", "pending"))
    mode = as_choice(m["compute_mode"], join(path, "compute_mode"), [c.name for c in ComputeMode])
    gis: list[GiState] = []
    for i, gi_item in enumerate(as_list(m["gpu_instances"], join(path, "gpu_instances"))):
        gis.append(_gi_from_dict(gi_item, join(join(path, "gpu_instances"), i)))
    busy: list[BusyEntry] = []
    for i, b_item in enumerate(as_list(m["busy"], join(path, "busy"))):
        bpath = join(join(path, "busy"), i)
        b = as_mapping(b_item, bpath)
        check_keys(b, bpath, ("gi", "ci", "pids"), required=("gi", "ci", "pids"))
        pids = tuple(
            as_int(p, join(join(bpath, "pids"), j), minimum=1) for j, p in enumerate(as_list(b["pids"], bpath))
        )
        busy.append(
            BusyEntry(gi=_opt_int(b["gi"], join(bpath, "gi")), ci=_opt_int(b["ci"], join(bpath, "ci")), pids=pids)
        )
    return GpuState(
        uuid=as_str(m["uuid"], join(path, "uuid")),
        mig_current=as_bool(mig["current"], join(path, "mig.current")),
        mig_pending=as_bool(mig["pending"], join(path, "mig.pending")),
        compute_mode=ComputeMode[mode],
        gis=tuple(sorted(gis, key=lambda g: g.id)),
        busy=tuple(busy),
    )


def _gi_from_dict(item: object, path: str) -> GiState:
    m = as_mapping(item, path)
    keys = ("id", "profile_id", "placement", "compute_instances")
    check_keys(m, path, keys, required=keys)
    pl = as_mapping(m["placement"], join(path, "placement"))
    check_keys(pl, join(path, "placement"), ("start", "size"), required=("start", "size"))
    cis: list[CiState] = []
    for i, ci_item in enumerate(as_list(m["compute_instances"], join(path, "compute_instances"))):
        cpath = join(join(path, "compute_instances"), i)
        c = as_mapping(ci_item, cpath)
        ckeys = ("id", "profile_id", "start", "slice_count")
        check_keys(c, cpath, ckeys, required=ckeys)
        cis.append(
            CiState(
                id=as_int(c["id"], join(cpath, "id"), minimum=0),
                profile_id=as_int(c["profile_id"], join(cpath, "profile_id"), minimum=0),
                start=as_int(c["start"], join(cpath, "start"), minimum=0),
                slice_count=as_int(c["slice_count"], join(cpath, "slice_count"), minimum=1),
            )
        )
    return GiState(
        id=as_int(m["id"], join(path, "id"), minimum=0),
        profile_id=as_int(m["profile_id"], join(path, "profile_id"), minimum=0),
        placement=Placement(
            as_int(pl["start"], join(path, "placement.start"), minimum=0),
            as_int(pl["size"], join(path, "placement.size"), minimum=1),
        ),
        cis=tuple(sorted(cis, key=lambda c: c.id)),
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
    except SpecError as exc:
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
