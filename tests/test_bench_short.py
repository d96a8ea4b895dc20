"""The benchmarks run in their short form and report figures (never timed pass/fail).

One test per section of `bench.run_all` (each starts its own servers and processes), so the two CI workers share
them; `make bench` runs them all in one process. Each is `slow`: make test runs them in its second phase, after the
quick one (`make test-slow` alone).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_sections(*names: str) -> list[str]:
    """`python -m bench.run_all NAMES` in short form: its output split at each `== ` title."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.run_all", *names],
        cwd=ROOT,
        env={**os.environ, "BENCH_SHORT": "1"},
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [s for s in out.stdout.split("== ") if s.strip()]


def test_run_all_names_its_sections_each_has_a_test_and_an_unknown_one_is_refused() -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "bench.run_all", "--list"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    here = Path(__file__).read_text()
    assert len(listed) == 9 and [name for name in listed if f'run_sections("{name}")' not in here] == []
    wrong = subprocess.run(
        [sys.executable, "-m", "bench.run_all", "prepare", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert wrong.returncode == 2 and "unknown section(s) nope; choose from: prepare," in wrong.stderr
    assert wrong.stdout == ""  # refused before anything ran


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_prepare_bench_reports_its_figures() -> None:
    """Prepare/unprepare against its floors, with the summary and issue 22's goals tables."""
    sections = run_sections("prepare")
    assert len(sections) == 3  # the figures, then the summary and goals tables
    prepare = json.loads(sections[0].split("\n", 1)[1])
    assert prepare["grpc_round_trip_floor"]["n"] > 0
    assert prepare["claim_get_floor"]["p50_ms"] > 0 and prepare["fsynced_write_floor"]["p50_ms"] > 0
    for row in prepare["summary"]:
        assert row["value"] > 0 and row["floor"] > 0, row
    table = sections[1].splitlines()
    assert table[1].split() == ["figure", "value", "floor", "ratio", "unit"]
    assert len(table) == 3 + len(prepare["summary"])  # title, header, rule, one line per row
    assert prepare["concurrency_16"]["prepare"]["p99_ms"] > 0
    # Issue 22's goals table: the plugin's CPU per prepare (from /proc) and its RSS at rest, each with its goal.
    goals = {row["figure"]: row for row in prepare["goals"]}
    assert goals["plugin CPU ms per prepare, 1 at a time"]["value"] > 0
    assert goals["plugin RSS MiB at rest"]["value"] > 0 and goals["plugin RSS MiB at rest"]["goal"] == 60.0
    goal_table = sections[2].splitlines()
    assert goal_table[1].split()[:2] == ["goal", "(issue"] and len(goal_table) == 3 + len(prepare["goals"])
    # The plugin ran as its own process (its CPU is read from /proc) and the concurrent calls came from clients.
    assert prepare["concurrency_16"]["plugin_cpu_ms_per_prepare"] > 0 and prepare["client_processes"]["16"] >= 1
    assert {r["figure"] for r in prepare["summary"]} >= {"concurrency_16 unprepare claims/s"}


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_sharing_bench_reports_its_figures() -> None:
    """Whole GPU vs MPS claim vs MPS share."""
    sections = run_sections("sharing")
    assert len(sections) == 1
    sharing = json.loads(sections[0].split("\n", 1)[1])
    for kind in ("whole_gpu", "mps_claim", "mps_share"):
        assert sharing[kind]["prepare"]["n"] > 0 and sharing[kind]["unprepare"]["p99_ms"] > 0
    assert sharing["concurrency_64_shares_over_8_gpus"]["prepare"]["n"] == 64


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_startup_bench_reports_its_figures() -> None:
    """Kubelet-plugin start-up."""
    sections = run_sections("startup")
    assert len(sections) == 1
    startup = json.loads(sections[0].split("\n", 1)[1])
    assert startup["start_to_registered_s"]["p50"] > 0
    assert startup["cpu_to_registered_s"]["p50"] > 0  # the plugin's own CPU until registered, from /proc
    assert startup["start_to_published_s"]["p50"] >= startup["start_to_registered_s"]["p50"]
    assert startup["plugin_imports"]["cel_or_lark"] == []
    assert startup["plugin_imports"]["kubernetes"] is False
    assert startup["plugin_rss_mib_at_rest"]["p50"] > 0


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_publish_bench_reports_its_figures() -> None:
    """ResourceSlice publishing."""
    sections = run_sections("publish")
    assert len(sections) == 1
    publish = json.loads(sections[0].split("\n", 1)[1])
    assert publish["devices"] == 208
    assert publish["steady_state"]["resourceslice_writes"] == 0
    assert publish["sighup_rediscovery_unchanged"]["resourceslice_writes"] == 0


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_convergence_bench_reports_its_figures() -> None:
    """ResourceSlice convergence under API errors."""
    sections = run_sections("convergence")
    assert len(sections) == 1
    convergence = json.loads(sections[0].split("\n", 1)[1])
    for condition in ("clean", "faults_20pct", "outage_503", "outage_500"):
        result = convergence[condition]
        assert result["initial_s"]["max"] > 0 and result["change_s"]["max"] > 0, condition  # converged (not NaN)
        assert result["generations_written"] == [[1, 2]], condition  # one generation per content, whatever failed
    assert sum(convergence["faults_20pct"]["failed_requests_per_run"]) > 0


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_controller_bench_reports_its_figures() -> None:
    """The controller: policy to DeviceClass, and its start over a fleet."""
    sections = run_sections("controller")
    assert len(sections) == 1
    controller = json.loads(sections[0].split("\n", 1)[1])
    assert controller["sequential"]["class_s"]["n"] > 0 and controller["sequential"]["ready_s"]["p99"] > 0
    assert controller["burst"]["all_ready_s"] > 0
    for condition in ("errors_500", "errors_409"):
        assert controller[condition]["failed_requests"] > 0, condition
        assert controller[condition]["after_errors_s"] >= 0, condition  # converged (not NaN)
    assert controller["faults_30pct"]["converged_s"]["max"] > 0
    assert all(
        r["start_to_counts_s"] > 0 and r["peak_rss_mib"] > 0 for f in controller["fleet_start"] for r in f["runs"]
    )


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_fleet_bench_reports_its_figures() -> None:
    """Explain and the scheduler pass over a fleet."""
    sections = run_sections("fleet")
    assert len(sections) == 1
    fleet = json.loads(sections[0].split("\n", 1)[1])
    assert fleet["fleet"]["nodes"] == 50 and fleet["fleet"]["devices"] > 0
    assert fleet["api_per_node"]["resourceslices"] > 0 and fleet["api_per_node"]["list_json_bytes"] > 0
    for key in ("nowhere_one_node", "last_one_node", "nowhere_all_nodes", "last_all_nodes"):
        assert fleet["explain_s"][key] > 0, key
    assert fleet["scheduler_pass_s"]["plan_pod_cold"] > 0 and fleet["scheduler_pass_s"]["plan_pod_next_pass"] > 0
    assert fleet["controller"]["start_to_counts_s"] > 0  # counted (not NaN)
    assert fleet["controller"]["node_added_to_counts_s"] > 0


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_publish_fleet_bench_reports_its_figures() -> None:
    """The publishers' API requests across a fleet."""
    sections = run_sections("publish-fleet")
    assert len(sections) == 1
    publishers = json.loads(sections[0].split("\n", 1)[1])
    for preset, figures in publishers["by_preset"].items():
        assert figures["first_publish"]["by_request"]["create resourceslices"] == figures["slices"] > 0, preset
        assert "create resourceslices" not in figures["restart"]["by_request"], preset  # adopted, not rewritten
    assert publishers["first_minute"]["per_node_total"] > 0
    assert publishers["per_hour"]["resourceslice_writes"] == 0 and publishers["per_hour"]["per_node_per_hour_total"] > 0
    # No Node request at steady state (admin taints are DeviceTaintRules); the earlier releases' poll, measured
    # beside the same fleet, sent some.
    assert not [k for k in publishers["per_hour"]["requests"] if k.endswith(" nodes")]
    assert publishers["per_hour_before"]["fleet_of_n_node_gets_per_hour"] > 0
    assert publishers["per_hour_before"]["after_fleet_of_n_node_gets_per_hour"] == 0
    assert publishers["fleet_steady_state"]["resourceslice_writes"] == 0


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_soak_bench_reports_its_figures() -> None:
    """Prepare/unprepare cycles and the plugin's RSS curve."""
    sections = run_sections("soak")
    assert len(sections) == 2  # the figures, then the RSS curve
    soak = json.loads(sections[0].split("\n", 1)[1])
    assert soak["cycles"] >= 100 and soak["prepare"]["n"] == soak["cycles"] == soak["unprepare"]["n"]
    assert [row["cycles"] for row in soak["curve"]][-1] == soak["cycles"] and len(soak["curve"]) == 11
    assert all(row["rss_mib"] > 0 for row in soak["curve"])
    curve = sections[1].splitlines()
    assert curve[1].split()[:3] == ["cycles", "rss", "MiB"] and len(curve) == 3 + len(soak["curve"])
