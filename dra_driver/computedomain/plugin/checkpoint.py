"""The compute-domain plugin's claim records and their file (`<plugin-dir>/checkpoint.json`, its own namespace:
another plugin dir than the GPU driver's), stored by the layer's `CheckpointStore`.

Format (versioned JSON with a checksum over the canonical payload, one line):

    {"checksum": "sha256:<hex>", "payload": {"nodeBootId": "...", "claims": {<uid>: {...}}}, "version": 1}

A claim record: namespace, name, state, the domain it serves (uid, namespace, name), the node's clique, the
fingerprint of the allocation it was prepared for, when it was aborted, and one entry per device (request names,
device, kind, CDI ids, channels). States:

    PrepareStarted     prepare began changing the node (node label, daemon dir); a crash rolls it back
    PrepareCompleted   prepared; the kubelet holds the CDI ids
    UnprepareStarted   unprepare began; a crash finishes it (never "repairs" it back)
    PrepareAborted     an unprepare came while the claim was still PrepareStarted (NVIDIA #1162): what it had done
                       is undone and the record kept for ABORTED_TTL_S, so that a stale prepare retry of the same
                       allocation arriving later is refused instead of preparing a claim the kubelet let go

Decoding is lenient where it can be (unknown fields ignored, missing ones defaulted, an unknown state read as
PrepareStarted so it is rolled back); a damaged file raises CorruptCheckpointError (the store moves it aside).
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dra_driver.kubeletplugin.checkpoint import CorruptCheckpointError, NewerCheckpointError

CHECKPOINT_VERSION = 1
CHECKPOINT_NAME = "checkpoint.json"
ABORTED_TTL_S = 600.0  # how long a PrepareAborted record refuses stale prepares (NVIDIA's cleanup period)


class ClaimState(enum.StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"
    UNPREPARE_STARTED = "UnprepareStarted"
    PREPARE_ABORTED = "PrepareAborted"


class DeviceKind(enum.StrEnum):
    CHANNEL = "channel"
    DAEMON = "daemon"


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str  # channel-0 | daemon-0
    kind: DeviceKind
    cdi_device_ids: tuple[str, ...] = ()
    channels: tuple[int, ...] = ()  # a channel device: the IMEX channels injected (0, or 0..2047 in All mode)


@dataclass(frozen=True)
class ClaimRecord:
    uid: str
    namespace: str
    name: str
    state: ClaimState
    domain_uid: str = ""
    domain_namespace: str = ""
    domain_name: str = ""
    clique_id: str = ""  # the node's clique when prepared ("" without one)
    allocation: str = ""  # fingerprint of status.allocation it was prepared for (a stale prepare matches it)
    aborted_at: float = 0.0  # unix seconds, PrepareAborted only
    devices: tuple[PreparedDevice, ...] = ()

    def holds(self, kind: DeviceKind) -> bool:
        return any(d.kind is kind for d in self.devices)

    @property
    def live(self) -> bool:
        """Whether the record names state on the node (an aborted one names none: it was undone)."""
        return self.state is not ClaimState.PREPARE_ABORTED


@dataclass(frozen=True)
class Checkpoint:
    boot_id: str = ""
    claims: Mapping[str, ClaimRecord] = field(default_factory=dict)

    def with_claim(self, record: ClaimRecord) -> Checkpoint:
        return replace(self, claims={**self.claims, record.uid: record})

    def without(self, uid: str) -> Checkpoint:
        return replace(self, claims={u: r for u, r in self.claims.items() if u != uid})

    def others(self, uid: str) -> list[ClaimRecord]:
        """The live records of every other claim."""
        return [r for u, r in self.claims.items() if u != uid and r.live]


def _device_json(d: PreparedDevice) -> dict[str, Any]:
    out: dict[str, Any] = {"requestNames": list(d.request_names), "pool": d.pool, "device": d.device,
                           "kind": d.kind.value, "cdiDeviceIds": list(d.cdi_device_ids)}
    if d.channels:
        out["channels"] = _channels_json(d.channels)
    return out


def _channels_json(channels: tuple[int, ...]) -> Any:
    # All mode is 2048 channels: written as a range, not 2048 numbers.
    if len(channels) > 1 and channels == tuple(range(channels[0], channels[-1] + 1)):
        return {"first": channels[0], "last": channels[-1]}
    return list(channels)


def _record_json(r: ClaimRecord) -> dict[str, Any]:
    out: dict[str, Any] = {"namespace": r.namespace, "name": r.name, "state": r.state.value,
                           "domain": {"uid": r.domain_uid, "namespace": r.domain_namespace, "name": r.domain_name},
                           "cliqueID": r.clique_id, "allocation": r.allocation,
                           "devices": [_device_json(d) for d in r.devices]}
    if r.aborted_at:
        out["abortedAt"] = r.aborted_at
    return out


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def encode(checkpoint: Checkpoint) -> bytes:
    payload = {"nodeBootId": checkpoint.boot_id,
               "claims": {uid: _record_json(r) for uid, r in sorted(checkpoint.claims.items())}}
    text = _canonical(payload)
    checksum = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    return f'{{"checksum":"{checksum}","payload":{text},"version":{CHECKPOINT_VERSION}}}\n'.encode()


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _channels(value: Any) -> tuple[int, ...]:
    if isinstance(value, dict):
        return tuple(range(int(value["first"]), int(value["last"]) + 1))
    return tuple(int(v) for v in value) if isinstance(value, list) else ()


def _state(value: Any) -> ClaimState:
    try:
        return ClaimState(value)
    except ValueError:
        return ClaimState.PREPARE_STARTED  # unknown: roll it back (the safe reading)


def _kind(value: Any) -> DeviceKind:
    try:
        return DeviceKind(value)
    except ValueError:
        raise CorruptCheckpointError(f"unknown device kind {value!r}") from None


def _record(uid: str, raw: Any) -> ClaimRecord:
    if not isinstance(raw, dict):
        raise CorruptCheckpointError(f"claim {uid}: not an object")
    found = raw.get("domain")
    domain: dict[str, Any] = found if isinstance(found, dict) else {}
    devices = tuple(
        PreparedDevice(
            request_names=_strs(d.get("requestNames")), pool=str(d.get("pool", "")), device=str(d.get("device", "")),
            kind=_kind(d.get("kind")), cdi_device_ids=_strs(d.get("cdiDeviceIds")),
            channels=_channels(d.get("channels")),
        )
        for d in raw.get("devices") or ()
        if isinstance(d, dict)
    )
    return ClaimRecord(
        uid=uid, namespace=str(raw.get("namespace", "")), name=str(raw.get("name", "")), state=_state(raw.get("state")),
        domain_uid=str(domain.get("uid", "")), domain_namespace=str(domain.get("namespace", "")),
        domain_name=str(domain.get("name", "")), clique_id=str(raw.get("cliqueID", "")),
        allocation=str(raw.get("allocation", "")), aborted_at=float(raw.get("abortedAt", 0.0)), devices=devices,
    )


def decode(raw: bytes) -> Checkpoint:
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptCheckpointError(f"not JSON: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("payload"), dict):
        raise CorruptCheckpointError("not a compute-domain plugin checkpoint (no payload object)")
    version = document.get("version")
    if isinstance(version, int) and version > CHECKPOINT_VERSION:
        raise NewerCheckpointError(
            f"checkpoint format version {version} was written by a newer plugin (this one reads {CHECKPOINT_VERSION});"
            " run that version, or move the file away to start over"
        )
    payload = document["payload"]
    expected = document.get("checksum")
    actual = "sha256:" + hashlib.sha256(_canonical(payload).encode()).hexdigest()
    if expected != actual:
        raise CorruptCheckpointError(f"checksum mismatch (file says {expected!r})")
    claims = payload.get("claims") or {}
    if not isinstance(claims, dict):
        raise CorruptCheckpointError("payload.claims is not an object")
    try:
        records = {str(uid): _record(str(uid), raw) for uid, raw in claims.items()}
    except (TypeError, ValueError, KeyError) as exc:
        raise CorruptCheckpointError(f"a claim record has a wrong shape: {exc}") from exc
    return Checkpoint(boot_id=str(payload.get("nodeBootId", "")), claims=records)


class CheckpointCodec:
    """The layer's CheckpointCodec for these records."""

    def encode(self, value: Checkpoint) -> bytes:
        return encode(value)

    def decode(self, raw: bytes) -> Checkpoint:
        return decode(raw)

    def empty(self, boot_id: str) -> Checkpoint:
        return Checkpoint(boot_id)

    def boot_id(self, value: Checkpoint) -> str:
        return value.boot_id

    def with_boot_id(self, value: Checkpoint, boot_id: str) -> Checkpoint:
        return value if value.boot_id == boot_id else replace(value, boot_id=boot_id)

    def records(self, value: Checkpoint) -> int:
        return len(value.claims)
