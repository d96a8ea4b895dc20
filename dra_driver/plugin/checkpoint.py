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

import enum
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dra_driver.kubeletplugin import checkpoint as store
from dra_driver.kubeletplugin.checkpoint import CorruptCheckpointError, NewerCheckpointError

CHECKPOINT_VERSION = 1


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
class VfioFunction:
    """One PCI function a passthrough moved to vfio-pci, and the driver it had (None: it was unbound).
    `persistence_mode`: for another GPU of the IOMMU group, its persistence mode before (restored with it; None for
    the passed-through GPU, whose mode is VfioRecord.persistence_mode, and for functions that are no GPU)."""

    address: str
    driver: str | None
    persistence_mode: bool | None = None


@dataclass(frozen=True)
class VfioRecord:
    """A GPU passed through to a VM (plugin/effects/vfio_passthrough.py).

    Planned with the GPU's address and IOMMU group; `functions` and `persistence_mode` are recorded (durably, in
    the PrepareStarted record) before the first function leaves its driver, so a rollback, an unprepare or the
    recovery after a crash rebinds each to exactly the driver it had and restores persistence mode."""

    address: str  # the GPU's PCI function, e.g. "0000:1b:00.0"
    group: int  # its IOMMU group: /dev/vfio/<group>
    driver: str = "vfio-pci"  # the vfio driver it is bound to (a vfio-pci variant where one matches)
    functions: tuple[VfioFunction, ...] = ()  # empty: nothing moved yet
    persistence_mode: bool | None = None  # the GPU's persistence mode before (None: not read yet)
    iommufd: bool = False  # PreferIommuFD on a host with /dev/iommu: the VM gets /dev/vfio/devices/<vfio_dev>
    api_device: bool = False  # enableAPIDevice: also /dev/vfio/vfio (or /dev/iommu)
    vfio_dev: str | None = None  # "vfio3", known once bound (IOMMUFD)

    @property
    def started(self) -> bool:
        return bool(self.functions)


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
    # The allocation result's request with its subrequest ("gpu/big"), where it has one: KEP-5304 device metadata
    # names it (request_names hold what containers reference, the request alone).
    request_ref: str | None = None
    vfio: VfioRecord | None = None  # a GPU passed through to a VM


@dataclass(frozen=True)
class ClaimRecord:
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[PreparedDevice, ...] = ()
    # Devices the allocation assigned to us (known as soon as prepare starts; needed to roll back).
    allocated: tuple[PreparedDevice, ...] = ()
    # The claim's resource.kubernetes.io/pod-claim-name annotation (template claims): where its device metadata
    # appears in containers, also on a repeated prepare that reads no claim.
    pod_claim_name: str | None = None
    # Set when a device of this completed claim did not survive an NVIDIA driver reload (its MIG instance is gone;
    # plugin/driverreload.py): why, for the user. The record is kept (an unprepare releases it as usual), but it is
    # never repaired or returned as prepared again: a re-made device would be another device under the same name.
    lost: str | None = None


@dataclass(frozen=True)
class Checkpoint:
    node_boot_id: str = ""
    claims: Mapping[str, ClaimRecord] = field(default_factory=dict)

    # Built directly, not with dataclasses.replace (which walks the fields): one of each per claim operation.
    def with_claim(self, record: ClaimRecord) -> Checkpoint:
        return Checkpoint(self.node_boot_id, {**self.claims, record.uid: record})

    def without_claim(self, uid: str) -> Checkpoint:
        claims = dict(self.claims)
        claims.pop(uid, None)
        return Checkpoint(self.node_boot_id, claims)


# --- encoding ------------------------------------------------------------------------------------


# A claim's canonical `"<uid>":{record}` member, by uid, with the record it was made from (records are immutable: the
# same object encodes the same way). Lets a write re-serialise only the claims that changed: what is left per write
# is the join and the sha256 of the payload (≈ 25 µs at 64 claims; the uid's own json.dumps per claim per write was
# ≈ 3 µs each, most of the rest).
FragmentCache = dict[str, tuple["ClaimRecord", str]]


def encode(checkpoint: Checkpoint, fragments: FragmentCache | None = None) -> bytes:
    """The file's bytes: the canonical payload (compact, sorted keys: what the checksum covers) written once and
    embedded as is. `fragments` (optional, updated in place) caches each claim's canonical member between writes."""
    parts = []
    for uid, rec in sorted(checkpoint.claims.items()):
        cached = fragments.get(uid) if fragments is not None else None
        if cached is not None and cached[0] is rec:
            member = cached[1]
        else:
            member = f"{_canonical(uid)}:{_canonical(_encode_claim(rec))}"
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
    if dev.request_ref is not None:
        out["requestRef"] = dev.request_ref
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
    if dev.vfio is not None:
        out["vfio"] = _encode_vfio(dev.vfio)
    return out


