"""The chart's monitoring objects: the metrics Service finds the plugin pods, the optional ServiceMonitor finds the
Service, the PrometheusRule and dashboard ConfigMap carry exactly the shipped files, and the flags follow values."""

from __future__ import annotations

import json
from typing import Any

import yaml

from tests.chart.helm import CHART, VALUE_SETS, Helm, by_kind, one, plugin_container


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_defaults_render_the_metrics_service_and_nothing_optional(helm: Helm) -> None:
    objects = helm.render()
    daemonset = one(objects, "DaemonSet")
    container = plugin_container(daemonset)
    assert {"name": "metrics", "containerPort": 9464, "protocol": "TCP"} in container["ports"]
    assert (env(container)["DRA_DRIVER_METRICS_PORT"], env(container)["DRA_DRIVER_USAGE_INTERVAL"]) == ("9464", "15")
    (service,) = [s for s in by_kind(objects, "Service") if s["metadata"]["name"].endswith("kubelet-plugin-metrics")]
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9464, "targetPort": "metrics", "protocol": "TCP"}]
    assert not by_kind(objects, "ServiceMonitor") and not by_kind(objects, "PrometheusRule")
    assert not [c for c in by_kind(objects, "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]


def test_monitoring_values_render_a_service_monitor_rules_and_a_dashboard(helm: Helm) -> None:
    objects = helm.render(VALUE_SETS["monitoring"])
    container = plugin_container(one(objects, "DaemonSet"))
    assert (env(container)["DRA_DRIVER_METRICS_PORT"], env(container)["DRA_DRIVER_USAGE_INTERVAL"]) == ("9500", "0")
    (service,) = [s for s in by_kind(objects, "Service") if s["metadata"]["name"].endswith("kubelet-plugin-metrics")]
    monitor = one(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    rule = one(objects, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    assert "{{ $labels.node }}" in json.dumps(rule["spec"])  # Prometheus templates pass through helm untouched
    (dashboard,) = [c for c in by_kind(objects, "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["dra-driver.json"]) == json.loads(
        (CHART / "files" / "dashboard.json").read_text()
    )
