"""An NVIDIA driver reload while the plugin serves: noticed, waited out, and every prepared claim checked again.

The GPU Operator upgrades the driver by unloading the `nvidia` kernel module and loading another version under the
running plugin (NVIDIA/k8s-driver-manager#203: a plugin that keeps its NVML handle serves a dead driver until it is
restarted). Here (docs/kubelet-plugin.md, "Driver reload"):

    detect    NVML says the driver is gone or was replaced: UNINITIALIZED / DRIVER_NOT_LOADED from a call that is
              not about a GPU, or one of UNINITIALIZED / DRIVER_NOT_LOADED / GPU_IS_LOST from every GPU (one GPU
              alone is a health problem: plugin/health/), or another driver version than the one published.
              Asked by the health monitor when its event wait fails, by the rediscovery loop, and after a claim
              operation that failed.
    reloading the board says RELOADING (the reporters listening on it log it, put it on /healthz, the Node Event
              and annotation); new prepares, and unprepares that need the driver, are refused with a retryable
              error (plugin/reloadgate.py); every published device gets the taint `<driver>/unmonitored=driver-reload`
              with effect None (1.35+; a 1.34 server has no effect None: no taint there)
    re-init   the health monitor is parked outside its event wait, then NVML shutdown() + init(), retried with
              backoff until the driver is back; a stale real NVML library (LIB_RM_VERSION_MISMATCH after an
              upgrade) cannot be swapped in a process: the plugin exits for the kubelet to restart it
    serve     under the node's operation lock (no claim operation runs): re-discover and republish (the
              `driverVersion` attribute changes), re-verify every prepared claim (reverify_claims), the health
              monitor registers its events again, the taint goes, READY, a Normal `NvidiaDriverReloaded` Event

Re-verifying keeps every checkpoint record. A claim whose MIG instance is gone (a reload destroys every GPU and
compute instance) is *lost*: its record is marked (ClaimRecord.lost), a Warning `PreparedClaimLost` Event names
the device, and its next prepare fails with that message; it is never re-created, because a new instance at the
same placement is another device (another MIG UUID, empty memory) under the name the container was given, and
the container using it died with the old driver. What the reload reset on a GPU the claim still holds
(time-slice, compute mode, the MPS daemon, the CDI spec's driver files) is repaired: re-applied as recorded.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from dra_driver.backoff import Backoff, Retries
from dra_driver.errors import DraDriverError
from dra_driver.fsutil import atomic_write
from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.k8s.events import NORMAL, WARNING, EventRecorder
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.kubeletplugin.nodeevents import NodeEvents
from dra_driver.nvidiadriver.state import DriverState, DriverStatusBoard
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.types import NvmlError, NvmlLibraryStaleError, NvmlReturn, NvmlUnavailableError
from dra_driver.observability.metrics import PluginMetrics
from dra_driver.plugin.checkpoint import Checkpoint, ClaimRecord, ClaimState, PreparedDevice
from dra_driver.plugin.claimevents import claim_object
from dra_driver.plugin.engine import PrepareEngine
from dra_driver.plugin.health.problems import DeviceProblem

log = structlog.get_logger(__name__)

# Between NVML re-init attempts during a reload; the cap is also the pause after a reload handling that failed.
RELOAD_BACKOFF = Backoff(0.25, 10.0)

# What NVML answers on a handle whose driver went away (unloaded) or was replaced (loaded again since init).
DRIVER_GONE: frozenset[NvmlReturn] = frozenset(
    {NvmlReturn.UNINITIALIZED, NvmlReturn.DRIVER_NOT_LOADED, NvmlReturn.GPU_IS_LOST}
)
# From a call that is not about one GPU, only these mean the driver itself (GPU_IS_LOST names a GPU).
SYSTEM_GONE: frozenset[NvmlReturn] = frozenset({NvmlReturn.UNINITIALIZED, NvmlReturn.DRIVER_NOT_LOADED})
UNMONITORED_KEY = "unmonitored"  # taint <driver>/unmonitored=driver-reload:None
UNMONITORED_VALUE = "driver-reload"
EVENT_RELOADED = "NvidiaDriverReloaded"
EVENT_CLAIM_LOST = "PreparedClaimLost"
EXIT_DRIVER_UPGRADED = 75  # EX_TEMPFAIL: the kubelet restarts the container, which loads the new NVML library


def unmonitored_problem(driver_name: str) -> DeviceProblem:
    return DeviceProblem(
        f"{driver_name}/{UNMONITORED_KEY}", UNMONITORED_VALUE, "None",
        "the NVIDIA driver is reloading: the device is not monitored and cannot be prepared until it is back",
    )  # fmt: skip


def reload_reason(
    system_error: NvmlError | None,
    gpu_errors: Mapping[str, NvmlError | None],
    *,
    published_version: str | None,
    version_now: str | None,
) -> str | None:
    """Why the driver counts as reloaded, or None. Pure. `gpu_errors`: each probed GPU's error (None: it answered)."""
    if system_error is not None and system_error.code in SYSTEM_GONE:
        return f"NVML answers NVML_ERROR_{system_error.code.name} ({system_error.call}): the nvidia driver went away"
    if published_version is not None and version_now is not None and version_now != published_version:
        return f"the nvidia driver version changed from {published_version} to {version_now}"
    if not gpu_errors or any(e is None or e.code not in DRIVER_GONE for e in gpu_errors.values()):
        return None
    # Every GPU lost at once: the driver, not the GPUs. On a node with one GPU a lost GPU and an unloaded driver
    # look alike; only the system call above tells them apart, so one GPU alone stays a health problem.
    if len(gpu_errors) < 2 and system_error is None:
        return None
    codes = sorted({f"NVML_ERROR_{e.code.name}" for e in gpu_errors.values() if e is not None})
    return f"every GPU answers {', '.join(codes)}: the nvidia driver went away"


