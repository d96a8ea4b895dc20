"""The usage sampler: every `--usage-interval` seconds, one NVML usage sample per prepared device, exported as
gauges labelled with the device's holder (namespace, claim, pod, device, gpu_uuid, profile, share).

Only devices held by a prepared claim are sampled; a released device's series are removed on the next pass. A
GPU share reports the whole GPU's sample (NVML has no per-share figures), once per share. The passes woken by claim
operations sample only the devices newly held (and drop the released ones); every held device is read again on the
interval's passes and on `trigger`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog

from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind
from dra_driver.k8s.client import ApiError, JsonObject
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.types import DeviceUtilisation, NvmlError
from dra_driver.observability.metrics import PluginMetrics, UtilisationLabels
from dra_driver.plugin.checkpoint import Checkpoint, ClaimRecord, ClaimState, PreparedDevice

log = structlog.get_logger(__name__)

GetClaim = Callable[[str, str], JsonObject | None]
# The least time between two passes woken by claim operations (`trigger`): usage series follow a prepare or an
# unprepare within this long.
TRIGGER_GAP_S = 1.0


def pod_of(claim: JsonObject | None) -> str:
    """The pod a claim is reserved for (`status.reservedFor`, resource `pods`); "" when none or several."""
    reserved = ((claim or {}).get("status") or {}).get("reservedFor") or []
    pods = [str(r.get("name", "")) for r in reserved if isinstance(r, dict) and r.get("resource") == "pods"]
    return pods[0] if len(pods) == 1 else ""


def sampled_devices(
    checkpoint: Checkpoint, catalog: Mapping[str, AllocatableDevice], pods: Mapping[str, str]
) -> dict[UtilisationLabels, str]:
    """Each prepared device's holder labels -> the UUID to sample (a MIG device's own UUID, else the GPU's)."""
    out: dict[UtilisationLabels, str] = {}
    for record in checkpoint.claims.values():
        if record.state is not ClaimState.PREPARE_COMPLETED:
            continue
        for device in record.devices:
            holder = _holder(record, device, catalog.get(device.device), pods.get(record.uid, ""))
            if holder is not None:
                out[holder] = holder.gpu_uuid
    return out


def _holder(
    record: ClaimRecord, device: PreparedDevice, allocatable: AllocatableDevice | None, pod: str
) -> UtilisationLabels | None:
    profile = "gpu"
    uuid = device.gpu_uuid
    if device.mig is not None:
        uuid = device.mig.uuid
        profile = allocatable.profile.name if allocatable is not None and allocatable.profile is not None else "mig"
    elif allocatable is not None and allocatable.kind is DeviceKind.MIG_STATIC and allocatable.mig is not None:
        uuid = allocatable.mig.uuid
        profile = allocatable.profile.name if allocatable.profile is not None else "mig"
    if not uuid:
        return None
    return UtilisationLabels(
        namespace=record.namespace,
        claim=record.name,
        pod=pod,
        device=device.device,
        gpu_uuid=uuid,
        profile=profile,
        share=device.share_id or "",
    )


@dataclass(frozen=True, kw_only=True)
class SamplerParts:
    """What the sampler works with (plugin/app.py): NVML, the prepared devices (the checkpoint and the catalog
    they name), the claims (for their pods) and the gauges it sets."""

    nvml: NvmlBackend
    checkpoint: Callable[[], Checkpoint]
    catalog: Callable[[], Mapping[str, AllocatableDevice]]
    get_claim: GetClaim
    metrics: PluginMetrics


