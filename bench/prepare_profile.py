"""Where a prepare's time goes: the plugin's engine in this process (so cProfile and per-stage clocks can see it),
against the sandbox API server in its own process. Bench-only; the product has no profiling hook.

Per round, `--concurrency` claims (distinct L4 GPUs) are prepared at once and then unprepared at once, either
straight through the engine (`engine.prepare([...])`: its claim pool runs them side by side) or, with `--grpc`,
over the plugin's real socket from `bench.prepare_load` client processes. Reported:

- per stage (wall time, waits included): the claim GET, checkpoint update/load, CDI write/remove, the node's
  operation lock, the GPU locks, and the whole operation;
- fsyncs per claim (os.fsync counted), API requests by thread (the engine's GETs vs the usage sampler's);
- a cProfile of every claim operation (each in its own thread: one profiler per call, merged), or with
  `--profile threads` of every thread the plugin starts, by own time; the profilers' clock is the thread's CPU
  time, so waits (locks, the GIL, the disk, the network) count for nothing and the figures are CPU;
- the plugin's CPU time per claim (this process's, profilers included: `--profile none` leaves them out).

    .venv/bin/python -m bench.prepare_profile --concurrency 64 --rounds 3 [--grpc] [--pool-size 64] [--top 25]

It profiles the tree it is run from (`python -m` puts the current directory first on sys.path, before PYTHONPATH).
`--pool-size N` gives the plugin's API client an urllib3 pool of N connections (the product's default
is max(80, cpu_count * 5)) to see what the pool size does to concurrent claim GETs.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import gc
import io
import os
import pstats
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.common import many_gpus_node, percentile, runtime_dir, work_dir
from bench.prepare_bench import (
    DRIVER,
    NODE,
    LoadClients,
    _claim,
    api_server_process,
    bench_plugin,
    plugin_process,
    proc_cpu_s,
)
from dra_driver._gen import dra_v1_pb2 as pb
from dra_driver.inventory.catalog import MigOffering
from dra_driver.k8s.client import KubeRest
from dra_driver.k8s.kubeconfig import load_connection
from dra_driver.k8s.transport import HttpTransport
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.observability.logging import configure_logging
from dra_driver.plugin.app import KubeletPlugin
from dra_driver.plugin.effects.cdi_spec import CdiSpec
from dra_sandbox.objects import create_allocated_claim
from dra_sandbox.polling import wait_for


class Stages:
    """Wall-clock samples per stage, from wrappers installed on live objects (instance attributes)."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = collections.defaultdict(list)
        self._lock = threading.Lock()

    def add(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.samples[stage].append(seconds)

    def wrap(self, obj: Any, method: str, stage: str) -> None:
        original = getattr(obj, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.add(stage, time.perf_counter() - start)

        setattr(obj, method, timed)

    def wrap_context(self, obj: Any, method: str, stage: str) -> None:
        """A context manager method: the time until it is entered (the wait for a lock)."""
        original = getattr(obj, method)

        @contextlib.contextmanager
        def timed(*args: Any, **kwargs: Any) -> Iterator[Any]:
            start = time.perf_counter()
            with original(*args, **kwargs) as value:
                self.add(stage, time.perf_counter() - start)
                yield value

        setattr(obj, method, timed)

    def report(self) -> str:
        lines = [f"{'stage':<28} {'n':>6} {'p50 ms':>9} {'p99 ms':>9} {'sum s':>8}"]
        for stage, values in sorted(self.samples.items()):
            lines.append(
                f"{stage:<28} {len(values):>6} {percentile(values, 50) * 1e3:>9.3f} "
                f"{percentile(values, 99) * 1e3:>9.3f} {sum(values):>8.3f}"
            )
        return "\n".join(lines)


class _Snapshot:
    """A pstats-loadable copy of a profile's counts at one moment (`pstats.Stats` loads anything with
    `create_stats` and `stats`)."""

    def __init__(self, stats: dict[Any, Any]) -> None:
        self.stats = stats

    def create_stats(self) -> None:
        pass


class ThreadProfiles:
    """One cProfile per profiled call (cProfile sees only the thread it was enabled in), merged at the end.

    `mark()` (or SIGUSR1 after `mark_on_signal`) records every profile's counts so far; `merged()` then reports only
    what came after: the plugin's start-up (its imports, its dataclasses' generated methods, NVML's fake) is left
    out of the per-claim figures, where 200 claims spread it as ≈ 0.5 ms "per claim" of importlib, typing and
    compile frames that no claim runs."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self._lock = threading.Lock()
        self._baseline: list[_Snapshot] = []

    def wrap(self, obj: Any, method: str) -> None:
        original = getattr(obj, method)

        def profiled(*args: Any, **kwargs: Any) -> Any:
            profile = cProfile.Profile(time.thread_time)
            profile.enable()
            try:
                return original(*args, **kwargs)
            finally:
                profile.disable()
                with self._lock:
                    self.profiles.append(profile)

        setattr(obj, method, profiled)

    def every_new_thread(self) -> None:
        """Profile every thread started from now on (the gRPC server's, the claim pool's, the samplers'): the first
        profiling event of a new thread swaps this hook for a cProfile of its own."""

        def start(frame: Any, event: str, arg: Any) -> None:
            profile = cProfile.Profile(time.thread_time)
            with self._lock:
                self.profiles.append(profile)
            profile.enable()

        threading.setprofile(start)

    def mark(self) -> None:
        """Count from here on: snapshot every profile (enabled ones too: `snapshot_stats` only reads their
        entries; the collector is held off so no finaliser runs Python in the middle of the copy)."""
        own = sys.getprofile()  # this thread's cProfile, if it has one: off while it copies (not counted after)
        if isinstance(own, cProfile.Profile):
            own.disable()
        gc.disable()
        try:
            with self._lock:
                snapshots = []
                for profile in self.profiles:
                    profile.snapshot_stats()
                    snapshots.append(_Snapshot(dict(profile.stats)))
                self._baseline = snapshots
        finally:
            gc.enable()
            if isinstance(own, cProfile.Profile):
                own.enable()

    def mark_on_signal(self, marked: Path, signum: int = signal.SIGUSR1) -> None:
        """`mark()` when the process gets `signum`, then create `marked` (what the bench waits for)."""

        def on_signal(_signum: int, _frame: Any) -> None:
            self.mark()
            marked.touch()

        signal.signal(signum, on_signal)

    def merged(self, out: io.StringIO) -> pstats.Stats:
        stats = pstats.Stats(self.profiles[0], stream=out)
        for profile in self.profiles[1:]:
            stats.add(profile)
        if self._baseline:
            before = pstats.Stats(self._baseline[0], stream=out)  # type: ignore[arg-type]
            for snapshot in self._baseline[1:]:
                before.add(snapshot)  # type: ignore[arg-type]
            _subtract(stats, before)
        return stats

    def report(self, top: int, sort: str, claims: int) -> str:
        if not self.profiles:
            return "(nothing profiled)"
        out = io.StringIO()
        stats = self.merged(out)
        out.write(by_package(stats, claims))
        stats.strip_dirs().sort_stats(sort).print_stats(top)
        return out.getvalue()


def _subtract(stats: pstats.Stats, before: pstats.Stats) -> None:
    """`stats` less `before` (counts and times per function and per caller); functions with no calls left go."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    earlier: dict[Any, Any] = before.stats  # type: ignore[attr-defined]
    for func, (cc0, nc0, tt0, ct0, callers0) in earlier.items():
        if func not in raw:
            continue
        cc, nc, tt, ct, callers = raw[func]
        left = {
            caller: tuple(a - b for a, b in zip(counts, callers0.get(caller, (0,) * len(counts)), strict=True))
            for caller, counts in callers.items()
        }
        left = {caller: counts for caller, counts in left.items() if counts[1] > 0}
        if nc - nc0 <= 0:
            del raw[func]
        else:
            raw[func] = (cc - cc0, nc - nc0, tt - tt0, ct - ct0, left)
    stats.total_tt = sum(tt for _cc, _nc, tt, _ct, _callers in raw.values())  # type: ignore[attr-defined]


# Idle waits, not work: the thread pools' workers blocked for their next task. Their "CPU" on the profiler's clock is
# an artifact (negative over a whole run, positive after `mark()`), so the package table leaves them out.
_IDLE_WAITS = frozenset({"<method 'get' of '_queue.SimpleQueue' objects>"})


def by_package(stats: pstats.Stats, claims: int) -> str:
    """CPU per package and claim (profiler overhead included: compare packages, not absolute figures)."""
    totals: collections.Counter[str] = collections.Counter()
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (filename, _line, name), (_cc, _nc, tottime, _ct, _callers) in raw.items():
        if name in _IDLE_WAITS or filename.endswith(("cProfile.py", "pstats.py")):  # the profiler's own `mark()`
            continue
        if filename == "~":
            package = "builtins: " + ("os/io" if "posix" in name or "io." in name or "_io" in name else "other")
        elif "site-packages/" in filename:
            package = filename.split("site-packages/", 1)[1].split("/", 1)[0]
        elif "dra_driver/" in filename:
            package = "dra_driver/" + filename.split("dra_driver/", 1)[1].split("/", 1)[0]
        elif "/bench/" in filename:
            package = "bench (clocks, counters)"
        else:
            package = "stdlib: " + Path(filename).stem
        totals[package] += tottime
    lines = [f"CPU per claim (ms) by package, {sum(totals.values()) / claims * 1e3:.2f} in all:"]
    lines += [f"  {package:<40} {t / claims * 1e3:7.3f}" for package, t in totals.most_common(24)]
    return "\n".join(lines) + "\n"


# Where one claim's CPU goes, as disjoint parts of the plugin's work: (label, [(sign, function)]) where a function is
# (the end of its file name, its name) and a part is the sum of those functions' inclusive times, signed. The parts
# of the call path are the servicers' inclusive times less what is listed separately inside them.
_SERVICERS = (
    ("kubeletplugin/services.py", "NodePrepareResources"),
    ("kubeletplugin/services.py", "NodeUnprepareResources"),
)
# Old and new homes of one step are both listed (only one of them runs in a given tree): the claim state machine
# (kubeletplugin/claimstates.py since the engines were merged), the claim spec's removal (cdi/claimspecs.py).
_ENGINE = (
    ("plugin/engine.py", "prepare"),
    ("plugin/engine.py", "unprepare"),
    ("kubeletplugin/claimstates.py", "prepare"),
    ("kubeletplugin/claimstates.py", "unprepare"),
)
_GET = ("kubeletplugin/claims.py", "get_claim")
_CHECKPOINT = ("kubeletplugin/checkpoint.py", "update")
_CDI = (("plugin/cdi.py", "write"), ("plugin/cdi.py", "remove"), ("cdi/claimspecs.py", "remove"))
_METADATA = (("kubeletplugin/metadata.py", "write"), ("kubeletplugin/metadata.py", "remove"))
PARTS: tuple[tuple[str, tuple[tuple[int, tuple[str, str]], ...]], ...] = (
    ("gRPC server around the handlers (polling thread, call set-up, answer)",
     ((1, ("grpc/_server.py", "_unary_response_in_pool")), (1, ("grpc/_server.py", "_serve")),
      *((-1, f) for f in _SERVICERS))),
    ("claim GET on the call path", ((1, _GET),)),
    ("checkpoint records (durable writes)", ((1, _CHECKPOINT),)),
    ("claim CDI spec: build, encode, durable write", ((1, _CDI[0]),)),
    ("claim CDI spec: removal", ((1, _CDI[1]), (1, _CDI[2]))),
    ("rest of the engine (plan, locks, records, answer)",
     (*((1, f) for f in _ENGINE), (-1, _GET), (-1, _CHECKPOINT), *((-1, f) for f in _CDI))),
    ("device metadata (KEP-5304): file + spec written", ((1, _METADATA[0]),)),
    ("device metadata: removal", ((1, _METADATA[1]),)),
    ("servicers, pipeline, other observers (Events, status hand-off, metrics, logs)",
     (*((1, f) for f in _SERVICERS), *((-1, f) for f in _ENGINE), *((-1, f) for f in _METADATA))),
    ("status.devices thread (PATCH after a prepare; after an unprepare a PATCH, and a GET where needed)",
     ((1, ("plugin/devicestatus.py", "_run")),)),
    ("usage sampler passes woken by claims", ((1, ("plugin/utilisation.py", "_run")),)),
)  # fmt: skip


def where_it_goes(stats: pstats.Stats, claims: int) -> str:
    """`PARTS` per claim (µs on the profiler's clock, and % of their sum): the table of docs/benchmarks.md."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    inclusive: collections.Counter[tuple[str, str]] = collections.Counter()
    for (filename, _line, name), (_cc, _nc, _tottime, cumtime, _callers) in raw.items():
        for _label, terms in PARTS:
            for _sign, (suffix, function) in terms:
                if name == function and filename.endswith(suffix):
                    inclusive[(suffix, function)] = cumtime
    parts = [(label, sum(sign * inclusive[f] for sign, f in terms) / claims * 1e6) for label, terms in PARTS]
    total = sum(value for _, value in parts)
    lines = [f"where one claim's CPU goes (µs per claim on the profiler's clock, {total:.0f} in all):"]
    lines += [f"  {label:<100} {value:8.0f} {value / total * 100:5.1f} %" for label, value in parts]
    return "\n".join(lines) + "\n"


def rest_with_pool(kubeconfig: Path, pool_size: int | None) -> KubeRest:
    return KubeRest(HttpTransport.for_connection(load_connection(str(kubeconfig)), maxsize=pool_size))


def instrument(
    plugin: KubeletPlugin, stages: Stages, profiles: ThreadProfiles, profile: str
) -> Callable[[], dict[str, int]]:
    """Stage clocks and profilers on the plugin's engine; returns a reader of the request and fsync counts."""
    engine = plugin.engine
    stages.wrap(engine._claims, "get_claim", "claim GET (engine)")
    cdi = plugin.engine.parts.effects.spec
    assert isinstance(cdi, CdiSpec)
    stages.wrap(cdi.writer, "write", "cdi.write")
    stages.wrap(cdi.writer, "remove", "cdi.remove")
    stages.wrap(engine._checkpoint, "update", "checkpoint.update")
    stages.wrap(engine._checkpoint, "load", "checkpoint.load")
    stages.wrap(engine, "record_prepared", "record_prepared (metrics)")
    stages.wrap(engine, "prepare_claim", "prepare_claim (inside locks)")
    stages.wrap(engine, "unprepare_claim", "unprepare_claim")
    stages.wrap(engine, "_prepare_one", "prepare (whole, per claim)")
    stages.wrap(engine, "_unprepare_one", "unprepare (whole, per claim)")
    stages.wrap_context(engine._operations, "shared", "operation lock wait")
    stages.wrap_context(engine._locks, "hold", "GPU locks wait")
    if profile == "claims":
        profiles.wrap(engine, "_prepare_one")
        profiles.wrap(engine, "_unprepare_one")

    counts: collections.Counter[str] = collections.Counter()
    request = plugin.rest.request

    def counted(method: str, path: str, **kwargs: Any) -> Any:
        thread = threading.current_thread().name.rstrip("0123456789_-")
        counts[f"{method} from {thread}"] += 1
        return request(method, path, **kwargs)

    plugin.rest.request = counted  # type: ignore[method-assign]
    fsync = os.fsync

    def counted_fsync(fd: Any) -> None:
        counts["fsync"] += 1
        fsync(fd)

    os.fsync = counted_fsync
    return lambda: dict(counts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--grpc", action="store_true", help="call over the socket from client processes")
    parser.add_argument("--pool-size", type=int, default=None, help="urllib3 pool of the plugin's API client")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--profile",
        choices=("claims", "threads", "none"),
        default="claims",
        help="cProfile each claim operation, every thread of the plugin (gRPC server, pools, samplers: what "
        "the claim operations do not show), or nothing (stage clocks without the profiler's overhead)",
    )
    parser.add_argument("--sort", default="tottime", help="pstats order: tottime, cumulative, ...")
    parser.add_argument("--stats-out", type=Path, default=None, help="with --process: keep the pstats file there")
    parser.add_argument(
        "--process",
        action="store_true",
        help="profile the real plugin process instead (bench.profiled_plugin: every thread, CPU clock); no stage "
        "clocks; one claim at a time from this process, more from client processes",
    )
    args = parser.parse_args()
    if args.process:
        return profile_process(args.concurrency, args.rounds, args.top, args.sort, args.stats_out)
    configure_logging("info", "json", stream=open(os.devnull, "w"))  # noqa: SIM115 - for the process's life
    tmp = work_dir("drabprof-")
    stages, profiles = Stages(), ThreadProfiles()
    try:
        with api_server_process(tmp) as rest:
            kubeconfig = tmp / "kubeconfig"
            gpus = max(16, args.concurrency)
            plugin_rest = rest_with_pool(kubeconfig, args.pool_size)
            if args.profile == "threads":
                profiles.every_new_thread()
            plugin = bench_plugin(tmp, many_gpus_node(tmp / "node.yaml", gpus), plugin_rest, MigOffering.STATIC)
            counts = instrument(plugin, stages, profiles, args.profile)
            load = (
                LoadClients(plugin.server.dra_socket, kubeconfig, args.concurrency, -(-args.concurrency // 16))
                if args.grpc
                else None
            )
            walls: dict[str, float] = collections.defaultdict(float)
            cpu: dict[str, float] = collections.defaultdict(float)
            claims = 0
            try:
                for r in range(args.rounds):
                    refs = []
                    for i in range(args.concurrency):
                        stored = create_allocated_claim(
                            rest,
                            namespace="default",
                            name=f"p{r}-{i}",
                            driver=DRIVER,
                            pool=NODE,
                            devices=[f"gpu-{i}"],
                            reserved_for=f"pod-{r}-{i}",
                        )
                        refs.append(ClaimRef("default", stored["metadata"]["name"], stored["metadata"]["uid"]))
                    for op in ("prepare", "unprepare"):
                        start, cpu_start = time.perf_counter(), time.process_time()
                        if load is not None:
                            load.claims(op, refs)
                        elif op == "prepare":
                            errors = [r.error for r in plugin.engine.prepare(refs).values() if r.error]
                            assert not errors, errors[0]
                        else:
                            errors = [e for e in plugin.engine.unprepare(refs).values() if e]
                            assert not errors, errors[0]
                        walls[op] += time.perf_counter() - start
                        cpu[op] += time.process_time() - cpu_start
                    claims += len(refs)
            finally:
                if load is not None:
                    load.close()
                plugin.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"== {args.rounds} rounds of {args.concurrency} claims at once ({'gRPC' if args.grpc else 'engine'})")
    for op, wall in walls.items():
        # CPU of this process (the plugin; the API server and the callers run elsewhere), profilers included.
        print(f"{op}: {claims / wall:.1f} claims/s, plugin CPU {cpu[op] / claims * 1e3:.2f} ms per claim")
    print(stages.report())
    print("counts per claim:", {k: round(v / claims, 2) for k, v in sorted(counts().items())})
    print(profiles.report(args.top, args.sort, claims))
    return 0


WARM_UP_CLAIMS = 3  # prepared and unprepared before the profile's mark: the first claims' lazy imports and caches


def profile_process(concurrency: int, rounds: int, top: int, sort: str, stats_out: Path | None = None) -> int:
    tmp = work_dir("drabprof-")
    out = tmp / "plugin.prof"
    marked = tmp / "plugin.prof.marked"
    claims = 0
    try:
        with api_server_process(tmp) as rest, runtime_dir("drabprof-run-") as run_dir:
            kubeconfig = tmp / "kubeconfig"
            nvml = many_gpus_node(tmp / "node.yaml", max(16, concurrency))
            argv = ("-m", "bench.profiled_plugin")
            with plugin_process(
                tmp / "plugin", kubeconfig, nvml, "static", NODE, rest, argv, {"BENCH_PROFILE_OUT": str(out)},
                cdi_root=run_dir / "cdi",
            ) as plugin:
                load = LoadClients(plugin.socket, kubeconfig, concurrency, -(-concurrency // 16))
                try:
                    warm = [
                        pb.Claim(namespace="default", name=c["metadata"]["name"], uid=c["metadata"]["uid"])
                        for c in (_claim(rest, f"warm-{i}", f"gpu-{i}") for i in range(WARM_UP_CLAIMS))
                    ]
                    load.claims("prepare", warm)
                    load.claims("unprepare", warm)
                    # Start-up and warm-up out of the profile: the plugin marks its profiles on SIGUSR1.
                    os.kill(plugin.pid, signal.SIGUSR1)
                    wait_for(marked.exists, 30.0, "the profiled plugin to mark its profiles", interval=0.01)
                    cpu = proc_cpu_s(plugin.pid)
                    for r in range(rounds):
                        refs = [
                            pb.Claim(namespace="default", name=c["metadata"]["name"], uid=c["metadata"]["uid"])
                            for c in (_claim(rest, f"p{r}-{i}", f"gpu-{i}") for i in range(concurrency))
                        ]
                        load.claims("prepare", refs)
                        load.claims("unprepare", refs)
                        claims += len(refs)
                    cpu = proc_cpu_s(plugin.pid) - cpu
                finally:
                    load.close()
        if stats_out is not None:
            shutil.copyfile(out, stats_out)
        report = io.StringIO()
        stats = pstats.Stats(str(out), stream=report)
        report.write(where_it_goes(stats, claims))
        report.write(by_package(stats, claims))
        stats.strip_dirs().sort_stats(sort).print_stats(top)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"== plugin process, {rounds} rounds of {concurrency} claims at once (prepare + unprepare)")
    print(f"plugin CPU per claim (prepare + unprepare, profiler included): {cpu / claims * 1e3:.2f} ms")
    print(report.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