def retry_message(node_name: str, what: str) -> str:
    return f"the NVIDIA driver is reloading on node {node_name}; {what}; the kubelet retries"


def needs_driver(record: ClaimRecord | None, engine: PrepareEngine) -> bool:
    """Whether unpreparing this record needs the NVIDIA driver: anything but a completed claim that holds nothing
    on the node except its CDI spec (a whole GPU used as it is), whose unprepare only removes files."""
    if record is None:
        return False
    if record.state is not ClaimState.PREPARE_COMPLETED:
        return True  # a half-done record is rolled back or released through the effects
    return any(effect.holds(record) for effect in engine.parts.effects.devices)


@dataclass(frozen=True)
class ReverifyReport:
    verified: tuple[str, ...] = ()  # uids found as recorded, or repaired (settings re-applied)
    lost: tuple[str, ...] = ()  # uids marked lost (their MIG instance or device is gone)
    failed: tuple[str, ...] = ()  # uids whose repair failed (their next prepare says why)


def lost_devices(
    record: ClaimRecord, checkpoint: Checkpoint, catalog: Mapping[str, AllocatableDevice], engine: PrepareEngine
) -> list[str]:
    """The devices of a completed record that a driver reload took: no longer offered, or a MIG instance that is
    not there as recorded (the MIG effect's verify, device by device).

    A passed-through GPU is judged by its binding, not by the catalog: a reload of `nvidia` never touches a GPU on
    vfio-pci, and a plugin that restarted while the GPU was there has never read it from NVML, so its device is
    missing from the catalog while the VM runs (docs/passthrough.md). It is lost only where the passthrough effect's
    verify finds a recorded function gone or off its vfio driver and the catalog does not offer the device either
    (where the catalog offers it, the claim's repair moves a function back)."""
    mig_effects = [e for e in engine.parts.effects.devices if e.kind == "mig-partition"]
    vfio_effects = [e for e in engine.parts.effects.devices if e.kind == "vfio-passthrough"]
    gone = []
    for device in record.devices:
        if device.vfio is not None:
            if device.device not in catalog and any(
                e.verify(record, (device,), checkpoint, catalog) for e in vfio_effects
            ):
                gone.append(device.device)
            continue
        if device.device not in catalog or (device.mig is not None and any(
            e.verify(record, (device,), checkpoint, catalog) for e in mig_effects
        )):
            gone.append(device.device)
    return gone