class UtilisationSampler:
    def __init__(self, parts: SamplerParts, *, interval: float, trigger_gap: float = TRIGGER_GAP_S) -> None:
        self.parts = parts
        self._interval = interval
        self._trigger_gap = min(trigger_gap, interval)
        # claim uid -> pod name ("": asked, reserved for no pod yet). Filled by `note_claim` from the claims the
        # engine reads anyway, and by a GET only for claims it never saw; pruned and retried on timed passes only,
        # so the passes that follow each prepare/unprepare cost the API nothing (64 concurrent prepares used to
        # bring ~64 more GETs).
        self._pods: dict[str, str] = {}
        self._pods_lock = threading.Lock()  # note_claim runs in the claim threads
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._wake_lock = threading.Lock()
        self._resample = False  # `trigger` asked for every held device to be read again, not only the new ones
        # The holders the last pass left series for (sampled, or kept from before): the sampler thread's own.
        self._sampled: frozenset[UtilisationLabels] = frozenset()
        self._thread = threading.Thread(target=self._run, name="usage-sampler", daemon=True)
        self.passes = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():  # a plugin that failed to start never started it
            self._thread.join(timeout=5.0)

    def trigger(self) -> None:
        """Sample every held device soon, without waiting an interval."""
        with self._wake_lock:
            self._resample = True
            self._wake.set()

    def claims_changed(self) -> None:
        """A claim was prepared or released: its series follow soon, without waiting an interval (the pass reads
        only the devices newly held, and none at all when no holder changed)."""
        self._wake.set()

    def note_claim(self, uid: str, claim: JsonObject) -> None:
        """The ResourceClaim as the engine read it for a prepare: its pod, without a GET of our own."""
        pod = pod_of(claim)
        with self._pods_lock:
            if pod or uid not in self._pods:
                self._pods[uid] = pod

    def sample_once(self, timed: bool = True, *, new_only: bool = False) -> None:
        """One pass. `timed` (the interval's pass, not one woken by a claim operation): also forget claims no
        longer prepared and ask again for the pod of claims reserved for none when last asked. `new_only` (a pass
        woken by a claim operation): sample only the holders the last pass left no series for, keep the others'
        as they are, and skip the pass when the holders are the same (each pass used to re-label and re-set every
        series of every held device: a burst of claims paid O(claims held) per pass)."""
        checkpoint = self.parts.checkpoint()
        live = {r.uid for r in checkpoint.claims.values() if r.state is ClaimState.PREPARE_COMPLETED}
        with self._pods_lock:
            if timed:
                # Only here: a claim noted while being prepared is not yet live, and must not be forgotten by the
                # pass that another claim's operation wakes meanwhile.
                for uid in [u for u in self._pods if u not in live]:
                    del self._pods[uid]
            ask = [
                r
                for r in checkpoint.claims.values()
                if r.uid in live and (r.uid not in self._pods or (timed and not self._pods[r.uid]))
            ]
        for record in ask:
            pod = self._pod(record)
            with self._pods_lock:
                self._pods[record.uid] = pod or self._pods.get(record.uid, "")
        with self._pods_lock:
            pods = dict(self._pods)
        current = sampled_devices(checkpoint, self.parts.catalog(), pods)
        kept: frozenset[UtilisationLabels] = frozenset()
        todo = current
        if new_only:
            kept = self._sampled.intersection(current)
            if len(kept) == len(current) == len(self._sampled):
                return  # no holder came or went: the series stand until the interval's pass
            todo = {holder: uuid for holder, uuid in current.items() if holder not in kept}
        samples: dict[UtilisationLabels, DeviceUtilisation] = {}
        failed = False
        cache: dict[str, DeviceUtilisation] = {}
        for holder, uuid in todo.items():
            try:
                if uuid not in cache:
                    cache[uuid] = self.parts.nvml.device_usage(uuid, held=True)
                samples[holder] = cache[uuid]
            except NvmlError as exc:  # a lost GPU: its series go away until it answers again
                failed = True
                log.debug("usage sample failed", device=holder.device, gpu_uuid=uuid, error=str(exc))
        self.parts.metrics.set_usage(samples, unchanged=kept)
        self._sampled = kept.union(samples)  # a failed one is tried again by the next pass
        self.parts.metrics.usage_samples.labels("error" if failed else "success").inc()
        self.passes += 1

    def _pod(self, record: ClaimRecord) -> str:
        try:
            return pod_of(self.parts.get_claim(record.namespace, record.name))
        except ApiError:
            return ""  # asked again on the next timed pass

    def _run(self) -> None:
        timed = True
        while not self._stop.is_set():
            with self._wake_lock:
                self._wake.clear()  # whatever woke this pass (or came during the gap) is covered by it
                resample, self._resample = self._resample, False
            try:
                self.sample_once(timed, new_only=not (timed or resample))
            except Exception:
                log.exception("usage sampling failed; retrying on the next pass")
            last = time.monotonic()
            timed = not self._wake.wait(self._interval)
            if not timed:
                # Woken by a claim operation: at most one such pass per gap, so a burst of prepares is sampled in
                # one or two passes, not one per claim (each pass reads every held device: O(claims²) CPU taken
                # from the claims in flight).
                self._stop.wait(max(0.0, last + self._trigger_gap - time.monotonic()))
