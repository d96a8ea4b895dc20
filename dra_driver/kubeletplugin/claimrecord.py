"""The claim record and the checkpoint of every driver on this layer, and their file format.

A driver's checkpoint (`<plugin-dir>/checkpoint.json`, stored by `CheckpointStore`) records, per claim, how far
its prepare or unprepare got; the claim engine (`claimengine.py`) writes it, recovery reads it after a crash. What
a claim record holds is the same for every driver:

    uid, namespace, name   the claim
    state                  PrepareStarted | PrepareCompleted | UnprepareStarted | PrepareAborted (below)
    devices                the device records handed to the kubelet (filled in by prepare)
    allocated              the device records as planned (known before anything is touched: what a rollback undoes)
    podClaimName           the claim's resource.kubernetes.io/pod-claim-name annotation (template claims)
    lost                   why a prepared device is gone for good (never re-made under the same name)
    allocation             a fingerprint of the allocation prepared for (a stale retry of another one differs)
    abortedAt              when an unprepare aborted a pending prepare (PrepareAborted)
    details                what the driver records of the claim as a whole (a ComputeDomain driver: its domain)

A device record is the driver's own type (`DeviceRecord`: name, pool, request names, CDI ids, and whatever its
effects record, e.g. a MIG instance's identity); the driver's `RecordFormat` writes and reads it and the details.

States:

    PrepareStarted     prepare began changing the node; a crash rolls it back
    PrepareCompleted   prepared; the kubelet holds the CDI ids
    UnprepareStarted   unprepare began releasing; a crash finishes it (never "repairs" it back)
    PrepareAborted     an unprepare came while the claim was still PrepareStarted (a driver whose prepare waits for
                       readiness, NVIDIA #1162): what it did is undone and the record kept for a while, so a stale
                       retry of the same allocation is refused

Format (versioned JSON with a checksum over the canonical payload, written compact on one line):

    {"checksum": "sha256:<hex>", "payload": {"claims": {<uid>: {...}}, "nodeBootId": "..."}, "version": 1}

Reading is lenient: unknown fields are ignored, missing ones take defaults, and a state the driver does not know is
read as PrepareStarted (the safe reading: it is rolled back). That is the versioning rule: changes within format
`version` 1 are additive; an incompatible change bumps it, and a plugin refuses to start on a version newer than it
knows (`NewerCheckpointError`) rather than misread it. Both drivers' files from before this module (the GPU
driver's and the ComputeDomain driver's, same envelope) read unchanged (tests/kubeletplugin/test_claimrecord.py).
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar

from dra_driver.kubeletplugin.checkpoint import CorruptCheckpointError, NewerCheckpointError
from dra_driver.kubeletplugin.driver import DeviceResult

CHECKPOINT_VERSION = 1


class ClaimState(enum.StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"
    UNPREPARE_STARTED = "UnprepareStarted"
    PREPARE_ABORTED = "PrepareAborted"


class DeviceRecord(Protocol):
    """What the layer reads of a driver's device record (the rest is its effects' business)."""

    @property
    def request_names(self) -> tuple[str, ...]: ...

    @property
    def pool(self) -> str: ...

    @property
    def device(self) -> str: ...

    @property
    def cdi_device_ids(self) -> tuple[str, ...]: ...


def device_result(device: DeviceRecord, share_id: str | None = None) -> DeviceResult:
    """The kubelet's answer for one prepared device, from its record (`share_id`: the consumable-capacity share it
    is, for a driver whose records have shares)."""
    return DeviceResult(device.request_names, device.pool, device.device, device.cdi_device_ids, share_id=share_id)


D = TypeVar("D", bound=DeviceRecord)
X = TypeVar("X")  # a driver's claim details


@dataclass(frozen=True)
class ClaimRecord(Generic[D, X]):
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[D, ...] = ()
    allocated: tuple[D, ...] = ()  # the devices the allocation assigned to us, as planned (needed to roll back)
    # Where its device metadata appears in containers (KEP-5304), also on a repeated prepare that reads no claim.
    pod_claim_name: str | None = None
    # Set when a device of this completed claim is gone for good (a GPU driver reload took its MIG instance): why,
    # for the user. The record is kept (an unprepare releases it), but it is never repaired or returned as prepared
    # again: a re-made device would be another device under the same name.
    lost: str | None = None
    allocation: str = ""  # fingerprint of the allocation prepared for ("": not recorded)
    aborted_at: float = 0.0  # unix seconds, PrepareAborted only
    details: X | None = None

    @property
    def live(self) -> bool:
        """Whether the record names state on the node (an aborted one names none: it was undone)."""
        return self.state is not ClaimState.PREPARE_ABORTED


@dataclass(frozen=True)
class Checkpoint(Generic[D, X]):
    node_boot_id: str = ""
    claims: Mapping[str, ClaimRecord[D, X]] = field(default_factory=dict)
    # Set by `with_claim` and `without_claim` only (never by the constructor or `dataclasses.replace`): the claims
    # this checkpoint was made from and the one UID whose record differs from them, so that a reader who holds
    # those claims (the prepared-claim metrics) updates by one record instead of comparing every claim held.
    derived_from: tuple[Mapping[str, ClaimRecord[D, X]], str] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    # Built directly, not with dataclasses.replace (which walks the fields): one of each per claim operation.
    def with_claim(self, record: ClaimRecord[D, X]) -> Checkpoint[D, X]:
        made = Checkpoint(self.node_boot_id, {**self.claims, record.uid: record})
        object.__setattr__(made, "derived_from", (self.claims, record.uid))
        return made

    def without_claim(self, uid: str) -> Checkpoint[D, X]:
        claims = dict(self.claims)
        claims.pop(uid, None)
        made = Checkpoint(self.node_boot_id, claims)
        object.__setattr__(made, "derived_from", (self.claims, uid))
        return made

    def others(self, uid: str) -> list[ClaimRecord[D, X]]:
        """The live records of every other claim."""
        return [r for u, r in self.claims.items() if u != uid and r.live]


class RecordFormat(Protocol[D, X]):
    """How one driver's device records and claim details are written in the checkpoint (JSON objects). Decoders
    raise TypeError, ValueError, KeyError or CorruptCheckpointError on a wrong shape (the file is then corrupt)."""

    @property
    def states(self) -> frozenset[ClaimState]:
        """The states this driver uses; any other read from a file is PrepareStarted (rolled back)."""
        ...

    def encode_device(self, device: D) -> dict[str, Any]: ...

    def decode_device(self, raw: Mapping[str, Any]) -> D: ...

    def encode_details(self, details: X) -> dict[str, Any]:
        """Members added to the claim's object (names other than the record's own)."""
        ...

    def decode_details(self, raw: Mapping[str, Any]) -> X | None: ...


# A claim's canonical `"<uid>":{record}` member, by uid, with the record it was made from (records are immutable: the
# same object encodes the same way). Lets a write re-serialise only the claims that changed: what is left per write
# is the join and the sha256 of the payload (≈ 25 µs at 64 claims).
FragmentCache = dict[str, tuple[Any, str]]


def encode_checkpoint(
    checkpoint: Checkpoint[D, X], fmt: RecordFormat[D, X], fragments: FragmentCache | None = None
) -> bytes:
    """The file's bytes: the canonical payload (compact, sorted keys: what the checksum covers) written once and
    embedded as is. `fragments` (optional, updated in place) caches each claim's canonical member between writes."""
    parts = []
    for uid, rec in sorted(checkpoint.claims.items()):
        cached = fragments.get(uid) if fragments is not None else None
        if cached is not None and cached[0] is rec:
            member = cached[1]
        else:
            member = f"{_canonical(uid)}:{_canonical(_encode_claim(rec, fmt))}"
            if fragments is not None:
                fragments[uid] = (rec, member)
        parts.append(member)
    if fragments is not None and len(fragments) > len(checkpoint.claims):
        for uid in [u for u in fragments if u not in checkpoint.claims]:
            del fragments[uid]
    # Equal to _canonical(payload): keys sorted ("claims" < "nodeBootId"), no whitespace.
    payload = '{"claims":{' + ",".join(parts) + '},"nodeBootId":' + _canonical(checkpoint.node_boot_id) + "}"
    checksum = "sha256:" + hashlib.sha256(payload.encode()).hexdigest()
    # The document with sorted keys as well: checksum, payload, version.
    return f'{{"checksum":"{checksum}","payload":{payload},"version":{CHECKPOINT_VERSION}}}\n'.encode()