def lost_message(node_name: str, devices: Collection[str], records: Collection[PreparedDevice]) -> str:
    mig = any(d.mig is not None for d in records if d.device in devices)
    what = "its MIG instance is gone" if mig else "it is no longer offered"
    return (
        f"device {', '.join(sorted(devices))} of this claim did not survive the NVIDIA driver reload on node "
        f"{node_name} ({what}; the container using it lost it with the old driver); delete the pod so that the "
        "claim is released and allocated again"
    )


def mark_lost_claims(
    engine: PrepareEngine, *, node_name: str, events: EventRecorder | None, metrics: PluginMetrics
) -> tuple[list[str], list[ClaimRecord]]:
    """Mark every completed claim whose device the reload took (lost_devices) and report it; the caller holds the
    node's operation lock. Returns (the uids marked lost, the other completed records)."""
    checkpoint = engine.prepared_claims()
    catalog = engine.parts.catalog()
    lost: list[str] = []
    others: list[ClaimRecord] = []
    for record in list(checkpoint.claims.values()):
        if record.state is not ClaimState.PREPARE_COMPLETED or record.lost is not None:
            continue
        gone = lost_devices(record, checkpoint, catalog, engine)
        if not gone:
            others.append(record)
            continue
        message = lost_message(node_name, gone, record.devices)

        def mark(cp: Checkpoint, uid: str = record.uid, text: str = message) -> Checkpoint:
            current = cp.claims.get(uid)
            if current is None or current.state is not ClaimState.PREPARE_COMPLETED:
                return cp
            return cp.with_claim(replace(current, lost=text))

        engine.parts.checkpoint.update(mark)
        log.error("a prepared claim was lost in the driver reload", devices=gone,
                  claim=f"{record.namespace}/{record.name}", claim_uid=record.uid)  # fmt: skip
        metrics.claims_lost_in_reload.inc()
        if events is not None:
            ref = ClaimRef(record.namespace, record.name, record.uid)
            events.record(claim_object(ref), type=WARNING, reason=EVENT_CLAIM_LOST, message=message)
        lost.append(record.uid)
    return lost, others


def reverify_claims(
    engine: PrepareEngine, *, node_name: str, events: EventRecorder | None, metrics: PluginMetrics
) -> ReverifyReport:
    """Every completed claim against the new driver (the caller holds the node's operation lock). Records are
    kept; lost ones are marked and reported, the others repaired."""
    lost, others = mark_lost_claims(engine, node_name=node_name, events=events, metrics=metrics)
    verified, failed = [], []
    for record in others:
        try:
            engine.repair_claim(record.uid)
        except DraDriverError as exc:
            log.warning("a prepared claim could not be repaired after the driver reload; its next prepare says why",
                        error=str(exc), claim=f"{record.namespace}/{record.name}", claim_uid=record.uid)  # fmt: skip
            failed.append(record.uid)
            continue
        verified.append(record.uid)
    engine.record_prepared(engine.prepared_claims())
    return ReverifyReport(tuple(verified), tuple(lost), tuple(failed))


class DriverVersionFile:
    """`<plugin-dir>/nvidia-driver-version`: the driver version the prepared claims were last verified against. A
    plugin that starts on another version (the driver was upgraded while it was down, or it exited for a stale NVML
    library) marks the lost claims before its start-up recovery, which would otherwise re-create their MIG
    instances as if an admin had destroyed them. (A reload of the same version while the plugin is down cannot be
    told from that: docs/kubelet-plugin.md, "Driver reload".)"""

    NAME = "nvidia-driver-version"

    def __init__(self, plugin_dir: Path) -> None:
        self.path = plugin_dir / self.NAME

    def read(self) -> str | None:
        try:
            return self.path.read_text().strip() or None
        except OSError:
            return None

    def write(self, version: str) -> None:
        if self.read() != version:
            atomic_write(self.path, f"{version}\n".encode(), mode=0o600)


