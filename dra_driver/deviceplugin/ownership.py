"""Which world holds each GPU of the node: the device plugin (`nvidia.com/gpu`) or DRA (a claim being prepared).

One record on the node, `<plugin dir>/device-plugin-ownership.json`, read and changed under an exclusive flock of
`<file>.lock`, so two plugin instances of a rolling upgrade and the two worlds inside one process see each other's
changes. Every change is one durable atomic write (`fsutil.atomic_write`: temp file, fsync, rename, directory
fsync): a crash leaves the old record or the new one, never a torn one. The file is read as untrusted input: a
record that does not decode is set aside as `<file>.corrupt-<time>` and the plugin starts from an empty one,
which is safe because the kubelet's PodResources answer adopts every GPU a running pod holds again
(docs/device-plugin.md "Who holds a GPU").

DRA's prepared claims are in the claim checkpoint; what this record adds for DRA is the short window between the
claim guard's check and the checkpoint write (a `dra` reservation, claim UID by GPU).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import structlog

from dra_driver.errors import DraDriverError
from dra_driver.fsutil import atomic_write, sweep_temp_files, temp_file_pattern

log = structlog.get_logger(__name__)

FILE_NAME = "device-plugin-ownership.json"
FORMAT_VERSION = 1
_MAX_BYTES = 1 << 20  # a node has at most a few dozen GPUs; anything larger is not ours


class OwnershipError(DraDriverError):
    """The ownership record cannot be read or written (the message names the file and the fix)."""


@dataclass(frozen=True)
class Reservation:
    """A GPU held by a DRA claim between the guard's check and the claim checkpoint."""

    claim_uid: str
    at: float  # unix seconds


@dataclass(frozen=True)
class Allocated:
    """A GPU the device plugin's Allocate gave a container: when, and the CDI spec (allocation key) naming it."""

    at: float  # unix seconds
    spec: str  # cdispecs.allocation_key; "" for a GPU adopted from PodResources (its spec is the old plugin's)


@dataclass(frozen=True)
class Ownership:
    """GPU UUID -> the device plugin's allocation; GPU UUID -> DRA's reservation."""

    allocated: Mapping[str, Allocated] = field(default_factory=dict)
    dra: Mapping[str, Reservation] = field(default_factory=dict)

    def with_allocated(self, uuids: set[str], at: float, spec: str) -> Ownership:
        return replace(self, allocated={**self.allocated, **{u: Allocated(at, spec) for u in uuids}})

    def specs_in_use(self) -> set[str]:
        return {a.spec for a in self.allocated.values() if a.spec}

    def without_allocated(self, uuids: set[str]) -> Ownership:
        return replace(self, allocated={u: t for u, t in self.allocated.items() if u not in uuids})

    def with_reserved(self, claim_uid: str, uuids: set[str], at: float) -> Ownership:
        return replace(self, dra={**self.dra, **{u: Reservation(claim_uid, at) for u in uuids}})

    def without_claims(self, claim_uids: set[str]) -> Ownership:
        return replace(self, dra={u: r for u, r in self.dra.items() if r.claim_uid not in claim_uids})


def encode_ownership(ownership: Ownership) -> bytes:
    doc = {
        "version": FORMAT_VERSION,
        "allocated": {u: {"at": a.at, "spec": a.spec} for u, a in sorted(ownership.allocated.items())},
        "dra": {u: {"claimUid": r.claim_uid, "at": r.at} for u, r in sorted(ownership.dra.items())},
    }
    return (json.dumps(doc, sort_keys=True, indent=1) + "\n").encode()


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{where}: must be a non-negative number of unix seconds, got {value!r}")
    return float(value)


def _entries(doc: Mapping[str, object], key: str) -> Mapping[str, Mapping[str, object]]:
    entries = doc.get(key, {})
    if not isinstance(entries, dict):
        raise ValueError(f"{key}: must be an object keyed by GPU UUID")
    for uuid, entry in entries.items():
        if not uuid or not isinstance(entry, dict):
            raise ValueError(f"{key}.{uuid}: must be an object")
    return entries


