"""Our kubelet plugin and the DRA example driver's as upstream's kubelet sees them (issue 37 item 3).

`make bench-peer-kubelet` (or `.venv/bin/python -m bench.peer_kubelet_bench`): on a real node of Kubernetes 1.37
(docs/upstream.md "Real node": kube-apiserver, kube-scheduler, kube-controller-manager, and the kubelet with
containerd), the same pod runs `--pods` times one after the other, first with our GPU kubelet plugin (fake NVML
dgx-h100, as the real-node tests start it: MIG mode dynamic unless `--mig-mode static`; DeviceClass `gpu.dra.dev`),
then with the example driver's kubelet plugin (`sigs.k8s.io/dra-example-driver`, built as `make bench-peer` builds
it; DeviceClass `gpu.example.com`, 8 devices) registered with the same kubelet, ours stopped. The pod: one
ResourceClaim of one device, one busybox container `sleep 1`, restartPolicy Never. Before each driver's pods, one
uncounted warm-up pod.

From the kubelet's own metrics (`GET /api/v1/nodes/<node>/proxy/metrics` as admin; names and labels as kubelet
1.37.2 defines them in pkg/kubelet/metrics and observes them in pkg/kubelet/cm/dra):
  dra_operations_duration_seconds{operation_name="PrepareResources"|"UnprepareResources", is_error}
      the kubelet's whole handling of a pod's claims when it starts (stops): claim lookups, the gRPC call, its cache
      and checkpoint. It carries no driver label: each driver's pods run in a phase of their own, and the figures
      are the differences between scrapes around that phase's pods.
  dra_grpc_operations_duration_seconds{driver_name, method_name=".../NodePrepareResources"|".../NodeUnprepareResources",
      grpc_status_code}: the gRPC call alone, as the kubelet's client interceptor times it.
Both are histograms with the buckets ExponentialBucketsRange(0.1, 40, 15): the first bucket ends at 100 ms, so a
quantile from the buckets says only "at most 100 ms" for anything quicker. Since the pods run one at a time, the
metrics are also scraped before each pod and after it is deleted: the increment of a histogram's sum over one pod is
the kubelet's own measurement of that pod's operation(s), exact, and p50/p99 are taken over those. Mean = sum/count.
Beside them: the pod's create -> Running (the POST until a GET first shows phase Running, polled every 20 ms).

Where the binaries of Kubernetes 1.37 are not built, this machine cannot run a real node, or the example driver
cannot be built (no Go), it prints `bench-peer-kubelet: SKIPPED: <why>` and exits 0.

    .venv/bin/python -m bench.peer_kubelet_bench                 # 30 pods per driver
    BENCH_SHORT=1 .venv/bin/python -m bench.peer_kubelet_bench   # 5 pods per driver
    .venv/bin/python -m bench.peer_kubelet_bench --pods 50 --json /tmp/peer-kubelet.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.common import SHORT, percentile

OURS = "ours"
EXAMPLE = "example"
OPERATIONS = "dra_operations_duration_seconds"
GRPC = "dra_grpc_operations_duration_seconds"
PREPARE_OP, UNPREPARE_OP = "PrepareResources", "UnprepareResources"
PREPARE_RPC, UNPREPARE_RPC = "NodePrepareResources", "NodeUnprepareResources"


# --- pure: histograms from the kubelet's /metrics -------------------------------------------------------------


@dataclass(frozen=True)
class Histogram:
    """One histogram series (or the sum of several): cumulative counts per upper bound (`le`, +Inf last), sum, count."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    def __sub__(self, earlier: Histogram) -> Histogram:
        """What was observed between the scrape of `earlier` and this one (same bounds; a series absent before is
        an empty Histogram)."""
        if not earlier.buckets:
            return self
        if [le for le, _ in earlier.buckets] != [le for le, _ in self.buckets]:
            raise ValueError("histograms with different bucket bounds cannot be subtracted")
        return Histogram(tuple((le, n - m) for (le, n), (_, m) in zip(self.buckets, earlier.buckets, strict=True)),
                         self.sum - earlier.sum, self.count - earlier.count)

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else math.nan


EMPTY = Histogram((), 0.0, 0.0)