def mark_claims_lost_while_down(
    engine: PrepareEngine, version_file: DriverVersionFile, driver_version: str | None, *, node_name: str,
    events: EventRecorder | None, metrics: PluginMetrics,
) -> None:  # fmt: skip
    """Before start-up recovery (which would re-create a missing MIG instance): where the driver was upgraded since
    the claims were last verified, their MIG instances went with the old one: mark them lost."""
    verified = version_file.read()
    if verified is None or driver_version is None or verified == driver_version:
        return
    log.warning("the NVIDIA driver changed while the plugin was down; checking the prepared claims",
                verified_with=verified, driver_version=driver_version)  # fmt: skip
    with engine.parts.operations.exclusive(engine.settings.recovery_lock_timeout):
        mark_lost_claims(engine, node_name=node_name, events=events, metrics=metrics)


@dataclass(frozen=True, kw_only=True)
class ReloadParts:
    """What the watcher works with (plugin/app.py): NVML, the driver's status board, where it reports, and what the
    plugin does at each step."""

    nvml: NvmlBackend
    board: DriverStatusBoard
    events: NodeEvents  # the Normal `NvidiaDriverReloaded` Event on the Node
    metrics: PluginMetrics
    version_file: DriverVersionFile | None = None  # the driver version the claims were last verified against
    gpus: Callable[[], Collection[str]]  # the GPUs to probe (NVML's, as last discovered)
    published_version: Callable[[], str | None]  # the driverVersion the slices carry
    taint: Callable[[bool], None]  # the unmonitored taint on every published device (or off)
    exclusive: Callable[[], AbstractContextManager[None]]  # no claim operation runs meanwhile
    rediscover: Callable[[], object]  # re-read the hardware and republish
    reverify: Callable[[], ReverifyReport]
    park_monitor: Callable[[], object]  # the health monitor out of its NVML event wait
    resume_monitor: Callable[[], None]  # ... and registered again on the new driver
    exit_for_restart: Callable[[str], None]  # a stale NVML library: the process must go


