"""Crash-safe record of which claims this node has prepared, and how far each got.

Format (versioned JSON with a checksum over the canonical payload):

    {"version": 1, "checksum": "sha256:<hex>", "payload": {"nodeBootId": "...", "claims": {<uid>: {...}}}}

written compact on one line (the payload exactly as the checksum covers it; `jq .` shows it indented; older
plugins wrote it indented, and both read either).

Writes are atomic (temp file, fsync, rename, fsync dir). Reading is lenient: unknown fields are ignored and
missing ones take defaults, so a newer or older plugin can read the file during an upgrade or a rollback. That
is the versioning rule: changes within format `version` 1 are additive (new optional fields, new states an older
reader maps to a safe one); an incompatible change bumps `version`, and a plugin refuses to start on a version
newer than it knows (`NewerCheckpointError`) rather than misread it. A file from before the last reboot is
discarded (nothing prepared survives a reboot: MIG instances and /var/run/cdi are gone). A corrupt file is moved
aside under a unique name instead of making the plugin crash-loop, and the store remembers the loss
(`take_loss`): the engine then rebuilds ownership from what exists on the node rather than treating everything
there as unowned.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from dra_driver import defaults
from dra_driver.errors import DraDriverError
from dra_driver.fsutil import (
    explain_os_error,
    fsync_dir,
    rename_into_place,
    sweep_temp_files,
    temp_file_pattern,
    write_temp,
)

CHECKPOINT_VERSION = 1
DEFAULT_BOOT_ID_PATH = defaults.BOOT_ID_PATH

log = structlog.get_logger(__name__)


class ClaimState(enum.StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"
    # Unprepare has begun releasing the devices: a crash from here on must finish the release (startup does),
    # never "repair" the claim back. An older plugin reads it as an unknown state, i.e. PrepareStarted, and rolls
    # the claim back, which releases the same instances.
    UNPREPARE_STARTED = "UnprepareStarted"


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
class MpsRecord:
    """The MPS control daemon a device is served by, and the limits this device asks of it.

    Recorded in the PrepareStarted record before the daemon is started, so a rollback or the last unprepare stops
    it; the records holding one daemon id are its reference count, and its limits are derived from them."""

    daemon: str  # daemon id: its directory <mps-root>/<daemon>
    active_thread_percentage: int | None = None
    pinned_memory_limit: int | None = None  # bytes
    # A consumable-capacity share: the limits are this share's own (handed to its containers), and the daemon's
    # are the largest of its shares'.
    share: bool = False
    uuid: str | None = None  # what the daemon serves for this device (GPU or MIG UUID), once known
    multi_user: bool = False  # the daemon must serve clients of every UID (-M)


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
    # TimeSlicing: the GPU time-slice interval this device holds ("Default|Short|Medium|Long"); recorded in the
    # PrepareStarted record before it is applied, so a rollback or the last unprepare resets the GPU.
    time_slice: str | None = None
    mps: MpsRecord | None = None


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


# A claim record's canonical JSON, by uid, with the record it was made from (records are immutable: the same object
# encodes the same way). Lets a write re-serialise only the claims that changed.
FragmentCache = dict[str, tuple["ClaimRecord", str]]


def encode(checkpoint: Checkpoint, fragments: FragmentCache | None = None) -> bytes:
    """The file's bytes: the canonical payload (compact, sorted keys: what the checksum covers) written once and
    embedded as is. `fragments` (optional, updated in place) caches each claim's canonical JSON between writes."""
    parts = []
    for uid, rec in sorted(checkpoint.claims.items()):
        cached = fragments.get(uid) if fragments is not None else None
        if cached is not None and cached[0] is rec:
            fragment = cached[1]
        else:
            fragment = _canonical(_encode_claim(rec))
            if fragments is not None:
                fragments[uid] = (rec, fragment)
        parts.append(f"{_canonical(uid)}:{fragment}")
    if fragments is not None and len(fragments) > len(checkpoint.claims):
        for uid in [u for u in fragments if u not in checkpoint.claims]:
            del fragments[uid]
    # Equal to _canonical(payload): keys sorted ("claims" < "nodeBootId"), no whitespace.
    payload = '{"claims":{' + ",".join(parts) + '},"nodeBootId":' + _canonical(checkpoint.node_boot_id) + "}"
    checksum = "sha256:" + hashlib.sha256(payload.encode()).hexdigest()
    # The document with sorted keys as well: checksum, payload, version.
    return f'{{"checksum":"{checksum}","payload":{payload},"version":{CHECKPOINT_VERSION}}}\n'.encode()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def decode(raw: bytes) -> Checkpoint:
    """Lenient decode; raises CorruptCheckpointError on bad JSON, bad checksum or a wrong shape."""
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpointError(f"not JSON: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("payload"), dict):
        raise CorruptCheckpointError("missing 'payload' object")
    version = document.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CorruptCheckpointError(f"'version' must be a positive integer, got {version!r}")
    if version > CHECKPOINT_VERSION:
        raise NewerCheckpointError(
            f"format version {version} was written by a newer plugin; this one reads up to {CHECKPOINT_VERSION}. "
            "Roll forward to that version (a rollback across a format change is not supported), or, with no "
            "claim prepared on the node, remove the file"
        )
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


class NewerCheckpointError(DraDriverError):
    """The file is intact but in a format this plugin does not know. Never quarantined (it is not damaged, and
    a newer plugin needs it back): the plugin refuses to start instead of guessing at claims it cannot read."""


class CheckpointIOError(DraDriverError, OSError):
    """The checkpoint file (or its directory) cannot be read or written. The message names the path, what the
    system said and what to do; it ends up in the claim's error."""


def _checksum(payload: Any) -> str:
    return "sha256:" + hashlib.sha256(_canonical(payload).encode()).hexdigest()


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
    if dev.time_slice is not None:
        out["timeSlice"] = dev.time_slice
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
    if dev.mps is not None:
        mps = {
            "daemon": dev.mps.daemon,
            "activeThreadPercentage": dev.mps.active_thread_percentage,
            "pinnedMemoryLimit": dev.mps.pinned_memory_limit,
            "share": dev.mps.share or None,
            "uuid": dev.mps.uuid,
            "multiUser": dev.mps.multi_user or None,
        }
        out["mps"] = {k: v for k, v in mps.items() if v is not None}
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
    mps_raw = raw.get("mps")
    mps = None
    if isinstance(mps_raw, Mapping):
        mps = MpsRecord(
            daemon=str(mps_raw["daemon"]),
            active_thread_percentage=_opt_int(mps_raw.get("activeThreadPercentage")),
            pinned_memory_limit=_opt_int(mps_raw.get("pinnedMemoryLimit")),
            share=bool(mps_raw.get("share", False)),
            uuid=_opt_str(mps_raw.get("uuid")),
            multi_user=bool(mps_raw.get("multiUser", False)),
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
        time_slice=_opt_str(raw.get("timeSlice")),
        mps=mps,
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


PLUGIN_DIR_HINT = "the plugin dir (--plugin-dir)"


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
        clock_ns: Callable[[], int] = time.time_ns,
        on_loss: Callable[[str], None] | None = None,
        on_write: Callable[[float], None] | None = None,
    ) -> None:
        self.path = path
        self._lock_path = path.with_name(path.name + ".lock")
        self._boot_id = read_boot_id(boot_id_path)
        self._clock_ns = clock_ns
        self._on_loss = on_loss
        self.on_write = on_write  # called with the seconds each durable write took (the metrics)
        self._mutex = threading.Lock()
        # The last checkpoint we read or wrote and the file identity it came from: re-decoding is skipped while
        # the file is unchanged (another process writing it changes inode, size or mtime).
        self._cached: tuple[tuple[int, int, int], Checkpoint] | None = None
        # The last file this store renamed into place, with its identity, set just BEFORE the rename: a reader that
        # finds the new file between the rename and the update of `_cached` is served without the lock as well.
        self._written: tuple[tuple[int, int, int], Checkpoint] | None = None
        # Why the recorded ownership was lost (corrupt file, file deleted under us); None while it is intact.
        self._loss: str | None = None
        self._queue: list[_Ticket] = []
        self._queue_lock = threading.Lock()
        self._fragments: FragmentCache = {}  # used under the locks only

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._mutex:
            fd = self._open_lock()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def _open_lock(self) -> int:
        try:
            return os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            # A read-only plugin dir still lets us read the checkpoint (and answer for prepared claims); writes
            # then fail with their own clear error.
            try:
                return os.open(self._lock_path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                raise CheckpointIOError(
                    explain_os_error(exc, self._lock_path, "opening the checkpoint lock", PLUGIN_DIR_HINT)
                ) from exc

    def exists(self) -> bool:
        """Whether a checkpoint file is there at all (a lost file means lost ownership, see `take_loss`)."""
        return os.path.lexists(self.path)

    def take_loss(self) -> str | None:
        """Why recorded ownership was lost since the last call (then cleared), or None."""
        with self._mutex:
            loss, self._loss = self._loss, None
            return loss

    def _lost(self, reason: str) -> None:
        self._loss = reason
        if self._on_loss is not None:
            self._on_loss(reason)

    def load(self) -> Checkpoint:
        # Fast path without the locks: while the file is the one we last read or wrote (same inode, size, mtime),
        # the cached decode is what a locked read would return. A reader never waits behind another thread's
        # write this way; a write by another process replaces the file (new inode), and is read under the lock.
        try:
            identity = _identity(self.path.stat())
        except OSError:
            identity = None
        for known in (self._cached, self._written):
            if known is not None and known[0] == identity:
                return known[1]
        with self._locked():
            return self._read()

    def update(self, change: Callable[[Checkpoint], Checkpoint]) -> Checkpoint:
        """Apply `change` and make it durable before returning.

        Group commit: changes queued while another thread writes are applied together and written as ONE file
        by whichever caller gets the lock next, so concurrent prepares share the disk flushes. The lock covers
        the read-modify-write up to the rename (the temp file's fsync included); the directory fsync that makes
        the rename durable runs after it, shared with concurrent flushes, while the next batch is already being
        written. Every caller returns only once its change is durable. A change that raises affects only its
        own caller."""
        ticket = _Ticket(change)
        with self._queue_lock:
            self._queue.append(ticket)
        written: list[_Ticket] = []
        started = 0.0
        with self._locked():
            if not ticket.done:
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                try:
                    written, started = self._apply(batch)
                finally:
                    for queued in batch:
                        queued.done = True
                        if queued not in written:
                            queued.durable.set()
        if written:
            self._flush(written, started)
        ticket.durable.wait()
        if ticket.error is not None:
            raise ticket.error
        assert ticket.result is not None
        return ticket.result

    def _apply(self, batch: list[_Ticket]) -> tuple[list[_Ticket], float]:
        """Under the locks: apply the batch's changes and put the new file in place (not yet durable). Returns
        the tickets whose file was renamed into place (to flush) and when the write started."""
        try:
            current = self._read()
        except CheckpointIOError as exc:
            for queued in batch:
                queued.error = exc
            return [], 0.0
        for queued in batch:
            try:
                current = replace(queued.change(current), node_boot_id=self._boot_id)
                queued.result = current
            except Exception as exc:  # handed back to the caller that owns the change
                queued.error = exc
        started = time.monotonic()
        try:
            tmp = write_temp(self.path, encode(current, self._fragments))
            # The file's identity once renamed (a rename keeps inode, size and mtime): readers that find it get
            # this state from `_written` without the lock, from the rename on. What they see is the file as it
            # then is; only a machine crash could still take the rename back, and after one (a reboot) the file
            # is discarded anyway (another boot id). The writers' callers return only once it is durable.
            written = (_identity(os.stat(tmp)), current)
            self._written = written
            try:
                rename_into_place(tmp, self.path)
            except BaseException:
                self._written = None
                raise
            self._cached = written
        except OSError as exc:
            error = CheckpointIOError(explain_os_error(exc, self.path, "writing the checkpoint", PLUGIN_DIR_HINT))
            for queued in batch:
                queued.error = queued.error or error
            return [], 0.0
        return batch, started

    def _flush(self, batch: list[_Ticket], started: float) -> None:
        """After the locks: make the batch's rename durable, then release its callers."""
        try:
            fsync_dir(self.path.parent)
            if self.on_write is not None:
                self.on_write(time.monotonic() - started)
        except OSError as exc:
            error = CheckpointIOError(explain_os_error(exc, self.path, "writing the checkpoint", PLUGIN_DIR_HINT))
            for queued in batch:
                queued.error = queued.error or error
        finally:
            for queued in batch:
                queued.durable.set()

    def sweep_temp_files(self) -> list[Path]:
        """Delete temp files a crash left behind mid-write (`.checkpoint.json.<random>.tmp`). Under the lock, so
        no writer of this checkpoint can be in the middle of using one."""
        pattern = temp_file_pattern(re.escape(self.path.name))
        with self._locked():
            return sweep_temp_files(self.path.parent, lambda name: pattern.fullmatch(name) is not None)

    def _read(self) -> Checkpoint:
        try:
            identity = _identity(self.path.stat())
        except FileNotFoundError:
            if self._cached is not None and self._cached[1].claims:
                # Somebody deleted the file under us: what it recorded is unknown to the file now.
                self._lost(f"{self.path} disappeared while {len(self._cached[1].claims)} claim(s) were recorded")
            self._cached = None
            return Checkpoint(node_boot_id=self._boot_id)
        except OSError as exc:
            raise CheckpointIOError(
                explain_os_error(exc, self.path, "reading the checkpoint", PLUGIN_DIR_HINT)
            ) from exc
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
        except OSError as exc:
            raise CheckpointIOError(
                explain_os_error(exc, self.path, "reading the checkpoint", PLUGIN_DIR_HINT)
            ) from exc
        try:
            checkpoint = decode(raw)
        except CorruptCheckpointError as exc:
            quarantine = self._quarantine()
            log.warning(
                "checkpoint corrupt; moved aside, ownership is rebuilt from what exists on the node",
                path=str(self.path),
                quarantined_to=str(quarantine),
                reason=str(exc),
            )
            self._lost(f"{self.path} was corrupt ({exc}); moved to {quarantine.name}")
            return Checkpoint(node_boot_id=self._boot_id)
        if checkpoint.node_boot_id and self._boot_id and checkpoint.node_boot_id != self._boot_id:
            log.info(
                "checkpoint is from before the last reboot; nothing prepared survives a reboot, discarding it",
                path=str(self.path),
                claims=len(checkpoint.claims),
            )
            return Checkpoint(node_boot_id=self._boot_id)
        return checkpoint

    def _quarantine(self) -> Path:
        """Move the corrupt file to `checkpoint.json.corrupt-<unix ns>-<pid>[-n]`, never over an earlier one (a
        hard link fails if the name exists, so two quarantines in the same instant cannot collide)."""
        base = f"{self.path.name}.corrupt-{self._clock_ns()}-{os.getpid()}"
        for attempt in range(1000):
            target = self.path.with_name(base if attempt == 0 else f"{base}-{attempt}")
            try:
                os.link(self.path, target)
            except FileExistsError:
                continue
            except OSError:
                # A filesystem without hard links: the unique name alone has to do.
                if os.path.lexists(target):
                    continue
                os.replace(self.path, target)
                return target
            os.unlink(self.path)
            fsync_dir(self.path.parent)
            return target
        raise CheckpointIOError(f"could not find a free quarantine name for {self.path} (tried {base}-1..999)")


@dataclass(eq=False)
class _Ticket:
    change: Callable[[Checkpoint], Checkpoint]
    done: bool = False  # taken by a batch (under the locks)
    result: Checkpoint | None = None
    error: Exception | None = None
    durable: threading.Event = field(default_factory=threading.Event)  # set once the outcome is final


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns)
