"""Declaring Prometheus series on one registry: each component (kubelet plugin, controller) has its own registry,
so that tests and several in-process instances never collide, and declares every series through one `Registrar`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True)
class Registrar:
    """Makes the series of `registry`: a name, a help text and the label names (none: a single series)."""

    registry: CollectorRegistry

    def counter(self, name: str, help_text: str, *labels: str) -> Counter:
        return Counter(name, help_text, labels, registry=self.registry)

    def gauge(self, name: str, help_text: str, *labels: str) -> Gauge:
        return Gauge(name, help_text, labels, registry=self.registry)

    def histogram(self, name: str, help_text: str, *labels: str, buckets: Sequence[float]) -> Histogram:
        return Histogram(name, help_text, labels, buckets=buckets, registry=self.registry)
