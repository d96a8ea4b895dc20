"""The claim's `status.devices[]` (KEP-4817): what each prepared device is, written where users look.

After a prepare, `kubectl get resourceclaim X -o yaml` shows one entry per device of this driver: a `Ready`
condition (True once prepared; False with the prepare's error when it failed) and `data`, a JSON object with what
the pod got (the UUID it addresses, the parent GPU, the MIG profile and placement, the PCI bus id, the sharing
strategy and its settings, the MPS pipe directory), only what applies. Unprepare removes this driver's entries
(the API server also drops entries of deallocated devices). Other drivers' entries are never touched.

What is written is computed in devicestatusentries.py; how it is written (docs/reference/claim-device-status.md has
the facts and the reasons):
- a JSON merge patch of `status.devices` on the `resourceclaims/status` subresource, with the list as read plus
  ours and the claim's `metadata.resourceVersion` as a precondition: `status.devices` carries no patch strategy,
  so a strategic merge patch would replace the whole list too, and server-side apply is not what every client
  stack (nor the sandbox) serves; a 409 means someone else wrote the claim: read it again and redo;
- the list as read: after a prepare, the claim the engine read moments before (no GET of its own; the
  precondition catches a claim changed since), else a GET; a removal always GETs;
- off the kubelet's call path: `DeviceStatusReport`, an observer on the prepare pipeline, hands each outcome to
  `DeviceStatusWriter`, a background thread with a bounded queue that coalesces per claim (the newest wish
  wins), retries with exponential backoff and counts every write by outcome
  (`dra_driver_claim_device_status_writes_total{outcome}`). A failed write never fails or delays a prepare;
- only where the server has the field: resource.k8s.io/v1 (Kubernetes 1.34+, what this plugin reads claims at)
  with the DRAResourceClaimDeviceStatus gate (beta, on by default since 1.33, GA in 1.37). The gate can still be
  switched off on 1.34-1.36: the API server then drops the field silently, so the first write's answer is checked
  and, when our entries are missing from it, writing stops (outcome `unsupported`, one warning).
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast
from urllib.parse import quote

import structlog

from dra_driver.backoff import Backoff
from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_driver.kubeletplugin.driver import ClaimRef, PrepareResult
from dra_driver.kubeletplugin.pipeline import PrepareOutcome, UnprepareOutcome
from dra_driver.plugin.checkpoint import ClaimRecord
from dra_driver.plugin.devicestatusentries import (
    MAX_DATA_BYTES,
    REMOVE,
    Wish,
    desired_devices,
    entry_key,
    is_ours,
    prepared_wish,
    same_entries,
    timestamp,
)

log = structlog.get_logger(__name__)

MERGE_PATCH = "application/merge-patch+json"
FIRST_MINOR_WITH_FIELD = (1, 34)  # resource.k8s.io/v1 (the API version this plugin uses) has it from 1.34

# --- the writer (I/O, one background thread) ----------------------------------------------------------


@dataclass
class _Pending:
    ref: ClaimRef
    wish: Wish
    attempts: int = 0
    not_before: float = 0.0


@dataclass(frozen=True, kw_only=True)
class WriterSettings:
    driver_name: str  # whose entries of status.devices the writer owns: this driver's, in this pool
    pool_name: str
    max_pending: int = 4096  # claims waiting; a new one beyond is dropped (counted), never blocks a prepare
    first_backoff: float = 0.5
    max_backoff: float = 30.0
    max_attempts: int = 12  # ~4 minutes of retries, then the claim's write is given up (counted)
    timeout: float = 10.0


class DeviceStatusWriter:
    """Writes wishes to the API in the background; `submit` never blocks (beyond a lock) and never raises."""

    def __init__(
        self,
        rest: KubeRest,
        settings: WriterSettings,
        *,
        count: Callable[[str], None] | None = None,
        kube_version: Callable[[], tuple[int, int] | None] = lambda: None,
    ) -> None:
        self.rest = rest
        self.settings = settings
        self._count = count
        self._kube_version = kube_version
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self._busy: str | None = None  # the claim UID being written now
        self._changed = threading.Condition()
        self._stopping = False
        self._unsupported = ""  # why the server has no status.devices ("" while it has, or is not known not to)
        self._thread: threading.Thread | None = None
        # The ResourceClaim as the prepare engine read it moments before, by uid (`note_claim`): the first write of
        # that prepare's wish starts from it instead of a GET of its own (a GET is ~0.6 ms of the plugin's CPU).
        # The resourceVersion precondition still guards the write: a claim changed meanwhile answers 409, and the
        # retry reads it afresh. One use each, bounded like the queue.
        self._seen: OrderedDict[str, JsonObject] = OrderedDict()
        # A claim's status as our last write left it (the PATCH's answer, or the claim a write found already right),
        # by uid: the removal after its unprepare starts from it instead of a GET. Only what a removal reads is kept
        # (uid, resourceVersion, generation, status.devices: ~1 KB a claim, bounded like the queue); a claim changed
        # since answers 409 and the retry reads it, as above. Never the base of anything but a removal: it has no
        # allocation, and an entry is written only for an allocated device.
        self._written: OrderedDict[str, JsonObject] = OrderedDict()
        self.outcomes: dict[str, int] = {}  # outcome -> count, as the metric (read without a registry)

    # -- the caller's side -------------------------------------------------------------------------------

    def submit(self, ref: ClaimRef, wish: Wish) -> None:
        """The newest wish for a claim replaces one still waiting (coalescing) and is written as soon as possible."""
        with self._changed:
            if self._unsupported or self._stopping:
                return
            if ref.uid not in self._pending and len(self._pending) >= self.settings.max_pending:
                self._record("dropped")
                log.warning("claim status queue full; not writing status.devices", claim_uid=ref.uid,
                            pending=len(self._pending))
                return
            self._pending[ref.uid] = _Pending(ref, wish)
            self._pending.move_to_end(ref.uid)
            self._changed.notify_all()

    def note_claim(self, uid: str, claim: JsonObject) -> None:
        """The ResourceClaim as the engine read it to prepare it (the engine's `claim_read` hook)."""
        with self._changed:
            self._keep(self._seen, uid, claim)

    def _keep(self, claims: OrderedDict[str, JsonObject], uid: str, claim: JsonObject) -> None:
        claims[uid] = claim
        claims.move_to_end(uid)
        while len(claims) > self.settings.max_pending:
            claims.popitem(last=False)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="claim-device-status", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the write in flight (what is still queued is not written: the API server drops entries of
        deallocated devices, and a restarted plugin writes prepared claims again on their next prepare)."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def idle(self) -> bool:
        """Nothing queued and nothing being written."""
        with self._changed:
            return not self._pending and self._busy is None

    @property
    def unsupported(self) -> str:
        return self._unsupported

    # -- the thread ------------------------------------------------------------------------------------------

    def _record(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if self._count is not None:
            self._count(outcome)

    def _next(self) -> _Pending | None:
        with self._changed:
            while not self._stopping:
                now = time.monotonic()
                due = [p for p in self._pending.values() if p.not_before <= now]
                if due:
                    item = due[0]
                    del self._pending[item.ref.uid]
                    self._busy = item.ref.uid
                    return item
                wait = min((p.not_before for p in self._pending.values()), default=now + 3600.0) - now
                self._changed.wait(max(0.0, min(wait, 3600.0)))
            return None

    def _run(self) -> None:
        while (item := self._next()) is not None:
            try:
                outcome = self._write(item.ref, item.wish)
            except Exception:  # a bug must not end the thread: count it and retry like an API error
                log.exception("writing status.devices failed unexpectedly", claim_uid=item.ref.uid)
                outcome = "error"
            self._record(outcome)
            with self._changed:
                self._busy = None
                retry = outcome in ("conflict", "error") and item.ref.uid not in self._pending
                if retry:
                    item.attempts += 1
                    if item.attempts >= self.settings.max_attempts:
                        self._record("abandoned")
                        log.warning("giving up writing status.devices", claim=f"{item.ref.namespace}/"
                                    f"{item.ref.name}", attempts=item.attempts)
                    else:
                        delay = 0.0 if outcome == "conflict" and item.attempts == 1 else Backoff(
                            self.settings.first_backoff, self.settings.max_backoff).delay(item.attempts - 1)
                        item.not_before = time.monotonic() + delay
                        self._pending[item.ref.uid] = item
                self._changed.notify_all()

    def _write(self, ref: ClaimRef, wish: Wish) -> str:
        version = self._kube_version()
        if version is not None and version < FIRST_MINOR_WITH_FIELD:
            self._unsupported = f"Kubernetes {version[0]}.{version[1]} serves no resource.k8s.io/v1 status.devices"
            log.warning("not writing claim status.devices", reason=self._unsupported)
            return "unsupported"
        with self._changed:
            seen = self._seen.pop(ref.uid, None)
            written = self._written.pop(ref.uid, None)
        base = written if wish.removal else seen
        if base is not None:
            claim: JsonObject | None = base
        else:
            try:
                claim = self.rest.get(
                    f"/apis/resource.k8s.io/v1/namespaces/{quote(ref.namespace, safe='')}/resourceclaims/"
                    f"{quote(ref.name, safe='')}",
                    timeout=self.settings.timeout,
                )
            except ApiError as exc:
                return self._failed(ref, exc)
        if claim is None or (claim.get("metadata") or {}).get("uid") != ref.uid:
            return "gone"  # deleted (or a new claim of the same name): nothing of ours to keep in it
        devices = desired_devices(claim, wish, driver=self.settings.driver_name, pool=self.settings.pool_name,
                                  now=timestamp(time.time()))
        current = (claim.get("status") or {}).get("devices") or []
        if same_entries(devices, current):
            self._wrote(ref, wish, claim)
            return "unchanged"
        ours = [d for d in devices if is_ours(d, self.settings.driver_name, self.settings.pool_name)]
        for entry in ours:
            size = len(json.dumps(entry.get("data") or {}, separators=(",", ":")))
            if size > MAX_DATA_BYTES:  # cannot happen with what device_data writes; refused rather than sent
                log.error("status.devices data too large", device=entry["device"], bytes=size)
                return "invalid"
        body = {"metadata": {"resourceVersion": (claim.get("metadata") or {}).get("resourceVersion")},
                "status": {"devices": devices or None}}
        try:
            # The path is written out in full: tests/chart/test_rbac.py derives the chart's RBAC from it.
            answer = self.rest.request(
                "PATCH",
                f"/apis/resource.k8s.io/v1/namespaces/{quote(ref.namespace, safe='')}/resourceclaims/"
                f"{quote(ref.name, safe='')}/status",
                body=body, content_type=MERGE_PATCH, timeout=self.settings.timeout,
            )  # fmt: skip
        except ApiError as exc:
            return self._failed(ref, exc)
        stored = {entry_key(e) for e in (answer.get("status") or {}).get("devices") or [] if isinstance(e, Mapping)
                  and is_ours(e, self.settings.driver_name, self.settings.pool_name)}
        if ours and not stored:
            # DRAResourceClaimDeviceStatus is off: the API server dropped the field (pkg/registry/resource/
            # resourceclaim/strategy.go dropDisabledDRAResourceClaimDeviceStatusFields).
            with self._changed:
                self._unsupported = "the API server dropped status.devices (gate DRAResourceClaimDeviceStatus off)"
                self._pending.clear()
            log.warning("not writing claim status.devices any more", reason=self._unsupported)
            return "unsupported"
        log.debug("claim status.devices written", claim=f"{ref.namespace}/{ref.name}", entries=len(ours))
        self._wrote(ref, wish, answer)
        return "success"

    def _wrote(self, ref: ClaimRef, wish: Wish, claim: JsonObject) -> None:
        """Keep what the removal of the claim's entries will need (`_written`), unless this was that removal."""
        if wish.removal:
            return
        meta = claim.get("metadata") or {}
        kept = {"metadata": {k: meta[k] for k in ("uid", "resourceVersion", "generation") if k in meta},
                "status": {"devices": (claim.get("status") or {}).get("devices") or []}}  # fmt: skip
        with self._changed:
            self._keep(self._written, ref.uid, kept)

    def _failed(self, ref: ClaimRef, exc: ApiError) -> str:
        claim = f"{ref.namespace}/{ref.name}"
        if exc.status == 404:
            return "gone"
        if exc.status == 409:
            return "conflict"
        if exc.status == 403:
            log.error("not allowed to write the claim's status.devices: the plugin's role needs patch on "
                      "resourceclaims/status and, from Kubernetes 1.36, associated-node:patch on resourceclaims/driver "
                      "(docs/reference/claim-device-status.md)", claim=claim, error=str(exc))
            return "forbidden"
        if exc.status in (400, 422):
            log.warning("the API server refused the claim's status.devices", claim=claim, error=str(exc))
            return "invalid"
        log.info("writing the claim's status.devices failed; retrying", claim=claim, error=str(exc))
        return "error"


# --- the observer on the prepare pipeline -------------------------------------------------------------------


class DeviceStatusReport:
    """The prepare pipeline's observer that hands each claim's outcome to the writer: the prepared devices (from the
    record the engine's answer carries), a failed prepare's error, or the removal after an unprepare. Reads no
    checkpoint and waits for no API call."""

    def __init__(
        self, writer: DeviceStatusWriter, *, catalog: Callable[[], Mapping[str, AllocatableDevice]], node: str
    ) -> None:
        self._writer = writer
        self._catalog = catalog
        self._node = node

    def prepared(self, outcomes: Sequence[PrepareOutcome]) -> dict[str, PrepareResult]:
        for ref, result in ((o.ref, o.result) for o in outcomes):
            if result.error:
                self._writer.submit(ref, Wish(failure=result.error))
            elif result.devices:  # none: nothing of ours allocated
                record = cast("ClaimRecord | None", result.record)  # the GPU engine's answers carry its ClaimRecord
                wish = prepared_wish(record, self._catalog(), node=self._node)
                if wish is not None:
                    self._writer.submit(ref, wish)
        return {}

    def unprepared(self, outcomes: Sequence[UnprepareOutcome]) -> dict[str, str]:
        for outcome in outcomes:
            if not outcome.error:
                self._writer.submit(outcome.ref, REMOVE)
        return {}