class DriverReloadWatcher:
    """Detects a reload (check) and handles it in its own thread; one reload at a time."""

    def __init__(self, parts: ReloadParts, *, backoff: Backoff = RELOAD_BACKOFF) -> None:
        self.parts = parts
        self._backoff = backoff
        self._lock = threading.Lock()
        self._reason: str | None = None  # a detected reload not handled yet
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="driver-reload", daemon=True)
        parts.board.listen(lambda _previous, current: self._show_state(current.state))
        self._show_state(parts.board.status().state)

    def _show_state(self, state: DriverState) -> None:
        for each in DriverState:
            self.parts.metrics.driver_state.labels(each.value).set(1 if each is state else 0)

    def start(self) -> None:
        """Once the plugin serves: the driver answered the start-up discovery, so it is READY with its version."""
        version = self.parts.published_version()
        if self.parts.board.status().state is not DriverState.READY:
            self.parts.board.set(DriverState.READY, driver_version=version)
        if version is not None:
            self._remember(version)
        self._thread.start()

    def _remember(self, version: str) -> None:
        if self.parts.version_file is not None:
            try:
                self.parts.version_file.write(version)
            except OSError as exc:
                log.warning("could not record the driver version the claims were verified against",
                            path=str(self.parts.version_file.path), error=str(exc))  # fmt: skip

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15.0)

    @property
    def reloading(self) -> bool:
        with self._lock:
            return self._reason is not None or self.parts.board.status().state is DriverState.RELOADING

    def probe(self) -> str | None:
        """Ask NVML whether the driver is still the one published; the reason it is not, else None."""
        system_error: NvmlError | None = None
        version_now: str | None = None
        try:
            version_now = self.parts.nvml.system_info().driver_version
        except NvmlError as exc:
            system_error = exc
        gpu_errors: dict[str, NvmlError | None] = {}
        if system_error is None or system_error.code not in SYSTEM_GONE:
            for uuid in self.parts.gpus():
                try:
                    self.parts.nvml.compute_mode(uuid)
                    gpu_errors[uuid] = None
                except NvmlError as exc:
                    gpu_errors[uuid] = exc
        return reload_reason(
            system_error, gpu_errors, published_version=self.parts.published_version(), version_now=version_now
        )

    def check(self) -> bool:
        """Probe now (any thread: the monitor's, the rediscovery loop's, a claim operation's); True when the driver
        is reloading (the watcher's thread handles it)."""
        if self.reloading:
            return True
        if self._stop.is_set():
            return False
        reason = self.probe()
        if reason is None:
            return False
        with self._lock:
            if self._reason is None:
                self._reason = reason
        self._wake.set()
        return True

    def on_event_wait_error(self, error: NvmlError) -> bool:
        """The health monitor's event wait failed: True (park the monitor) when it is the driver, not one GPU."""
        return error.code in DRIVER_GONE and self.check()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                reason = self._reason
            if reason is None or self._stop.is_set():
                continue
            try:
                self.handle(reason)
            except Exception:
                log.exception("handling the driver reload failed; trying again")
                self._stop.wait(self._backoff.cap)
                self._wake.set()
                continue
            with self._lock:
                self._reason = None

    def handle(self, reason: str) -> None:
        """The whole reload, in the calling thread: returns once the plugin serves the new driver again (or the
        watcher stops, or the process must restart)."""
        before = self.parts.published_version()
        log.warning("the NVIDIA driver is reloading; claims wait until it is back", reason=reason)
        self.parts.board.set(DriverState.RELOADING, reason)
        self.parts.taint(True)
        self.parts.park_monitor()
        retries = Retries(self._backoff)
        while not self._stop.is_set():
            attempt = self._attempt()
            if attempt is not None:
                version, report = attempt
                break
            self._stop.wait(retries.next())
        else:
            return
        self.parts.resume_monitor()
        self.parts.metrics.driver_reloads.labels("reinitialised").inc()
        message = (
            f"NVML re-initialised with the NVIDIA driver {version}" + (f" (was {before})" if before != version else "")
            + f"; prepared claims re-verified: {len(report.verified)} as recorded, {len(report.lost)} lost"
            + (f", {len(report.failed)} not repairable" if report.failed else "")
        )  # fmt: skip
        log.info("the NVIDIA driver is back", driver_version=version, previous=before, verified=len(report.verified),
                 lost=len(report.lost), failed=len(report.failed))  # fmt: skip
        self.parts.board.set(DriverState.READY, driver_version=version)
        self.parts.taint(False)  # after READY: a device without the taint can be prepared
        self.parts.events.record(type=NORMAL, reason=EVENT_RELOADED, message=message)

    def _attempt(self) -> tuple[str, ReverifyReport] | None:
        """One try: re-init NVML, then (no claim operation running) re-discover and re-verify. None: not yet."""
        try:
            with self.parts.exclusive():
                version = self._reinit()
                if version is None:
                    return None
                self.parts.rediscover()
                report = self.parts.reverify()
                self._remember(version)
        except NvmlError as exc:  # the driver went again mid-way
            log.info("the NVIDIA driver is not back yet", error=str(exc))
            return None
        except DraDriverError as exc:  # the node's claim state busy: the next try waits again
            log.info("waiting for claim operations before re-initialising NVML", error=str(exc))
            return None
        return version, report

    def _reinit(self) -> str | None:
        with contextlib.suppress(NvmlError):
            self.parts.nvml.shutdown()
        try:
            self.parts.nvml.init()
        except NvmlLibraryStaleError as exc:
            self.parts.metrics.driver_reloads.labels("restart").inc()
            log.error("restarting: the NVML library of this process is the old driver's", error=str(exc))
            self.parts.exit_for_restart(str(exc))
            self._stop.set()
            return None
        except NvmlUnavailableError as exc:
            log.info("the NVIDIA driver is not back yet", error=str(exc))
            return None
        return self.parts.nvml.system_info().driver_version


@contextlib.contextmanager
def nothing_held() -> Iterator[None]:
    """ReloadParts.exclusive where no claim operations exist (tests)."""
    yield
