"""Prometheus metrics of `dra-driver controller`, served at `/metrics` on `--metrics-port`.

One registry per controller instance (tests run several in one process). Every series exists from the start
(zero), so alerts and dashboards need no `absent()`. Reconcile and policy series come from the leader only;
followers report zeros there, and `dra_driver_controller_leader` says which replica is which.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_client import CollectorRegistry

from dra_driver.observability.registrar import Registrar

# One reconcile is one or two API requests: milliseconds, up to the client timeout (10 s) when it fails.
RECONCILE_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# ready: the class matches (Ready=True); invalid: Ready=False, nothing to retry (spec, conflict);
# retry: an API failure, tried again later; error: the handler raised.
OUTCOMES: Final = ("ready", "invalid", "retry", "error")
READY_STATUSES: Final = ("True", "False", "Unknown")
# "malformed": refused before any check ran (no AdmissionReview, or one the checks cannot read; docs/webhook.md).
ADMISSION_RESULTS: Final = ("allowed", "denied", "malformed")
ADMISSION_RESOURCES: Final = ("resourceclaims", "resourceclaimtemplates", "deviceclasses")
# ComputeDomains (controller/computedomains/): status.status values, the steps of one pass, binding verdicts.
DOMAIN_STATUSES: Final = ("Ready", "NotReady")
DOMAIN_STEPS: Final = ("objects", "status", "cleanup", "binding")
BINDING_VERDICTS: Final = ("ready", "failed")


@dataclass
class ControllerMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: dict[str, str] = {}  # policy name -> status of its Ready condition
        declare = Registrar(self.registry)
        self.reconciles = declare.counter("dra_driver_controller_reconciles",
                                          "Reconciles of GpuSharingPolicies by outcome", "outcome")
        self.reconcile_seconds = declare.histogram("dra_driver_controller_reconcile_seconds",
                                                   "Time to reconcile one policy (its DeviceClass)",
                                                   buckets=RECONCILE_BUCKETS)
        self.policies = declare.gauge("dra_driver_controller_policies",
                                      "GpuSharingPolicies by the status of their Ready condition", "ready")
        self.leader = declare.gauge("dra_driver_controller_leader",
                                    "1 while this replica holds the leader Lease (or runs without election)")
        self.admissions = declare.counter("dra_driver_controller_admissions",
                                          "Admission reviews answered by the validating webhook", "resource", "result")
        self.stale_slices_deleted = declare.counter("dra_driver_controller_stale_slices_deleted",
                                                    "ResourceSlices of vanished Nodes deleted by the slice hygiene")
        self.compute_domains = declare.gauge("dra_driver_controller_compute_domains", "ComputeDomains by status.status",
                                             "status")
        self.compute_domain_nodes = declare.gauge(
            "dra_driver_controller_compute_domain_nodes",
            "Nodes in ComputeDomains' status.nodes, by the status of their IMEX daemon", "status")
        self.compute_domain_errors = declare.counter(
            "dra_driver_controller_compute_domain_reconcile_errors",
            "Failed steps of the ComputeDomain reconciler (API errors; retried on the next pass)", "step")
        self.binding_conditions = declare.counter(
            "dra_driver_controller_compute_domain_binding_conditions",
            "Binding conditions set in channel claims' status.devices (imex-ready / imex-failed)", "verdict")
        for status in DOMAIN_STATUSES:
            self.compute_domains.labels(status).set(0)
            self.compute_domain_nodes.labels(status).set(0)
        for step in DOMAIN_STEPS:
            self.compute_domain_errors.labels(step)
        for verdict in BINDING_VERDICTS:
            self.binding_conditions.labels(verdict)
        for outcome in OUTCOMES:
            self.reconciles.labels(outcome)
        for status in READY_STATUSES:
            self.policies.labels(status).set(0)
        for resource in ADMISSION_RESOURCES:
            for result in ADMISSION_RESULTS:
                self.admissions.labels(resource, result)

    def observe_reconcile(self, outcome: str, seconds: float) -> None:
        self.reconciles.labels(outcome).inc()
        self.reconcile_seconds.observe(seconds)

    def observe_policy(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A watch event of a policy: its Ready status counts (until it is deleted)."""
        name = str((body.get("metadata") or {}).get("name") or "")
        with self._lock:
            if event_type == "DELETED":
                self._ready.pop(name, None)
            else:
                conditions = (body.get("status") or {}).get("conditions") or []
                ready = next((c for c in conditions if isinstance(c, Mapping) and c.get("type") == "Ready"), None)
                status = str(ready.get("status")) if ready else "Unknown"
                self._ready[name] = status if status in READY_STATUSES else "Unknown"
            counts = {s: 0 for s in READY_STATUSES}
            for status in self._ready.values():
                counts[status] += 1
        for status, n in counts.items():
            self.policies.labels(status).set(n)

    def forget_policies(self) -> None:
        """No longer the leader: the policy counts are the new leader's to report."""
        with self._lock:
            self._ready.clear()
        for status in READY_STATUSES:
            self.policies.labels(status).set(0)
        self.observe_domains({}, {})

    def observe_domains(self, domains: Mapping[str, int], nodes: Mapping[str, int]) -> None:
        """One ComputeDomain pass's totals (status.status -> domains; daemon status -> nodes)."""
        for status in DOMAIN_STATUSES:
            self.compute_domains.labels(status).set(domains.get(status, 0))
            self.compute_domain_nodes.labels(status).set(nodes.get(status, 0))

    def observe_admission(self, resource: str, allowed: bool) -> None:
        self.admissions.labels(resource, "allowed" if allowed else "denied").inc()

    def observe_malformed_review(self, resource: str) -> None:
        self.admissions.labels(resource, "malformed").inc()

    def value(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        """One sample's value (0 when absent): for tests and the demo."""
        got = self.registry.get_sample_value(name, dict(labels or {}))
        return float(got or 0.0)