def merged(series: Iterable[Histogram]) -> Histogram:
    """The sum of series with the same bounds (e.g. every grpc_status_code of one method)."""
    out = EMPTY
    for h in series:
        if not out.buckets:
            out = h
            continue
        if [le for le, _ in out.buckets] != [le for le, _ in h.buckets]:
            raise ValueError("histograms with different bucket bounds cannot be merged")
        out = Histogram(tuple((le, a + b) for (le, a), (_, b) in zip(out.buckets, h.buckets, strict=True)),
                        out.sum + h.sum, out.count + h.count)
    return out


Labels = frozenset[tuple[str, str]]


def histograms(text: str, name: str) -> dict[Labels, Histogram]:
    """Every series of histogram `name` in a Prometheus text exposition, by its labels (without `le`)."""
    parts: dict[Labels, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name or family.type != "histogram":
            continue
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k != "le"}
            part = parts.setdefault(frozenset(labels.items()), {"buckets": [], "sum": 0.0, "count": 0.0})
            if sample.name == f"{name}_bucket":
                part["buckets"].append((float(sample.labels["le"]), float(sample.value)))
            elif sample.name == f"{name}_sum":
                part["sum"] = float(sample.value)
            elif sample.name == f"{name}_count":
                part["count"] = float(sample.value)
    return {labels: Histogram(tuple(sorted(p["buckets"])), p["sum"], p["count"]) for labels, p in parts.items()}


def select(series: Mapping[Labels, Histogram], test: Callable[[Mapping[str, str]], bool]) -> Histogram:
    """The merged series whose labels pass `test`."""
    return merged(h for labels, h in series.items() if test(dict(labels)))


def operation(text: str, op: str) -> Histogram:
    """dra_operations_duration_seconds of `op` (PrepareResources / UnprepareResources), successes only."""
    return select(histograms(text, OPERATIONS),
                  lambda labels: labels.get("operation_name") == op and labels.get("is_error") == "false")


def grpc_call(text: str, driver: str, method: str) -> Histogram:
    """dra_grpc_operations_duration_seconds of `driver`'s `method` (the full gRPC method's last part, e.g.
    NodePrepareResources), every status code."""
    return select(histograms(text, GRPC), lambda labels: labels.get("driver_name") == driver
                  and labels.get("method_name", "").rsplit("/", 1)[-1] == method)


def bucket_bounds(h: Histogram, q: float) -> tuple[float, float]:
    """The bucket holding quantile `q` (0..1) of the observations: (lower bound, upper bound) in seconds. That is
    all the buckets can say; the upper bound is +Inf past the last finite bucket, and (nan, nan) without
    observations."""
    if h.count <= 0:
        return math.nan, math.nan
    rank = q * h.count
    lower = 0.0
    for le, cumulative in h.buckets:
        if cumulative >= rank:
            return lower, le
        lower = le
    return lower, math.inf


def increments(scrapes: Sequence[str], pick: Callable[[str], Histogram]) -> list[tuple[float, float]]:
    """(count, sum) added between consecutive scrapes, for the histogram `pick` reads from each."""
    seen = [pick(text) for text in scrapes]
    return [((b - a).count, (b - a).sum) for a, b in itertools.pairwise(seen)]


