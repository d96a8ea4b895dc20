"""Prometheus metrics of the compute-domain kubelet plugin, served on its own `--healthz-port` (beside the probes)
and `--metrics-port` by `observability.endpoint.HttpEndpoint`.

Named `dra_driver_compute_domain_*`: the GPU plugin's `dra_driver_claim_*` series (observability/metrics.py) run in
the same pod, and a query by name (`sum(rate(dra_driver_claim_operations_total[5m]))`) must not add the two drivers'
claims together. One registry per plugin instance (no global state); every series with a known label set exists
from the start at zero, as in the GPU plugin's registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from dra_driver import __version__
from dra_driver.observability.metrics import OPERATIONS, OUTCOMES, add_process_collectors
from dra_driver.observability.registrar import Registrar

CD_METRIC_PREFIX = "dra_driver_compute_domain_"
# Why a prepare failed (docs/compute-domains.md, "Metrics"): a claim that can never be prepared as it is
# (invalid), a retry of a prepare an unprepare already aborted (stale), this node's IMEX daemon not Ready within
# --readiness-wait (not-ready), the node's claim state held by recovery (busy), the API server unreachable (api),
# any other refusal with a message (failed: a ComputeDomain not found yet, a device number unreadable, a CDI spec
# not written), a bug (internal).
PREPARE_ERROR_REASONS = ("invalid", "stale", "not-ready", "busy", "api", "failed", "internal")
# A channel prepare is milliseconds; one that waits for the IMEX daemon takes up to --readiness-wait (10 s).
PREPARE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0)


@dataclass
class CdPluginMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    process_collectors: bool = True

    def __post_init__(self) -> None:
        r = self.registry
        if self.process_collectors:
            add_process_collectors(r)
        declare = Registrar(r)
        self.build_info = declare.gauge(CD_METRIC_PREFIX + "build_info", "Always 1; the driver's version", "version")
        self.build_info.labels(__version__).set(1)
        self.claim_operations = declare.counter(
            CD_METRIC_PREFIX + "claim_operations",
            "Prepare/unprepare operations per compute-domain claim by outcome (a not-ready prepare is an error)",
            "operation",
            "outcome",
        )
        self.prepare_errors = declare.counter(
            CD_METRIC_PREFIX + "prepare_errors", "Failed prepares of compute-domain claims by reason", "reason"
        )
        self.prepare_seconds = declare.histogram(
            CD_METRIC_PREFIX + "prepare_seconds",
            "Time to prepare one compute-domain claim (IMEX readiness wait included), by outcome",
            "outcome",
            buckets=PREPARE_BUCKETS,
        )
        self.prepared_claims = declare.gauge(
            CD_METRIC_PREFIX + "prepared_claims", "Compute-domain claims currently prepared on this node"
        )
        # Children resolved once: labels() validates and locks on every call.
        self._operations = {(op, out): self.claim_operations.labels(op, out) for op in OPERATIONS for out in OUTCOMES}
        self._errors = {reason: self.prepare_errors.labels(reason) for reason in PREPARE_ERROR_REASONS}
        self._seconds = {out: self.prepare_seconds.labels(out) for out in OUTCOMES}

    def prepared(self, seconds: float, error_reason: str = "") -> None:
        """One claim's prepare: `error_reason` empty on success, else one of PREPARE_ERROR_REASONS."""
        outcome = "error" if error_reason else "success"
        self._operations["prepare", outcome].inc()
        self._seconds[outcome].observe(seconds)
        if error_reason:
            errors = self._errors.get(error_reason)
            (errors if errors is not None else self.prepare_errors.labels(error_reason)).inc()

    def unprepared(self, ok: bool) -> None:
        self._operations["unprepare", "success" if ok else "error"].inc()
