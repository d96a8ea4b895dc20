"""What this driver writes into a ResourceClaim's `status.devices[]` (KEP-4817), computed without I/O: one entry per
prepared device with its `Ready` condition and `data` (plugin/devicestatus.py writes them; docs/reference/
claim-device-status.md has the facts)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind
from dra_driver.k8s.client import JsonObject
from dra_driver.plugin.cdi import CONTAINER_MPS_PIPE_DIR
from dra_driver.plugin.checkpoint import ClaimRecord, ClaimState, PreparedDevice

READY_CONDITION = "Ready"
PREPARED, PREPARE_FAILED = "Prepared", "PrepareFailed"  # condition reasons (metav1.Condition reason format)
MAX_CONDITION_MESSAGE = 32 * 1024  # apimachinery metav1 validation maxMessageLen
MAX_DATA_BYTES = 10 * 1024  # resource.AllocatedDeviceStatusDataMaxLength
DeviceKey = tuple[str, str, str]  # pool, device, shareID ("" when none)


@dataclass(frozen=True)
class DeviceEntry:
    """One device's wish: its key, Ready (with reason and message) and `data` (None: none)."""

    pool: str
    device: str
    share_id: str | None
    ready: bool
    reason: str
    message: str
    data: Mapping[str, Any] | None = None

    @property
    def key(self) -> DeviceKey:
        return self.pool, self.device, self.share_id or ""


@dataclass(frozen=True)
class Wish:
    """What this driver's entries in one claim should be: `entries` after a prepare; `failure` (the prepare's
    error) marks every device allocated to us Ready=False; neither: remove ours (unprepare)."""

    entries: tuple[DeviceEntry, ...] = ()
    failure: str | None = None

    @property
    def removal(self) -> bool:
        return not self.entries and self.failure is None


REMOVE = Wish()


def device_data(prepared: PreparedDevice, allocatable: AllocatableDevice | None) -> dict[str, Any]:
    """The `data` of one prepared device: only the fields that apply (camelCase, as Kubernetes writes JSON)."""
    data: dict[str, Any] = {}
    gpu = allocatable.gpu if allocatable is not None else None
    parent = prepared.gpu_uuid or (gpu.uuid if gpu is not None else None)
    mig_uuid, profile, placement = None, None, None
    if prepared.mig is not None:  # dynamic MIG: created by this plugin
        mig_uuid = prepared.mig.uuid
        parent = prepared.mig.parent_uuid
        placement = (prepared.mig.placement_start, prepared.mig.placement_size)
        profile = allocatable.profile.name if allocatable is not None and allocatable.profile is not None else None
    elif allocatable is not None and allocatable.kind is DeviceKind.MIG_STATIC and allocatable.mig is not None:
        mig_uuid = allocatable.mig.uuid
        parent = allocatable.mig.parent_uuid
        profile = allocatable.mig.profile.name
        placement = (allocatable.mig.placement.start, allocatable.mig.placement.size)
    if mig_uuid is not None or profile is not None:
        if mig_uuid:
            data["uuid"] = mig_uuid
        if parent:
            data["parentUUID"] = parent
        if profile:
            data["migProfile"] = profile
        if placement is not None:
            data["migPlacement"] = {"start": placement[0], "size": placement[1]}
    elif parent:
        data["uuid"] = parent
    if gpu is not None and gpu.info.pci_bus_id:
        data["pciBusID"] = gpu.info.pci_bus_id
    sharing: dict[str, Any] = {"strategy": prepared.sharing or "Exclusive"}
    if prepared.time_slice is not None:
        sharing["timeSlice"] = prepared.time_slice
    if prepared.mps is not None:
        mps: dict[str, Any] = {"pipeDirectory": CONTAINER_MPS_PIPE_DIR}
        if prepared.mps.active_thread_percentage is not None:
            mps["activeThreadPercentage"] = prepared.mps.active_thread_percentage
        if prepared.mps.pinned_memory_limit is not None:
            mps["pinnedMemoryLimitBytes"] = prepared.mps.pinned_memory_limit
        if prepared.mps.multi_user:
            mps["multiUser"] = True
        sharing["mps"] = mps
    data["sharing"] = sharing
    return data


