"""Prometheus metrics of the kubelet plugin (served at `/metrics` on the health port).

One registry per plugin instance (no global state): tests and several in-process plugins never collide.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Prepare takes milliseconds on a fake GPU and up to seconds when MIG instances are created.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class PluginMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.claim_operations = Counter(
            "dra_driver_claim_operations",
            "Prepare/unprepare operations per claim by outcome",
            ["operation", "outcome"],
            registry=self.registry,
        )
        self.claim_seconds = Histogram(
            "dra_driver_claim_operation_seconds",
            "Time to prepare or unprepare one claim",
            ["operation"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.prepared_claims = Gauge(
            "dra_driver_prepared_claims", "Claims currently prepared on this node", registry=self.registry
        )
        self.published_devices = Gauge(
            "dra_driver_published_devices", "Devices this node offers, by type", ["type"], registry=self.registry
        )

        # --- device health transitions (ops-health; a separate block to ease merging) ---
        self.device_health_transitions = Counter(
            "dra_driver_device_health_transitions",
            "Device taints added or removed by the health keeper, by transition (tainted, untainted) and reason "
            "(xid, xid-application, ecc, gpu-lost, healthy-window, admin-clear, admin-taint, admin-untaint)",
            ["transition", "reason"],
            registry=self.registry,
        )
        # --- end of device health transitions ---

    def observe(self, operation: str, seconds: float, ok: bool) -> None:
        self.claim_operations.labels(operation, "success" if ok else "error").inc()
        self.claim_seconds.labels(operation).observe(seconds)

    def exposition(self) -> bytes:
        return bytes(generate_latest(self.registry))