def decode_checkpoint(raw: bytes, fmt: RecordFormat[D, X]) -> Checkpoint[D, X]:
    """Lenient decode; raises CorruptCheckpointError on bad JSON, a bad checksum or a wrong shape,
    NewerCheckpointError on a format version newer than this one."""
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
    if expected != checksum(payload):
        raise CorruptCheckpointError(f"checksum mismatch (file says {expected!r})")
    claims = payload.get("claims") or {}
    if not isinstance(claims, dict):
        raise CorruptCheckpointError("payload.claims is not an object")
    try:
        records = {str(uid): _decode_claim(str(uid), rec, fmt) for uid, rec in claims.items()}
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise CorruptCheckpointError(f"malformed claim entry: {exc!r}") from exc
    return Checkpoint(node_boot_id=str(payload.get("nodeBootId") or ""), claims=records)


def checksum(payload: Any) -> str:
    return "sha256:" + hashlib.sha256(_canonical(payload).encode()).hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _encode_claim(rec: ClaimRecord[D, X], fmt: RecordFormat[D, X]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if rec.details is not None:
        out.update(fmt.encode_details(rec.details))
    out.update(
        namespace=rec.namespace,
        name=rec.name,
        state=rec.state.value,
        devices=[fmt.encode_device(d) for d in rec.devices],
        allocated=[fmt.encode_device(d) for d in rec.allocated],
    )
    # Optional members are omitted when unset, so older readers never see surprises.
    if rec.pod_claim_name is not None:
        out["podClaimName"] = rec.pod_claim_name
    if rec.lost is not None:
        out["lost"] = rec.lost
    if rec.allocation:
        out["allocation"] = rec.allocation
    if rec.aborted_at:
        out["abortedAt"] = rec.aborted_at
    return out


def _decode_claim(uid: str, raw: Any, fmt: RecordFormat[D, X]) -> ClaimRecord[D, X]:
    if not isinstance(raw, Mapping):
        raise CorruptCheckpointError(f"claim {uid}: not an object")
    state_raw = raw.get("state", ClaimState.PREPARE_STARTED.value)
    state = ClaimState.PREPARE_STARTED
    if state_raw in ClaimState._value2member_map_ and ClaimState(state_raw) in fmt.states:
        state = ClaimState(state_raw)
    return ClaimRecord(
        uid=uid,
        namespace=str(raw.get("namespace", "")),
        name=str(raw.get("name", "")),
        state=state,
        devices=tuple(fmt.decode_device(_mapping(d)) for d in raw.get("devices") or ()),
        allocated=tuple(fmt.decode_device(_mapping(d)) for d in raw.get("allocated") or ()),
        pod_claim_name=optional_str(raw.get("podClaimName")),
        lost=optional_str(raw.get("lost")),
        allocation=str(raw.get("allocation") or ""),
        aborted_at=float(raw.get("abortedAt") or 0.0),
        details=fmt.decode_details(raw),
    )


def _mapping(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise CorruptCheckpointError(f"a device record is not an object: {value!r}")
    return value


def optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


class ClaimCodec(Generic[D, X]):
    """The store's `CheckpointCodec` for one driver's records. One per store: it caches each claim's canonical
    JSON between writes (the store encodes under its locks only)."""

    def __init__(self, fmt: RecordFormat[D, X]) -> None:
        self.format = fmt
        self._fragments: FragmentCache = {}

    def encode(self, value: Checkpoint[D, X]) -> bytes:
        return encode_checkpoint(value, self.format, self._fragments)

    def decode(self, raw: bytes) -> Checkpoint[D, X]:
        return decode_checkpoint(raw, self.format)

    def empty(self, boot_id: str) -> Checkpoint[D, X]:
        return Checkpoint(node_boot_id=boot_id)

    def boot_id(self, value: Checkpoint[D, X]) -> str:
        return value.node_boot_id

    def with_boot_id(self, value: Checkpoint[D, X], boot_id: str) -> Checkpoint[D, X]:
        return value if value.node_boot_id == boot_id else replace(value, node_boot_id=boot_id)

    def records(self, value: Checkpoint[D, X]) -> int:
        return len(value.claims)
