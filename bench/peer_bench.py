"""Our kubelet plugin beside the DRA example driver's (`sigs.k8s.io/dra-example-driver`), measured in one run.

`make bench-peer` (or `.venv/bin/python -m bench.peer_bench`): builds the example driver's kubelet plugin from its Go
module (`dra_sandbox.upstream.build.build_example_driver`: the pinned release, built into the cache outside the
repository; where Go or the module proxy is missing it prints why and exits 0 without measuring), then runs the two
plugins one after the other, alternating which goes first, for several rounds, on one machine against one sandbox
API server (its own process), with the same probe: the sandbox kubelet's DRA client (`dra_sandbox.kubelet.draclient`)
for one claim at a time, `bench.prepare_load` client processes for concurrent calls. Every claim has one device,
allocated as the scheduler would write it: `gpu-<i>` of driver `gpu.example.com` for the example driver, `gpu-<i>`
of our driver on a fake node of 64 L4 GPUs for ours (a whole-GPU prepare), both in the pool of one node.

Each round, for each plugin, from a fresh process and empty directories:
  start -> registered    exec until its registration socket answers GetInfo (and -> its pool is published)
  RSS at rest            /proc/<pid>/status VmRSS two seconds after the pool is published
  one at a time          prepare then unprepare of N claims: p50/p99 of each, claims/s = N / time in the calls,
                         the plugin's CPU per claim (utime + stime from /proc/<pid>/stat, settled, / N), the API
                         server's CPU per claim, and the API requests per claim (the server's /debug/requests)
  8 and 64 concurrent    rounds of 8 (64) claims on distinct devices prepared at once, then unprepared at once:
                         claims/s = claims / wall time of the round; CPU per claim as above
Then, once per plugin (alternating too): `--cycles` prepare/unprepare cycles (64 claims at a time, each claim prepared
and unprepared again and again) and the RSS before and after.

    .venv/bin/python -m bench.peer_bench                    # 4 rounds, 200 claims one at a time, 10,000 cycles
    BENCH_SHORT=1 .venv/bin/python -m bench.peer_bench      # 2 rounds, 20 claims, 256 cycles
    .venv/bin/python -m bench.peer_bench --cycles 2000 --rounds 2 --json /tmp/peer.json
    BENCH_PLUGIN_PYTHONPATH=/other/checkout .venv/bin/python -m bench.peer_bench   # that tree's plugin as "ours"

Both plugins' CDI dirs lie on a tmpfs, as /var/run/cdi does on a node, their plugin dirs under BENCH_WORK_DIR
(default /tmp; the output names each filesystem). The figures that hold on a busy machine are CPU per claim and RSS
(on the VM's journal-less ext4 the CPU moves with its inode allocator: docs/benchmarks.md "Where the benches' files
lie"); latencies and rates move with the load, which is printed (os.getloadavg) before and after.
docs/benchmarks.md "Beside the Go example driver" says what each plugin does per prepare, so that the comparison
reads fairly.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import SHORT, percentile
from dra_sandbox.upstream.build import EXAMPLE_DRIVER_VERSION, UpstreamError, UpstreamUnavailable, build_example_driver

OURS = "ours"
EXAMPLE = "example"
CONCURRENCY = (8, 64)  # and 1: the one-at-a-time run


# --- pure: /proc, aggregation, the table ----------------------------------------------------------------------


def requests_per_claim(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]],
                       claims: int) -> dict[str, float]:
    """The API requests a plugin made per claim between two /debug/requests tallies: "verb resource" -> count / claims
    (codes summed)."""

    def totals(tally: Sequence[Mapping[str, Any]]) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in tally:
            key = f"{row['verb']} {row['resource']}"
            out[key] = out.get(key, 0) + int(row["count"])
        return out

    start, end = totals(before), totals(after)
    return {key: round((end[key] - start.get(key, 0)) / claims, 2)
            for key in sorted(end) if end[key] - start.get(key, 0) > 0}


@dataclass(frozen=True)
class Figures:
    """One plugin's figures over every round: latencies pooled, per-round values listed."""

    prepare_s: tuple[float, ...] = ()  # one at a time, every round
    unprepare_s: tuple[float, ...] = ()
    rates: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # "prepare 8" -> claims/s per round
    cpu_ms_per_claim: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # "1", "8", "64" -> per round
    server_cpu_ms_per_claim: tuple[float, ...] = ()
    api_requests_per_claim: Mapping[str, float] = field(default_factory=dict)
    registered_s: tuple[float, ...] = ()
    published_s: tuple[float, ...] = ()
    rss_at_rest_mib: tuple[float, ...] = ()
    rss_before_cycles_mib: float = float("nan")
    rss_after_cycles_mib: float = float("nan")
    cycles: int = 0


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ms(seconds: Sequence[float], pct: float) -> float:
    return percentile(seconds, pct) * 1000 if seconds else float("nan")