def decode_ownership(data: bytes) -> Ownership:
    """The record, or ValueError naming the field that is wrong."""
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError("(the document): must be an object")
    if doc.get("version") != FORMAT_VERSION:
        raise ValueError(f"version: {doc.get('version')!r} is not {FORMAT_VERSION}, the format this plugin writes")
    allocated = {}
    for uuid, entry in _entries(doc, "allocated").items():
        spec = entry.get("spec", "")
        if not isinstance(spec, str) or not all(c in "0123456789abcdef" for c in spec):
            raise ValueError(f"allocated.{uuid}.spec: must be an allocation key (lower-case hex) or empty")
        allocated[uuid] = Allocated(_number(entry.get("at"), f"allocated.{uuid}.at"), spec)
    dra = {}
    for uuid, entry in _entries(doc, "dra").items():
        claim = entry.get("claimUid")
        if not isinstance(claim, str) or not claim:
            raise ValueError(f"dra.{uuid}.claimUid: must be the claim's UID")
        dra[uuid] = Reservation(claim, _number(entry.get("at"), f"dra.{uuid}.at"))
    return Ownership(allocated, dra)


class OwnershipFile:
    """The record on disk; `change` is the only way to alter it (read, change, write, under the lock)."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._lock_path = path.with_name(path.name + ".lock")
        self._thread_lock = threading.Lock()  # flock is per open file: threads of one process queue here first
        self._clock = clock

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock:
            try:
                fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise OwnershipError(f"cannot open {self._lock_path}: {exc.strerror}; check --plugin-dir") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # held for one read and one write, never across a call out
                yield
            finally:
                os.close(fd)  # drops the flock

    def _read(self) -> Ownership:
        try:
            with self.path.open("rb") as f:
                data = f.read(_MAX_BYTES + 1)
        except FileNotFoundError:
            return Ownership()
        except OSError as exc:
            raise OwnershipError(f"cannot read {self.path}: {exc.strerror}; check --plugin-dir") from exc
        try:
            if len(data) > _MAX_BYTES:
                raise ValueError(f"(the document): larger than {_MAX_BYTES} bytes")
            return decode_ownership(data)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(self._clock())}")
            os.replace(self.path, aside)
            log.error("the device plugin's ownership record is unreadable; set aside, rebuilt from the kubelet's "
                      "PodResources", path=str(self.path), moved_to=str(aside), error=str(exc))  # fmt: skip
            return Ownership()

    def load(self) -> Ownership:
        with self._locked():
            return self._read()

    def sweep_temp_files(self, written_under_lock: Sequence[tuple[Path, Callable[[str], bool]]] = ()) -> list[Path]:
        """Delete the temp files a crash left mid-write, at start: the record's own (`.<file>.<random>.tmp`) and,
        per (directory, which temp names are ours) of `written_under_lock`, those of files only ever written under
        this lock (the device plugin's CDI specs). Under the lock, so no writer (another instance of a rolling
        upgrade included) is using one."""
        pattern = temp_file_pattern(re.escape(self.path.name))
        sweeps = [(self.path.parent, lambda name: pattern.fullmatch(name) is not None), *written_under_lock]
        if not self.path.parent.is_dir():
            return []  # a first start: the plugin dir is made later, and nothing was ever written under the lock
        with self._locked():
            return [path for directory, ours in sweeps for path in sweep_temp_files(directory, ours)]

    @contextmanager
    def change(self) -> Iterator[Changing]:
        """Read under the lock; what the body sets as `changing.new` is written before the lock is released."""
        with self._locked():
            changing = Changing(self._read())
            yield changing
            if changing.new is not None and changing.new != changing.old:
                try:
                    atomic_write(self.path, encode_ownership(changing.new), mode=0o600)
                except OSError as exc:
                    raise OwnershipError(f"cannot write {self.path}: {exc.strerror}; check --plugin-dir") from exc


@dataclass
class Changing:
    old: Ownership
    new: Ownership | None = None
