"""The chart's alerts and dashboard against the real plugin: every metric they read is exposed by a live plugin
at start (families are declared even before a labelled series exists), runbooks exist, and the idle-GPU alert
fires on samples recorded from a live plugin holding an idle GPU (and not on a busy one)."""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.nvml.types import DeviceUtilisation
from tests.chart.helm import CHART, REPO
from tests.observability.conftest import LivePlugin
from tests.observability.promql import Labels, Recorded, duration, firing, metric_names
from tests.observability.scrape import find, scrape
from tests.polling import wait_for

# Synthesised by Prometheus for every target, never exposed by one.
PROMETHEUS_SERIES = frozenset({"up"})


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    dash = json.loads((CHART / "files" / "dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    for var in dash["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):  # label_values(<metric>, <label>): the metric is the first argument
            found = re.fullmatch(r"label_values\((\w+),\s*\w+\)", query["query"])
            assert found, query
            exprs.append(found.group(1))
    return exprs


def exposed_names(port: int) -> set[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    names: set[str] = set()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
        names.update(s.name for s in family.samples)
    return names


def test_the_tokenizer_finds_metric_names_only() -> None:
    expr = (
        'sum by (node, le) (rate(a_bucket{operation="prepare"}[10m])) / on (instance) b_total > 0.1 '
        "and histogram_quantile(0.99, c) < bool 1e3 unless time() - process_start_time_seconds > 600"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c", "process_start_time_seconds"}


def test_every_alert_and_panel_reads_metrics_a_live_plugin_exposes_at_start(live: LivePlugin) -> None:
    exposed = exposed_names(live.port) | PROMETHEUS_SERIES
    exprs = [r["expr"] for r in rules()] + dashboard_exprs()
    read = set().union(*(metric_names(e) for e in exprs))
    assert "dra_driver_gpu_utilization_ratio" in read and "dra_driver_devices" in read
    assert read <= exposed, f"not exposed by the plugin: {sorted(read - exposed)}"


def test_every_alert_has_a_runbook_in_the_operations_doc() -> None:
    doc = (REPO / "docs" / "operations.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", doc, re.M)}
    for rule in rules():
        runbook = rule["annotations"]["runbook"]
        assert runbook == f"docs/operations.md#{rule['alert'].lower()}", rule["alert"]
        assert rule["alert"].lower() in anchors, f"no runbook section for {rule['alert']}"


def test_an_idle_allocated_gpu_fires_its_alert_and_a_busy_one_does_not(live: LivePlugin) -> None:
    """Samples recorded from the live plugin (one claim on an idle GPU, one on a busy one, as the fake's usage and
    load model make them), replayed at a 15 s scrape interval over 4 hours, through the rule's expression and `for`."""
    idle = live.claim("ml", "parked", ["gpu-2"], pod="notebook-0")
    busy = live.claim("ml", "train", ["gpu-3"], pod="trainer-0")
    live.nvml.set_usage(live.nvml.gpus()[2].uuid, DeviceUtilisation(gpu_utilization_percent=1))
    assert all(r.error == "" for r in live.plugin.engine.prepare([idle, busy]).values())
    name = "dra_driver_gpu_utilization_ratio"
    wait_for(lambda: len(find(scrape(live.port), name, namespace="ml")) == 2, 10, "usage of both claims")
    (rule,) = [r for r in rules() if r["alert"] == "DraDriverGpuAllocatedIdle"]

    step, hours = 15.0, 4
    times = [i * step for i in range(int(hours * 3600 / step))]
    recorded: list[Recorded] = []
    for sample in find(scrape(live.port), name, namespace="ml"):  # one real scrape per series, replayed
        labels: Labels = tuple(sorted(sample.labels.items()))
        recorded.append(Recorded(labels, [(t, sample.value) for t in times]))
    evaluations = times[::4]  # every minute
    result = firing(rule["expr"], rule["for"], {name: recorded}, evaluations)

    def claims_firing(t: float) -> set[str]:
        return {dict(labels)["claim"] for labels in result[t]}

    window = duration(re.search(r"\[(\w+)\]", rule["expr"]).group(1))  # type: ignore[union-attr]
    first = next(t for t in evaluations if claims_firing(t))
    assert claims_firing(first) == {"parked"}  # never the busy one
    # Idle from the first sample: true as soon as the window holds samples, then `for` must pass.
    assert first == duration(rule["for"])
    assert window + duration(rule["for"]) >= 3 * 3600  # "idle for a long time": 2 h of window, 1 h of `for`
    assert all(claims_firing(t) == {"parked"} for t in evaluations if t >= first)
    fired = {dict(labels)["pod"] for labels in result[evaluations[-1]]}
    assert fired == {"notebook-0"}  # the alert names who holds the GPU

    # One busy minute inside the window keeps it quiet: the alert is about sustained idleness.
    blip = [Recorded(s.labels, [(t, 0.5 if 7200 <= t < 7260 else v) for t, v in s.samples]) for s in recorded]
    result = firing(rule["expr"], rule["for"], {name: blip}, evaluations)
    assert not any(result[t] for t in evaluations if 7200 <= t < 7200 + window)