@dataclass(frozen=True)
class Row:
    figure: str
    ours: float
    example: float
    unit: str
    lower_is_better: bool

    @property
    def ratio(self) -> float:
        """ours / example (NaN when the example's figure is 0 or missing)."""
        if not self.example or self.example != self.example:
            return float("nan")
        return self.ours / self.example

    @property
    def ours_better_or_equal(self) -> bool:
        return self.ours <= self.example if self.lower_is_better else self.ours >= self.example


def table_rows(ours: Figures, example: Figures) -> list[Row]:
    """The side-by-side figures: medians over rounds, latencies over every call of every round."""
    rows: list[Row] = []

    def add(figure: str, get: Any, unit: str, lower: bool = True) -> None:
        rows.append(Row(figure, round(float(get(ours)), 3), round(float(get(example)), 3), unit, lower))

    add("prepare p50, 1 at a time", lambda f: ms(f.prepare_s, 50), "ms")
    add("prepare p99, 1 at a time", lambda f: ms(f.prepare_s, 99), "ms")
    add("unprepare p50, 1 at a time", lambda f: ms(f.unprepare_s, 50), "ms")
    add("unprepare p99, 1 at a time", lambda f: ms(f.unprepare_s, 99), "ms")
    for op in ("prepare", "unprepare"):
        for conc in (1, *CONCURRENCY):
            add(f"{op} claims/s, {conc} concurrent", lambda f, k=f"{op} {conc}": median(f.rates.get(k, ())),
                "claims/s", lower=False)
    for conc in (1, *CONCURRENCY):
        add(f"plugin CPU per claim, {conc} concurrent", lambda f, k=str(conc): median(f.cpu_ms_per_claim.get(k, ())),
            "ms")
    add("API server CPU per claim, 1 at a time", lambda f: median(f.server_cpu_ms_per_claim), "ms")
    add("API requests per claim", lambda f: sum(f.api_requests_per_claim.values()), "requests")
    add("RSS at rest", lambda f: median(f.rss_at_rest_mib), "MiB")
    add("RSS before the cycles", lambda f: f.rss_before_cycles_mib, "MiB")
    add("RSS after the cycles", lambda f: f.rss_after_cycles_mib, "MiB")
    add("start -> registered (GetInfo answers)", lambda f: median(f.registered_s), "s")
    add("start -> pool published", lambda f: median(f.published_s), "s")
    return rows


def _cell(value: float) -> str:
    if value != value:  # NaN
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}" if abs(value) < 1 else f"{value:.1f}"


def format_table(rows: Sequence[Row]) -> str:
    """The side-by-side table as plain text (the bench's own output)."""
    header = f"{'figure':<40} {'ours':>10} {'example':>10} {'ours/ex':>8}  unit"
    lines = [header, "-" * len(header)]
    for r in rows:
        ratio = "-" if r.ratio != r.ratio else f"{r.ratio:.2f}"
        lines.append(f"{r.figure:<40} {_cell(r.ours):>10} {_cell(r.example):>10} {ratio:>8}  {r.unit}")
    return "\n".join(lines)


def markdown_table(rows: Sequence[Row], example_label: str) -> str:
    """The same table in Markdown, as docs/benchmarks.md and the README hold it."""
    lines = [f"| figure | ours | {example_label} | ours / example |", "|---|---|---|---|"]
    for r in rows:
        ratio = "-" if r.ratio != r.ratio else f"{r.ratio:.2f}"
        lines.append(f"| {r.figure} ({r.unit}) | {_cell(r.ours)} | {_cell(r.example)} | {ratio} |")
    return "\n".join(lines)


# The goals for this comparison: our p50 and claims/s at least the example driver's; CPU reported as a ratio.
GOAL_FIGURES = (
    "prepare p50, 1 at a time",
    "unprepare p50, 1 at a time",
    "prepare claims/s, 1 concurrent",
    "prepare claims/s, 8 concurrent",
    "prepare claims/s, 64 concurrent",
    "unprepare claims/s, 1 concurrent",
    "unprepare claims/s, 8 concurrent",
    "unprepare claims/s, 64 concurrent",
)


def goal_lines(rows: Sequence[Row]) -> list[str]:
    by_figure = {r.figure: r for r in rows}
    lines = []
    for figure in GOAL_FIGURES:
        r = by_figure.get(figure)
        if r is None or r.ours != r.ours or r.example != r.example:
            continue
        lines.append(f"{figure}: ours {_cell(r.ours)} vs {_cell(r.example)} {r.unit}: "
                     f"{'met' if r.ours_better_or_equal else 'NOT met'}")
    for r in rows:
        if r.figure.startswith("plugin CPU per claim"):
            lines.append(f"{r.figure}: ours / example = {'-' if r.ratio != r.ratio else f'{r.ratio:.2f}'}")
    return lines