# --- pure: the figures and the table --------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """One measured quantity of one driver: exact per-pod values (s) where the pods allow it, and the phase's
    histogram (the kubelet's buckets) where the metric has one."""

    per_pod: tuple[float, ...]
    histogram: Histogram | None = None

    def row(self) -> dict[str, Any]:
        ms = [v * 1000 for v in self.per_pod]
        out: dict[str, Any] = {"n": len(ms), "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
                               "mean_ms": sum(ms) / len(ms) if ms else math.nan,
                               "per_pod_ms": [round(v, 3) for v in ms]}
        if self.histogram is not None:
            out["calls"] = self.histogram.count
            out["bucket_p50_ms"] = [b * 1000 for b in bucket_bounds(self.histogram, 0.5)]
            out["bucket_p99_ms"] = [b * 1000 for b in bucket_bounds(self.histogram, 0.99)]
            out["mean_ms"] = self.histogram.mean * 1000  # sum/count over every call, the kubelet's own mean
        return out


FIGURES = (
    ("PrepareResources", "dra_operations_duration_seconds PrepareResources"),
    ("NodePrepareResources", "dra_grpc_operations_duration_seconds NodePrepareResources"),
    ("UnprepareResources", "dra_operations_duration_seconds UnprepareResources"),
    ("NodeUnprepareResources", "dra_grpc_operations_duration_seconds NodeUnprepareResources"),
    ("create_to_running", "pod create -> Running (polled every 20 ms)"),
)


def _num(value: float) -> str:
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "+Inf"
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def _bucket(bounds: Sequence[float]) -> str:
    lower, upper = bounds
    if math.isnan(upper):
        return "-"
    return f"≤ {_num(upper)}" if lower == 0 else f"{_num(lower)}-{_num(upper)}"


def markdown_table(rows: Mapping[str, Mapping[str, Mapping[str, Any]]], labels: Mapping[str, str]) -> str:
    """rows[driver][figure key] -> Figure.row(); one line per figure and driver."""
    lines = ["| figure | driver | pods | calls | p50 (ms) | p99 (ms) | p50 from buckets (ms) | p99 from buckets (ms) "
             "| mean (ms) |", "|---|---|---|---|---|---|---|---|---|"]
    for key, title in FIGURES:
        for driver in (OURS, EXAMPLE):
            r = rows[driver][key]
            calls = f"{r['calls']:.0f}" if "calls" in r else "-"
            lines.append(f"| {title} | {labels[driver]} | {r['n']} | {calls} | {_num(r['p50_ms'])} "
                         f"| {_num(r['p99_ms'])} | {_bucket(r.get('bucket_p50_ms', (math.nan, math.nan)))} "
                         f"| {_bucket(r.get('bucket_p99_ms', (math.nan, math.nan)))} | {_num(r['mean_ms'])} |")
    return "\n".join(lines)


# --- the command ------------------------------------------------------------------------------------------------


def unavailable() -> str | None:
    """Why this machine cannot run the bench (None: it can): the release's binaries, a real node, the example
    driver."""
    from dra_sandbox.upstream.build import DEFAULT_MINOR, UpstreamUnavailable, _go, find_release
    from dra_sandbox.upstream.node import unavailable_reason

    try:
        if find_release(DEFAULT_MINOR) is None:
            _go()  # the check the build makes: without Go, `make upstream` cannot help either
            return f"Kubernetes {DEFAULT_MINOR} is not built here: run `make upstream`"
    except UpstreamUnavailable as exc:
        return str(exc)
    return unavailable_reason()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_kubelet_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=5 if SHORT else 30, help="pods per driver, one at a time")
    parser.add_argument("--mig-mode", choices=("dynamic", "static"), default="dynamic",
                        help="our plugin's MIG mode (dynamic: as the real-node tests start it; static: as "
                             "bench-peer runs it)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args(argv)
    if args.pods < 1:
        parser.error("--pods must be at least 1")

    def say(line: str) -> None:
        print(line, flush=True)

    from dra_sandbox.upstream.build import (
        EXAMPLE_DRIVER_VERSION,
        UpstreamError,
        UpstreamUnavailable,
        build_example_driver,
    )

    reason = unavailable()
    if reason is not None:
        say(f"bench-peer-kubelet: SKIPPED: no real Kubernetes node on this machine: {reason}")
        return 0
    try:
        built = build_example_driver(say)
    except UpstreamUnavailable as exc:
        say(f"bench-peer-kubelet: SKIPPED: the example driver cannot be built on this machine: {exc}")
        return 0
    except UpstreamError as exc:
        print(f"bench-peer-kubelet: building the example driver failed: {exc}", file=sys.stderr)
        return 1
    # Imported here: the measuring half starts a cluster; the tests of the pure half above never load it.
    from bench.peer_kubelet_run import run

    results = run(built.binaries["dra-example-kubeletplugin"], args.pods, args.mig_mode, say)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    labels = {OURS: "ours", EXAMPLE: f"example driver {EXAMPLE_DRIVER_VERSION}"}
    say(f"== as kubelet {results['kubernetes']} sees them: {args.pods} pods per driver, one at a time, ours in "
        f"MIG mode {args.mig_mode} ({results['seconds']} s)")
    for driver in (OURS, EXAMPLE):
        say(f"{labels[driver]}: load average before {results['loadavg'][driver][0]}, after "
            f"{results['loadavg'][driver][1]} ({os.cpu_count()} CPUs)")
    say(markdown_table(results["rows"], labels))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
