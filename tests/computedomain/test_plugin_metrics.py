"""The compute-domain plugin's Prometheus registry (dra_driver/computedomain/plugin/metrics.py): its names never
meet the GPU plugin's, every reason is there from the start, and a refused prepare gets the reason its error says."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from dra_driver.computedomain.plugin.effects.base import PermanentError
from dra_driver.computedomain.plugin.engine import StalePrepareError, error_reason
from dra_driver.computedomain.plugin.metrics import PREPARE_ERROR_REASONS, CdPluginMetrics
from dra_driver.errors import DraDriverError
from dra_driver.kubeletplugin.statedirs import NodeStateBusyError
from dra_driver.observability.metrics import PluginMetrics


def names(registry: CollectorRegistry) -> set[str]:
    return {sample.name for family in registry.collect() for sample in family.samples}


def test_its_series_do_not_clash_with_the_gpu_plugins() -> None:
    cd = names(CdPluginMetrics(process_collectors=False).registry)
    gpu = names(PluginMetrics(process_collectors=False).registry)
    assert cd and all(name.startswith("dra_driver_compute_domain_") for name in cd)
    assert cd.isdisjoint(gpu)


def test_prepare_outcomes_are_counted_by_reason() -> None:
    metrics = CdPluginMetrics(process_collectors=False)
    registry = metrics.registry
    for reason in PREPARE_ERROR_REASONS:
        assert registry.get_sample_value("dra_driver_compute_domain_prepare_errors_total", {"reason": reason}) == 0
    metrics.prepared(0.003)
    metrics.prepared(2.0, "not-ready")
    metrics.unprepared(False)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(f"dra_driver_compute_domain_{name}", labels)

    assert value("claim_operations_total", operation="prepare", outcome="success") == 1
    assert value("claim_operations_total", operation="prepare", outcome="error") == 1
    assert value("claim_operations_total", operation="unprepare", outcome="error") == 1
    assert value("prepare_errors_total", reason="not-ready") == 1
    assert value("prepare_seconds_bucket", outcome="success", le="0.005") == 1
    assert value("prepare_seconds_bucket", outcome="error", le="1.0") == 0
    assert value("prepare_seconds_sum", outcome="error") == 2.0


@pytest.mark.parametrize(("error", "reason"), [
    (StalePrepareError("stale prepare"), "stale"),
    (PermanentError("in another namespace"), "invalid"),
    (NodeStateBusyError("recovering"), "busy"),
    (DraDriverError("ComputeDomain not found"), "failed"),
])
def test_a_refusal_gets_the_reason_of_its_error(error: DraDriverError, reason: str) -> None:
    assert error_reason(error) == reason and reason in PREPARE_ERROR_REASONS