def figures_of(rounds: Sequence[Mapping[str, Any]], soak: Mapping[str, Any]) -> Figures:
    def listed(key: str) -> tuple[float, ...]:
        return tuple(float(r[key]) for r in rounds if key in r)

    merged: dict[str, float] = {}
    for r in rounds:
        for key, value in r.get("api_requests_per_claim", {}).items():
            merged[key] = merged.get(key, 0.0) + value / len(rounds)
    return Figures(
        prepare_s=tuple(s for r in rounds for s in r["prepare_s"]),
        unprepare_s=tuple(s for r in rounds for s in r["unprepare_s"]),
        rates={f"{op} {c}": listed(f"rate_{op}_{c}") for op in ("prepare", "unprepare") for c in (1, *CONCURRENCY)},
        cpu_ms_per_claim={str(c): listed(f"cpu_ms_per_claim_{c}") for c in (1, *CONCURRENCY)},
        server_cpu_ms_per_claim=listed("server_cpu_ms_per_claim"),
        api_requests_per_claim={k: round(v, 2) for k, v in merged.items()},
        registered_s=listed("registered_s"),
        published_s=listed("published_s"),
        rss_at_rest_mib=listed("rss_at_rest_mib"),
        rss_before_cycles_mib=float(soak.get("rss_before_cycles_mib", float("nan"))),
        rss_after_cycles_mib=float(soak.get("rss_after_cycles_mib", float("nan"))),
        cycles=int(soak.get("cycles", 0)),
    )


@dataclass(frozen=True)
class Settings:
    rounds: int
    claims: int  # one at a time, per round
    concurrent_rounds: int  # per concurrency, per round
    cycles: int
    example_qps: int


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2 if SHORT else 4, help="rounds, alternating which goes first")
    parser.add_argument("--claims", type=int, default=20 if SHORT else 200, help="claims one at a time, per round")
    parser.add_argument("--concurrent-rounds", type=int, default=2 if SHORT else 5,
                        help="batches of 8 (64) concurrent claims per round")
    parser.add_argument("--cycles", type=int, default=256 if SHORT else 10_000,
                        help="prepare/unprepare cycles before the second RSS reading (64 at a time)")
    parser.add_argument("--example-qps", type=int, default=1000,
                        help="the example driver's --kube-api-qps and --kube-api-burst; 0: its defaults (5, 10)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args(argv)
    for name in ("rounds", "claims", "concurrent_rounds", "cycles"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        built = build_example_driver(say)
    except UpstreamUnavailable as exc:
        say(f"bench-peer: SKIPPED: the example driver cannot be built on this machine: {exc}")
        return 0
    except UpstreamError as exc:
        print(f"bench-peer: building the example driver failed: {exc}", file=sys.stderr)
        return 1
    binary = built.binaries["dra-example-kubeletplugin"]
    say(f"bench-peer: example driver {EXAMPLE_DRIVER_VERSION} {'cached' if built.cached else 'built'} "
        f"(fresh build took {built.seconds:.0f} s): {binary}")
    settings = Settings(args.rounds, args.claims, args.concurrent_rounds, args.cycles, args.example_qps)
    # Imported here: the measuring half needs the product's plugin and the sandbox, which a machine that cannot build
    # the peer (and the tests of the pure half above) never loads.
    from bench.peer_run import run

    results = run(binary, settings, say)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    say(f"== ours beside the DRA example driver {EXAMPLE_DRIVER_VERSION} (same API server, probe, claims, machine; "
        f"{settings.rounds} rounds alternating, {settings.claims} claims one at a time per round, "
        f"{settings.concurrent_rounds} batches per concurrency, {results['cycles'][OURS]} / "
        f"{results['cycles'][EXAMPLE]} cycles; {results['seconds']} s)")
    say(f"load average before {results['loadavg_before']}, after {results['loadavg_after']} "
        f"({os.cpu_count()} CPUs); plugin dirs on {results['filesystems']['plugin_dir']}, CDI specs on "
        f"{results['filesystems']['cdi_root']}")
    say(results["table"])
    say("API requests per claim (prepare + unprepare): " + json.dumps(results["api_requests_per_claim"]))
    say("== goals (issue 37: our p50 and claims/s at least the example driver's; CPU per claim as the ratio)")
    for line in results["goals"]:
        say(line)
    say("== markdown")
    say(results["markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