def _encode_vfio(vfio: VfioRecord) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "address": vfio.address,
        "group": vfio.group,
        "driver": vfio.driver,
        "functions": [_encode_vfio_function(f) for f in vfio.functions],
        "persistenceMode": vfio.persistence_mode,
        "iommufd": vfio.iommufd or None,
        "apiDevice": vfio.api_device or None,
        "vfioDev": vfio.vfio_dev,
    }
    return {k: v for k, v in doc.items() if v is not None}


def _encode_vfio_function(function: VfioFunction) -> dict[str, Any]:
    out: dict[str, Any] = {"address": function.address, "driver": function.driver}
    if function.persistence_mode is not None:
        out["persistenceMode"] = function.persistence_mode
    return out


def _decode_vfio_function(raw: Mapping[str, Any]) -> VfioFunction:
    persistence = raw.get("persistenceMode")
    return VfioFunction(
        str(raw["address"]), _opt_str(raw.get("driver")), None if persistence is None else bool(persistence)
    )


def _decode_vfio(raw: Mapping[str, Any]) -> VfioRecord:
    persistence = raw.get("persistenceMode")
    return VfioRecord(
        address=str(raw["address"]),
        group=int(raw["group"]),
        driver=str(raw.get("driver") or "vfio-pci"),
        functions=tuple(_decode_vfio_function(f) for f in raw.get("functions") or ()),
        persistence_mode=None if persistence is None else bool(persistence),
        iommufd=bool(raw.get("iommufd", False)),
        api_device=bool(raw.get("apiDevice", False)),
        vfio_dev=_opt_str(raw.get("vfioDev")),
    )


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
        request_ref=_opt_str(raw.get("requestRef")),
        vfio=_decode_vfio(raw["vfio"]) if isinstance(raw.get("vfio"), Mapping) else None,
    )


def _encode_claim(rec: ClaimRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "namespace": rec.namespace,
        "name": rec.name,
        "state": rec.state.value,
        "devices": [_encode_device(d) for d in rec.devices],
        "allocated": [_encode_device(d) for d in rec.allocated],
    }
    if rec.pod_claim_name is not None:
        out["podClaimName"] = rec.pod_claim_name
    if rec.lost is not None:
        out["lost"] = rec.lost
    return out


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
        pod_claim_name=_opt_str(raw.get("podClaimName")),
        lost=_opt_str(raw.get("lost")),
    )


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


# --- storage ---------------------------------------------------------------------------------------


class CheckpointCodec:
    """This file's format for the kubelet-plugin layer's store. One per store: it caches each claim's canonical
    JSON between writes (the store encodes under its locks only)."""

    def __init__(self) -> None:
        self._fragments: FragmentCache = {}

    def encode(self, value: Checkpoint) -> bytes:
        return encode(value, self._fragments)

    def decode(self, raw: bytes) -> Checkpoint:
        return decode(raw)

    def empty(self, boot_id: str) -> Checkpoint:
        return Checkpoint(node_boot_id=boot_id)

    def boot_id(self, value: Checkpoint) -> str:
        return value.node_boot_id

    def with_boot_id(self, value: Checkpoint, boot_id: str) -> Checkpoint:
        return value if value.node_boot_id == boot_id else replace(value, node_boot_id=boot_id)

    def records(self, value: Checkpoint) -> int:
        return len(value.claims)


class CheckpointStore(store.CheckpointStore[Checkpoint]):
    """The GPU driver's checkpoint file: the layer's store (`dra_driver.kubeletplugin.checkpoint`) with this
    module's codec."""

    def __init__(
        self,
        path: Path,
        *,
        boot_id_path: Path = store.DEFAULT_BOOT_ID_PATH,
        clock_ns: Callable[[], int] = time.time_ns,
        on_loss: Callable[[str], None] | None = None,
        on_write: Callable[[float], None] | None = None,
        on_quarantine: Callable[[Path, str], None] | None = None,
    ) -> None:
        super().__init__(
            path, CheckpointCodec(), boot_id_path=boot_id_path, clock_ns=clock_ns, on_loss=on_loss, on_write=on_write,
            on_quarantine=on_quarantine,
        )
