"""`bench.peer_kubelet_bench`'s pure parts (no Go, no cluster): the kubelet's DRA histograms read from a /metrics
text, their differences between scrapes, the quantile's bucket, the table; and that a machine without the upstream
binaries or Go gets a skip, not a failure. `make bench-peer-kubelet` runs the bench itself."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.peer_kubelet_bench import (
    EXAMPLE,
    FIGURES,
    OURS,
    Figure,
    Histogram,
    bucket_bounds,
    grpc_call,
    histograms,
    increments,
    markdown_table,
    merged,
    operation,
)

ROOT = Path(__file__).resolve().parents[1]
# kubelet 1.37's DRADurationBuckets: ExponentialBucketsRange(0.1, 40, 15)
BOUNDS = [0.1 * 400 ** (i / 14) for i in range(15)]
PREPARE_METHOD = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"


def _series(name: str, labels: str, counts: list[int], total: float) -> str:
    """One histogram series as the kubelet writes it: cumulative buckets, +Inf, sum, count."""
    lines, running = [], 0
    for le, n in zip([*BOUNDS, math.inf], counts, strict=True):
        running += n
        bound = "+Inf" if math.isinf(le) else repr(le)
        lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {running}')
    lines += [f"{name}_sum{{{labels}}} {total}", f"{name}_count{{{labels}}} {running}"]
    return "\n".join(lines)


def _exposition(prepares: list[int], prepare_sum: float, grpc_ok: list[int], grpc_sum: float) -> str:
    none = [0] * 16
    return "\n".join([
        "# HELP dra_operations_duration_seconds [ALPHA] Latency histogram in seconds ...",
        "# TYPE dra_operations_duration_seconds histogram",
        _series("dra_operations_duration_seconds", 'is_error="false",operation_name="PrepareResources"', prepares,
                prepare_sum),
        _series("dra_operations_duration_seconds", 'is_error="true",operation_name="PrepareResources"',
                [1, *none[1:]], 0.05),
        _series("dra_operations_duration_seconds", 'is_error="false",operation_name="UnprepareResources"',
                [2, *none[1:]], 0.01),
        "# HELP dra_grpc_operations_duration_seconds [ALPHA] Duration in seconds of the DRA gRPC operations",
        "# TYPE dra_grpc_operations_duration_seconds histogram",
        _series("dra_grpc_operations_duration_seconds",
                f'driver_name="gpu.dra.dev",grpc_status_code="OK",method_name="{PREPARE_METHOD}"', grpc_ok, grpc_sum),
        _series("dra_grpc_operations_duration_seconds",
                f'driver_name="gpu.dra.dev",grpc_status_code="DeadlineExceeded",method_name="{PREPARE_METHOD}"',
                [0, 0, 1, *none[3:]], 0.2),
        _series("dra_grpc_operations_duration_seconds",
                f'driver_name="gpu.example.com",grpc_status_code="OK",method_name="{PREPARE_METHOD}"',
                [5, *none[1:]], 0.02),
        "# HELP kubelet_running_pods [ALPHA] Number of pods",
        "# TYPE kubelet_running_pods gauge",
        "kubelet_running_pods 3",
        "",
    ])


def test_a_histogram_is_read_with_its_cumulative_buckets_sum_and_count_by_labels() -> None:
    text = _exposition([3, 0, 1, *[0] * 13], 0.42, [4, *[0] * 15], 0.03)
    series = histograms(text, "dra_operations_duration_seconds")
    assert len(series) == 3
    ok = operation(text, "PrepareResources")  # is_error="false" only
    assert ok.count == 4 and ok.sum == pytest.approx(0.42)
    assert ok.buckets[0][0] == pytest.approx(0.1) and ok.buckets[0][1] == 3
    assert ok.buckets[2][1] == 4 and ok.buckets[-1] == (math.inf, 4)
    assert len(ok.buckets) == 16
    assert operation(text, "UnprepareResources").count == 2
    assert histograms(text, "kubelet_running_pods") == {}  # a gauge is not a histogram


def test_a_grpc_call_is_picked_by_driver_and_the_methods_last_part_over_every_status_code() -> None:
    text = _exposition([1, *[0] * 15], 0.001, [4, *[0] * 15], 0.03)
    ours = grpc_call(text, "gpu.dra.dev", "NodePrepareResources")
    assert ours.count == 5 and ours.sum == pytest.approx(0.23)  # OK 4 + DeadlineExceeded 1
    assert grpc_call(text, "gpu.example.com", "NodePrepareResources").count == 5
    assert grpc_call(text, "gpu.dra.dev", "NodeUnprepareResources").count == 0
    assert grpc_call(text, "gpu.dra.dev", "DRAPlugin/NodePrepareResources").count == 0  # the last part only


def test_what_two_scrapes_differ_by_is_what_was_observed_between_them() -> None:
    before = _exposition([3, *[0] * 15], 0.012, [3, *[0] * 15], 0.009)
    after = _exposition([4, 0, 1, *[0] * 13], 0.3, [5, *[0] * 15], 0.02)
    delta = operation(after, "PrepareResources") - operation(before, "PrepareResources")
    assert delta.count == 2 and delta.sum == pytest.approx(0.288) and delta.mean == pytest.approx(0.144)
    assert [n for _, n in delta.buckets[:4]] == [1, 1, 2, 2]
    assert increments([before, after, after], lambda t: operation(t, "PrepareResources")) == [
        (2, pytest.approx(0.288)), (0, 0)]
    with pytest.raises(ValueError, match="different bucket bounds"):
        _ = Histogram(((1.0, 1),), 1, 1) - Histogram(((2.0, 1),), 1, 1)
    assert merged([]).count == 0 and math.isnan(merged([]).mean)


def test_a_quantile_from_buckets_is_only_the_bucket_it_falls_in() -> None:
    h = Histogram(((0.1, 90), (0.2, 99), (0.4, 100), (math.inf, 100)), 5.0, 100)
    assert bucket_bounds(h, 0.5) == (0.0, 0.1)  # "at most 100 ms": all a 1-ms prepare can show
    assert bucket_bounds(h, 0.99) == (0.1, 0.2)
    assert bucket_bounds(h, 1.0) == (0.2, 0.4)
    beyond = Histogram(((0.1, 1), (math.inf, 4)), 200.0, 4)
    assert bucket_bounds(beyond, 0.99) == (0.1, math.inf)
    assert all(math.isnan(b) for b in bucket_bounds(Histogram((), 0, 0), 0.5))


def test_the_table_has_a_line_per_figure_and_driver_with_exact_and_bucket_bounded_quantiles() -> None:
    h = Histogram(((0.1, 30), (0.153, 30), (math.inf, 30)), 0.3, 30)
    rows = {driver: {key: Figure(tuple([0.002] * 29 + [0.05]), h if key != "create_to_running" else None).row()
                     for key, _ in FIGURES} for driver in (OURS, EXAMPLE)}
    table = markdown_table(rows, {OURS: "ours", EXAMPLE: "example driver v0.4.0"})
    lines = table.splitlines()
    assert len(lines) == 2 + 2 * len(FIGURES)
    prepare = lines[2].split(" | ")
    assert prepare[1:5] == ["ours", "30", "30", "2"]  # driver, pods, calls (the histogram's count), p50
    assert float(prepare[5]) == pytest.approx(2 + 48 * 0.71, rel=1e-2)  # p99 between the 29th and 30th pod
    assert prepare[6:] == ["≤ 100", "≤ 100", "10 |"]  # bucket-bounded; mean = sum / count of the histogram
    running = [line for line in lines if line.startswith("| pod create")][1].split(" | ")
    assert running[1:4] == ["example driver v0.4.0", "30", "-"] and running[6:8] == ["-", "-"]
    assert running[8] == f"{(0.002 * 29 + 0.05) / 30 * 1000:.3g} |"  # without a histogram: the pods' mean


def test_without_the_upstream_binaries_or_go_the_bench_skips_with_the_reason_and_exits_0(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    out = subprocess.run([sys.executable, "-m", "bench.peer_kubelet_bench", "--pods", "1"], cwd=ROOT,
                         env={"PATH": str(bin_dir), "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")},
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "bench-peer-kubelet: SKIPPED: no real Kubernetes node on this machine: " in out.stdout
    assert "Go" in out.stdout and "== as kubelet" not in out.stdout


def test_a_bad_count_is_refused_naming_the_option() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.peer_kubelet_bench", "--pods", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2 and "--pods must be at least 1" in out.stderr
