"""Crash-safe record of which claims this node has prepared, and how far each got.

Format (versioned JSON with a checksum over the canonical payload):

    {"version": 1, "checksum": "sha256:<hex>", "payload": {"nodeBootId": "...", "claims": {<uid>: {...}}}}

Writes are atomic (temp file, fsync, rename, fsync dir). Reading is lenient: unknown fields are ignored
and missing ones take defaults, so a newer or older plugin can read the file during an upgrade or a
rollback. A file from before the last reboot is discarded (nothing prepared survives a reboot: MIG
instances and /var/run/cdi are gone). A corrupt file is moved aside with a warning instead of making the
plugin crash-loop.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from dra_driver import defaults
from dra_driver.errors import DraDriverError
from dra_driver.fsutil import atomic_write

CHECKPOINT_VERSION = 1
DEFAULT_BOOT_ID_PATH = defaults.BOOT_ID_PATH

log = structlog.get_logger(__name__)


class ClaimState(enum.StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


@dataclass(frozen=True)
class MigRecord:
    """A MIG device this plugin created (dynamic MIG): its spec and, once created, its live identity."""

    parent_uuid: str
    profile_id: int
    placement_start: int
    placement_size: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    uuid: str | None = None


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...] = ()
    share_id: str | None = None
    gpu_uuid: str | None = None  # the physical GPU (parent for MIG)
    mig: MigRecord | None = None
    sharing: str | None = None  # sharing strategy applied, e.g. "Exclusive"


@dataclass(frozen=True)
class ClaimRecord:
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[PreparedDevice, ...] = ()
    # Devices the allocation assigned to us (known as soon as prepare starts; needed to roll back).
    allocated: tuple[PreparedDevice, ...] = ()


@dataclass(frozen=True)
class Checkpoint:
    node_boot_id: str = ""
    claims: Mapping[str, ClaimRecord] = field(default_factory=dict)

    def with_claim(self, record: ClaimRecord) -> Checkpoint:
        return replace(self, claims={**self.claims, record.uid: record})

    def without_claim(self, uid: str) -> Checkpoint:
        return replace(self, claims={k: v for k, v in self.claims.items() if k != uid})


# --- encoding ------------------------------------------------------------------------------------


def encode(checkpoint: Checkpoint) -> bytes:
    payload = {
        "nodeBootId": checkpoint.node_boot_id,
        "claims": {uid: _encode_claim(rec) for uid, rec in sorted(checkpoint.claims.items())},
    }
    document = {"version": CHECKPOINT_VERSION, "checksum": _checksum(payload), "payload": payload}
    return (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()


def decode(raw: bytes) -> Checkpoint:
    """Lenient decode; raises CorruptCheckpointError on bad JSON, bad checksum or a wrong shape."""
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpointError(f"not JSON: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("payload"), dict):
        raise CorruptCheckpointError("missing 'payload' object")
    payload = document["payload"]
    expected = document.get("checksum")
    if expected != _checksum(payload):
        raise CorruptCheckpointError(f"checksum mismatch (file says {expected!r})")
    try:
        claims = {uid: _decode_claim(uid, rec) for uid, rec in dict(payload.get("claims") or {}).items()}
        return Checkpoint(node_boot_id=str(payload.get("nodeBootId") or ""), claims=claims)
    except (TypeError, ValueError, AttributeError) as exc:
        raise CorruptCheckpointError(f"malformed claim entry: {exc}") from exc


class CorruptCheckpointError(DraDriverError, ValueError):
    pass


def _checksum(payload: Any) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def _encode_device(dev: PreparedDevice) -> dict[str, Any]:
    out: dict[str, Any] = {
        "requestNames": list(dev.request_names),
        "pool": dev.pool,
        "device": dev.device,
        "cdiDeviceIds": list(dev.cdi_device_ids),
    }
    # Optional fields are omitted when unset so older readers never see surprises.
    if dev.share_id is not None:
        out["shareId"] = dev.share_id
    if dev.gpu_uuid is not None:
        out["gpuUuid"] = dev.gpu_uuid
    if dev.sharing is not None:
        out["sharing"] = dev.sharing
    if dev.mig is not None:
        mig = {
            "parentUuid": dev.mig.parent_uuid,
            "profileId": dev.mig.profile_id,
            "placementStart": dev.mig.placement_start,
            "placementSize": dev.mig.placement_size,
            "gpuInstanceId": dev.mig.gpu_instance_id,
            "computeInstanceId": dev.mig.compute_instance_id,
            "uuid": dev.mig.uuid,
        }
        out["mig"] = {k: v for k, v in mig.items() if v is not None}
    return out


def _decode_device(raw: Mapping[str, Any]) -> PreparedDevice:
    mig_raw = raw.get("mig")
    mig = None
    if isinstance(mig_raw, Mapping):
        mig = MigRecord(
            parent_uuid=str(mig_raw["parentUuid"]),
            profile_id=int(mig_raw["profileId"]),
            placement_start=int(mig_raw["placementStart"]),
            placement_size=int(mig_raw.get("placementSize", 0)),
            gpu_instance_id=_opt_int(mig_raw.get("gpuInstanceId")),
            compute_instance_id=_opt_int(mig_raw.get("computeInstanceId")),
            uuid=_opt_str(mig_raw.get("uuid")),
        )
    return PreparedDevice(
        request_names=tuple(str(r) for r in raw.get("requestNames") or ()),
        pool=str(raw["pool"]),
        device=str(raw["device"]),
        cdi_device_ids=tuple(str(c) for c in raw.get("cdiDeviceIds") or ()),
        share_id=_opt_str(raw.get("shareId")),
        gpu_uuid=_opt_str(raw.get("gpuUuid")),
        mig=mig,
        sharing=_opt_str(raw.get("sharing")),
    )


def _encode_claim(rec: ClaimRecord) -> dict[str, Any]:
    return {
        "namespace": rec.namespace,
        "name": rec.name,
        "state": rec.state.value,
        "devices": [_encode_device(d) for d in rec.devices],
        "allocated": [_encode_device(d) for d in rec.allocated],
    }


def _decode_claim(uid: str, raw: Mapping[str, Any]) -> ClaimRecord:
    state_raw = raw.get("state", ClaimState.PREPARE_STARTED.value)
    # An unknown (newer) state is treated as "started": the safe choice is to roll it back.
    state = ClaimState(state_raw) if state_raw in ClaimState._value2member_map_ else ClaimState.PREPARE_STARTED
    return ClaimRecord(
        uid=uid,
        namespace=str(raw.get("namespace", "")),
        name=str(raw.get("name", "")),
        state=state,
        devices=tuple(_decode_device(d) for d in raw.get("devices") or ()),
        allocated=tuple(_decode_device(d) for d in raw.get("allocated") or ()),
    )


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


# --- storage ---------------------------------------------------------------------------------------


def read_boot_id(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


class CheckpointStore:
    """The single reader/writer of the checkpoint file. `update` is a locked read-modify-write.

    The in-process lock serialises threads; an flock on a sibling lock file serialises two plugin
    processes on one node (during a rolling update).
    """

    def __init__(
        self,
        path: Path,
        *,
        boot_id_path: Path = DEFAULT_BOOT_ID_PATH,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self._lock_path = path.with_name(path.name + ".lock")
        self._boot_id = read_boot_id(boot_id_path)
        self._clock = clock
        self._mutex = threading.Lock()
        # The last checkpoint we read or wrote and the file identity it came from: re-decoding is skipped while
        # the file is unchanged (another process writing it changes inode, size or mtime).
        self._cached: tuple[tuple[int, int, int], Checkpoint] | None = None
        self._queue: list[_Ticket] = []
        self._queue_lock = threading.Lock()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._mutex:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def load(self) -> Checkpoint:
        with self._locked():
            return self._read()

    def update(self, change: Callable[[Checkpoint], Checkpoint]) -> Checkpoint:
        """Apply `change` and make it durable before returning.

        Group commit: changes queued while another thread writes are applied together and written with ONE
        fsync by whichever caller gets the lock next, so concurrent prepares share the disk flush. A change
        that raises affects only its own caller."""
        ticket = _Ticket(change)
        with self._queue_lock:
            self._queue.append(ticket)
        with self._locked():
            if not ticket.done:
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                current = self._read()
                for queued in batch:
                    try:
                        current = replace(queued.change(current), node_boot_id=self._boot_id)
                        queued.result = current
                    except Exception as exc:  # handed back to the caller that owns the change
                        queued.error = exc
                try:
                    atomic_write(self.path, encode(current))
                    self._cached = (_identity(self.path.stat()), current)
                except OSError as exc:
                    for queued in batch:
                        queued.error = queued.error or exc
                finally:
                    for queued in batch:
                        queued.done = True
        if ticket.error is not None:
            raise ticket.error
        assert ticket.result is not None
        return ticket.result

    def _read(self) -> Checkpoint:
        try:
            identity = _identity(self.path.stat())
        except FileNotFoundError:
            return Checkpoint(node_boot_id=self._boot_id)
        if self._cached is not None and self._cached[0] == identity:
            return self._cached[1]
        checkpoint = self._read_file()
        self._cached = (identity, checkpoint) if self.path.exists() else None
        return checkpoint

    def _read_file(self) -> Checkpoint:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return Checkpoint(node_boot_id=self._boot_id)
        try:
            checkpoint = decode(raw)
        except CorruptCheckpointError as exc:
            quarantine = self.path.with_name(f"{self.path.name}.corrupt-{int(self._clock())}")
            os.replace(self.path, quarantine)
            log.warning(
                "checkpoint corrupt; moved aside and starting empty",
                path=str(self.path),
                quarantined_to=str(quarantine),
                reason=str(exc),
            )
            return Checkpoint(node_boot_id=self._boot_id)
        if checkpoint.node_boot_id and self._boot_id and checkpoint.node_boot_id != self._boot_id:
            log.info(
                "checkpoint is from before the last reboot; nothing prepared survives a reboot, discarding it",
                path=str(self.path),
                claims=len(checkpoint.claims),
            )
            return Checkpoint(node_boot_id=self._boot_id)
        return checkpoint


@dataclass
class _Ticket:
    change: Callable[[Checkpoint], Checkpoint]
    done: bool = False
    result: Checkpoint | None = None
    error: Exception | None = None


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns)