def prepared_wish(record: ClaimRecord | None, catalog: Mapping[str, AllocatableDevice], *, node: str) -> Wish | None:
    """The entries of a claim its record says is prepared (None: it does not)."""
    if record is None or record.state is not ClaimState.PREPARE_COMPLETED:
        return None
    entries = tuple(
        DeviceEntry(
            pool=d.pool,
            device=d.device,
            share_id=d.share_id,
            ready=True,
            reason=PREPARED,
            message=f"prepared on node {node}",
            data=device_data(d, catalog.get(d.device)),
        )
        for d in record.devices
    )
    return Wish(entries=entries) if entries else None


def is_ours(entry: Mapping[str, Any], driver: str, pool: str) -> bool:
    return entry.get("driver") == driver and entry.get("pool") == pool


def entry_key(entry: Mapping[str, Any]) -> DeviceKey:
    return str(entry.get("pool") or ""), str(entry.get("device") or ""), str(entry.get("shareID") or "")


def allocated_keys(claim: Mapping[str, Any], driver: str, pool: str) -> list[DeviceKey]:
    """The claim's allocation results of this driver in this pool, in order."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return [entry_key(r) for r in results if isinstance(r, Mapping) and is_ours(r, driver, pool)]


def _condition(ready: bool, reason: str, message: str, generation: int, old: Mapping[str, Any] | None,
               now: str) -> JsonObject:
    status = "True" if ready else "False"
    # As meta.SetStatusCondition: the transition time moves only when the status does.
    since = str(old.get("lastTransitionTime")) if old and old.get("status") == status and old.get(
        "lastTransitionTime") else now
    text = message if len(message) <= MAX_CONDITION_MESSAGE else message[: MAX_CONDITION_MESSAGE - 3] + "..."
    return {"type": READY_CONDITION, "status": status, "observedGeneration": generation, "lastTransitionTime": since,
            "reason": reason, "message": text}


def desired_devices(claim: Mapping[str, Any], wish: Wish, *, driver: str, pool: str, now: str) -> list[JsonObject]:
    """The claim's whole `status.devices` after applying `wish`: every other driver's (and pool's) entry as read, in
    its place; ours replaced, for devices the claim is still allocated only (the API server refuses others)."""
    current = [e for e in (claim.get("status") or {}).get("devices") or [] if isinstance(e, Mapping)]
    old = {entry_key(e): e for e in current if is_ours(e, driver, pool)}
    generation = int((claim.get("metadata") or {}).get("generation") or 0)
    allocated = allocated_keys(claim, driver, pool)
    wanted: list[DeviceEntry] = []
    if wish.failure is not None:
        wanted = [DeviceEntry(p, d, s or None, False, PREPARE_FAILED, wish.failure) for p, d, s in allocated]
    elif wish.entries:
        keys = set(allocated)
        wanted = [e for e in wish.entries if e.key in keys]
    ours: list[JsonObject] = []
    for e in wanted:
        before = old.get(e.key)
        conditions = [c for c in (before or {}).get("conditions") or [] if isinstance(c, Mapping)]
        previous = next((c for c in conditions if c.get("type") == READY_CONDITION), None)
        # Other conditions on our entry (someone else's, e.g. a binding condition) stay; Ready is ours.
        kept = [dict(c) for c in conditions if c.get("type") != READY_CONDITION][:7]
        entry: JsonObject = {"driver": driver, "pool": e.pool, "device": e.device}
        if e.share_id:
            entry["shareID"] = e.share_id
        entry["conditions"] = [*kept, _condition(e.ready, e.reason, e.message, generation, previous, now)]
        if e.data is not None:
            entry["data"] = dict(e.data)
        elif before is not None and before.get("data") is not None and not e.ready:
            entry["data"] = before["data"]  # a failed re-prepare keeps what was known
        for extra in ("networkData",):
            if before is not None and before.get(extra) is not None:
                entry[extra] = before[extra]
        ours.append(entry)
    out: list[JsonObject] = [dict(e) for e in current if not is_ours(e, driver, pool)]
    return out + ours


def same_entries(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the two lists are the same JSON. Lists of different lengths never are: the usual case (a prepare adds
    our entries, an unprepare removes them) is answered without encoding both."""
    if len(a) != len(b):
        return False
    return json.dumps(list(a), sort_keys=True) == json.dumps(list(b), sort_keys=True)


def timestamp(now: float) -> str:
    return datetime.fromtimestamp(int(now), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
