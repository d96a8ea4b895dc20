"""Prometheus metrics of the kubelet plugin, served by `observability.endpoint.HttpEndpoint` (`--metrics-port`,
and `--healthz-port` beside the probes).

One registry per plugin instance (no global state): tests and several in-process plugins never collide. Every
series with a known label set exists from the start at zero (a missing series is not a zero to PromQL), and the
standard process, platform and gc collectors are registered on the same registry. Naming follows Prometheus: base
units (`_seconds`, `_bytes`, `_watts`, `_celsius`, `_hertz`), `_ratio` for 0-1 fractions, `_total` for counters.
"""

from __future__ import annotations

import platform
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from time import monotonic

from prometheus_client import (
    GC_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from dra_driver import __version__
from dra_driver.observability.registrar import Registrar
from dra_driver.observability.usage import UsageSample

# Prepare takes milliseconds on a fake GPU and up to seconds when MIG instances are created.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# A checkpoint write is one fsync'd rename: sub-millisecond on local SSDs, tens of ms on slow disks.
WRITE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# MIG create/destroy: tens of ms to a few seconds (enabling MIG mode on the way can take longer).
MIG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

OPERATIONS = ("prepare", "unprepare")
OUTCOMES = ("success", "error")
PREPARED_TYPES = ("gpu", "mig", "share")  # what a claim holds: a whole GPU, a MIG device, a GPU share
PUBLISHED_TYPES = ("gpu", "gpu-share", "mig", "vfio", "vgpu", "fm-partition")  # the slices' `type` attribute
HEALTH_STATES = ("healthy", "unhealthy")
MIG_OPERATIONS = ("create", "destroy")
# A claim's status.devices write (plugin/devicestatus.py): written, nothing to change, retried (conflict, error),
# given up (gone, invalid, forbidden, abandoned after the retries, dropped: queue full), or the server drops the field.
DEVICE_STATUS_OUTCOMES = ("success", "unchanged", "conflict", "error", "gone", "invalid", "forbidden", "abandoned",
                          "dropped", "unsupported")
# The holder of a device, as labels on every usage series (so `sum by (namespace)` works).
USAGE_LABELS = ("namespace", "claim", "pod", "device", "gpu_uuid", "profile", "share")


def add_process_collectors(registry: CollectorRegistry) -> None:
    """The standard process_*, python_info and python_gc_* series, on a plugin's own registry."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    if GC_COLLECTOR is not None:
        GCCollector(registry=registry)


@dataclass(frozen=True)
class UtilisationLabels:
    """Who holds a prepared device: the usage series' labels. `pod` is empty when not known."""

    namespace: str
    claim: str
    pod: str
    device: str
    gpu_uuid: str  # the device's own UUID (a MIG device's MIG-… UUID), what was sampled
    profile: str  # MIG profile, "gpu" for a whole GPU
    share: str  # shareID of a consumable-capacity share, else ""

    def labels(self) -> tuple[str, ...]:
        return (self.namespace, self.claim, self.pod, self.device, self.gpu_uuid, self.profile, self.share)


@dataclass
class PluginMetrics:
    """The GPU kubelet plugin's Prometheus metrics, in one registry."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    process_collectors: bool = True  # process_*, python_info, python_gc_*: off only for tests that want less

    def __post_init__(self) -> None:
        r = self.registry
        if self.process_collectors:
            add_process_collectors(r)
        declare = Registrar(r)
        self.build_info = declare.gauge("dra_driver_build_info", "Always 1; the driver's version and Python", "version",
                                        "python")
        self.build_info.labels(__version__, platform.python_version()).set(1)
        # --- claims ----------------------------------------------------------------------------------
        self.claim_operations = declare.counter("dra_driver_claim_operations",
                                                "Prepare/unprepare operations per claim by outcome", "operation",
                                                "outcome")
        self.claim_seconds = declare.histogram("dra_driver_claim_operation_seconds",
                                               "Time to prepare or unprepare one claim, by outcome", "operation",
                                               "outcome", buckets=LATENCY_BUCKETS)
        # The children of the fixed label sets, resolved once: prometheus_client's labels() validates the values and
        # takes the metric's lock on every call, paid per claim otherwise.
        self._claim_children: dict[tuple[str, str], tuple[Counter, Histogram]] = {
            (operation, outcome): (
                self.claim_operations.labels(operation, outcome),
                self.claim_seconds.labels(operation, outcome),
            )
            for operation in OPERATIONS
            for outcome in OUTCOMES
        }
        self.prepared_claims = declare.gauge("dra_driver_prepared_claims", "Claims currently prepared on this node")
        self.prepared_devices = declare.gauge("dra_driver_prepared_devices",
                                              "Devices currently prepared on this node, by type", "type")
        self._prepared_children = {kind: self.prepared_devices.labels(kind) for kind in PREPARED_TYPES}
        self.mps_daemons = declare.gauge("dra_driver_mps_daemons_running",
                                         "MPS control daemons the plugin runs for prepared claims")
        # What `set_prepared` last set each of these gauges to (None: never set), in its order.
        self._prepared_gauges: tuple[Gauge, ...] = (
            self.prepared_claims, *self._prepared_children.values(), self.mps_daemons
        )
        self._prepared_last: tuple[int | None, ...] = (None,) * len(self._prepared_gauges)
        self.checkpoint_write_seconds = declare.histogram(
            "dra_driver_checkpoint_write_seconds",
            "Time to write the checkpoint durably (one group commit: write, fsync, rename)", buckets=WRITE_BUCKETS)
        # --- devices and slices ----------------------------------------------------------------------
        self.published_devices = declare.gauge("dra_driver_published_devices", "Devices this node offers, by type",
                                               "type")
        for kind in PUBLISHED_TYPES:
            self.published_devices.labels(kind)
        self.devices_by_health = declare.gauge("dra_driver_devices", "Devices this node offers, by health", "health")
        for health in HEALTH_STATES:
            self.devices_by_health.labels(health)
        self.publish_operations = declare.counter("dra_driver_slice_publish_operations",
                                                  "ResourceSlice publishing passes by outcome", "outcome")
        for outcome in OUTCOMES:
            self.publish_operations.labels(outcome)
        self.published_slices = declare.gauge("dra_driver_published_slices",
                                              "ResourceSlices of this node's pool after the last complete pass")
        self.last_publish = declare.gauge("dra_driver_slice_publish_last_success_timestamp_seconds",
                                          "Unix time of the last complete publishing pass (0: none yet)")
        # --- MIG -------------------------------------------------------------------------------------
        self.mig_seconds = declare.histogram("dra_driver_mig_operation_seconds",
                                             "Time to create (GPU + compute instance) or destroy one MIG device",
                                             "operation", buckets=MIG_BUCKETS)
        self.mig_failures = declare.counter("dra_driver_mig_operation_failures",
                                            "MIG create/destroy operations that failed", "operation")
        for operation in MIG_OPERATIONS:
            self.mig_seconds.labels(operation)
            self.mig_failures.labels(operation)
        # --- usage of prepared devices (the sampler) -------------------------------------------------
        # Built at scrape time from the last pass's samples (`UsageSeries`): a pass swaps one mapping instead of
        # labelling, setting and removing ten series per held device (prometheus_client's labels() and remove()
        # validate and lock on every call: ≈ 230 µs per device that came or went, paid by every claim).
        self.usage = UsageSeries()
        r.register(self.usage)
        self.usage_samples = declare.counter("dra_driver_usage_samples", "Usage sampling passes by outcome", "outcome")
        for outcome in OUTCOMES:
            self.usage_samples.labels(outcome)

    # --- recorders (each one cheap: a dict lookup and a float add) -----------------------------------

        # --- device health transitions (ops-health; a separate block to ease merging) ---
        self.device_health_transitions = declare.counter(
            "dra_driver_device_health_transitions",
            "Device taints added or removed by the health keeper, by transition (tainted, untainted) and reason "
            "(xid, xid-application, ecc, gpu-lost, healthy-window, admin-clear, admin-taint, admin-untaint)",
            "transition", "reason")
        # --- end of device health transitions ---
        # --- claim status.devices writes (KEP-4817; a separate block to ease merging) ---
        self.claim_device_status_writes = declare.counter(
            "dra_driver_claim_device_status_writes",
            "Writes of this driver's entries in ResourceClaim status.devices, by outcome (plugin/devicestatus.py)",
            "outcome")
        for outcome in DEVICE_STATUS_OUTCOMES:
            self.claim_device_status_writes.labels(outcome)
        # --- end of claim status.devices writes ---
        # --- NVIDIA driver reloads (issue 26; a separate block to ease merging) ---
        self.driver_reloads = declare.counter(
            "dra_driver_nvidia_driver_reloads",
            "NVIDIA driver reloads this plugin detected while serving (plugin/driverreload.py), by outcome "
            "(reinitialised, restart: the process exits so that the new driver's NVML library is loaded)", "outcome")
        for reload_outcome in ("reinitialised", "restart"):
            self.driver_reloads.labels(reload_outcome)
        self.driver_state = declare.gauge(
            "dra_driver_nvidia_driver_state",
            "1 for the state the node's NVIDIA driver is in as this plugin sees it (ready, not-ready, reloading), "
            "0 for the others", "state")
        self.claims_lost_in_reload = declare.counter(
            "dra_driver_claims_lost_in_driver_reload",
            "Prepared claims whose device did not survive an NVIDIA driver reload (a MIG instance gone)")
        # --- end of NVIDIA driver reloads ---

    def observe(self, operation: str, seconds: float, ok: bool) -> None:
        outcome = "success" if ok else "error"
        children = self._claim_children.get((operation, outcome))
        if children is None:  # not one of OPERATIONS
            children = self.claim_operations.labels(operation, outcome), self.claim_seconds.labels(operation, outcome)
        children[0].inc()
        children[1].observe(seconds)

    @contextmanager
    def mig_operation(self, operation: str) -> Iterator[None]:
        """Time a MIG create/destroy; an exception counts as a failure and propagates."""
        started = monotonic()
        try:
            yield
        except BaseException:
            self.mig_failures.labels(operation).inc()
            raise
        finally:
            self.mig_seconds.labels(operation).observe(monotonic() - started)

    def published(self, slices: int, now: float) -> None:
        self.publish_operations.labels("success").inc()
        self.published_slices.set(slices)
        self.last_publish.set(now)

    def publish_failed(self) -> None:
        self.publish_operations.labels("error").inc()

    def set_prepared(self, claims: int, devices: Mapping[str, int], mps_daemons: int) -> None:
        """Called by one writer at a time (`PreparedMetrics`, under its lock). Only the gauges whose value changed
        are set: each set takes the gauge's lock, and a claim's write changes two of the five (claims and its
        devices' type), twice per claim."""
        values = (claims, *(devices.get(kind, 0) for kind in self._prepared_children), mps_daemons)
        for gauge, value, last in zip(self._prepared_gauges, values, self._prepared_last, strict=True):
            if value != last:
                gauge.set(value)
        self._prepared_last = values

    def set_usage(
        self, samples: Mapping[UtilisationLabels, UsageSample], *, unchanged: Collection[UtilisationLabels] = ()
    ) -> None:
        """Replace the usage series: holders in neither `samples` nor `unchanged` (released devices) lose their
        series; those in `unchanged` keep theirs as last set (a pass that sampled only the devices newly held)."""
        self.usage.replace(samples, unchanged)


# name, help, what of a sample (None: the device cannot report it, no series rather than a zero)
_USAGE_GAUGES: tuple[tuple[str, str, Callable[[UsageSample], float | None]], ...] = (
    ("dra_driver_gpu_utilization_ratio", "GPU (SM) busy ratio of a held device, 0-1",
     lambda u: _ratio(u.gpu_utilization_percent)),
    ("dra_driver_gpu_memory_utilization_ratio", "Memory-controller busy ratio of a held device",
     lambda u: _ratio(u.memory_utilization_percent)),
    ("dra_driver_gpu_memory_used_bytes", "Device memory in use on a held device", lambda u: u.memory_used_bytes),
    ("dra_driver_gpu_memory_total_bytes", "Device memory of a held device", lambda u: u.memory_total_bytes),
    ("dra_driver_gpu_power_watts", "Power draw of a held GPU", lambda u: u.power_watts),
    ("dra_driver_gpu_temperature_celsius", "Temperature of a held GPU", lambda u: u.temperature_celsius),
    ("dra_driver_gpu_sm_clock_hertz", "SM clock of a held GPU", lambda u: u.sm_clock_hertz),
    ("dra_driver_gpu_throttled",
     "1 while a held GPU runs slower than asked for (power cap, thermal or hardware slowdown), else 0",
     lambda u: None if u.throttling is None else float(bool(u.throttling))),
)  # fmt: skip
# NVML's volatile counters are monotonic since the driver loaded: exported as counter-typed gauges.
_ECC = ("dra_driver_gpu_ecc_errors_total",
        "ECC errors of a held GPU since the driver loaded, by type (corrected, uncorrected)")  # fmt: skip


class UsageSeries(Collector):
    """The usage series of the held devices, labelled with their holder: the samples of the last pass, rendered
    when scraped. A pass replaces the whole mapping (readers see one pass or the next, never a mix)."""

    def __init__(self) -> None:
        self._samples: Mapping[UtilisationLabels, UsageSample] = {}
        self._lock = threading.Lock()  # between passes; a scrape reads the current mapping without it

    def replace(
        self, samples: Mapping[UtilisationLabels, UsageSample], unchanged: Collection[UtilisationLabels] = ()
    ) -> None:
        with self._lock:
            kept = {holder: self._samples[holder] for holder in unchanged if holder in self._samples}
            self._samples = {**kept, **samples}

    def holders(self) -> frozenset[UtilisationLabels]:
        return frozenset(self._samples)

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        samples = self._samples
        families = self._families()
        for holder, usage in samples.items():
            labels = list(holder.labels())
            for family, (_, _, read) in zip(families, _USAGE_GAUGES, strict=False):
                value = read(usage)
                if value is not None:
                    family.add_metric(labels, value)
            for kind, count in (("corrected", usage.ecc_corrected_total),
                                ("uncorrected", usage.ecc_uncorrected_total)):  # fmt: skip
                if count is not None:
                    families[-1].add_metric([*labels, kind], count)
        yield from families

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        families = [GaugeMetricFamily(name, help_text, labels=USAGE_LABELS) for name, help_text, _ in _USAGE_GAUGES]
        families.append(GaugeMetricFamily(_ECC[0], _ECC[1], labels=[*USAGE_LABELS, "type"]))
        return families


def _ratio(percent: int | None) -> float | None:
    return None if percent is None else percent / 100
