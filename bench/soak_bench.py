"""Soak: many prepare/unprepare cycles over the kubelet plugin's real unix socket, and its memory along the way.

The plugin runs as on a node, in its own process (`dra-driver kubelet-plugin` as `prepare_bench.plugin_process`
starts it: fake dgx-h100, dynamic MIG, product defaults, usage sampling and health monitoring on), so the RSS, open
file descriptors and threads read from /proc/<pid> are the plugin's alone; the sandbox API server runs in its own
(`api_server_process`). Each cycle is a new claim, as on a node: created in the API, prepared, unprepared, deleted;
the claims rotate over a whole GPU, a whole GPU with time-slicing config, a 1g and a 3g MIG device (created and
destroyed each time). Every N/10 cycles: RSS, open file descriptors, threads, and the cycle latencies of that
stretch.

    .venv/bin/python -m bench.soak_bench                    # 10,000 cycles
    BENCH_SHORT=1 .venv/bin/python -m bench.soak_bench      # 100 (BENCH_SIZE=medium: 1,000; SOAK_CYCLES=N: N)
    SOAK_CYCLES=2000 SOAK_TRACEMALLOC=1 .venv/bin/python -m bench.soak_bench   # + where the Python heap grew

With SOAK_TRACEMALLOC=1 (or SOAK_IN_PROCESS=1) the plugin runs in this process instead (`bench_plugin`), its RSS
read after a `gc.collect()`, and with tracemalloc the ten source lines whose live memory grew most between the first
and the last sample are printed: how a growth found here was tracked down. In-process figures include the bench's
own client and interpreter (≈ 30 MiB more than the plugin process).
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import tempfile
import threading
import time
import tracemalloc
import uuid
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from bench.common import emit, rss_mib, sized, summary_ms
from bench.prepare_bench import (
    api_server_process,
    bench_plugin,
    plugin_process,
    proc_rss_mib,
    time_prepare,
    time_unprepare,
)
from dra_driver import defaults
from dra_driver._gen import dra_v1_pb2 as pb
from dra_driver._gen import dra_v1_pb2_grpc as pb_grpc
from dra_driver.inventory.catalog import MigOffering
from dra_driver.k8s.client import KubeRest
from dra_driver.observability.logging import configure_logging
from dra_sandbox.objects import create_allocated_claim

DRIVER = defaults.DRIVER_NAME
NODE = "bench-node"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
TIME_SLICING: list[Any] = [
    {
        "source": "FromClaim",
        "requests": [],
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "gpu.dra.dev/v1beta1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing"},
            },
        },
    }
]
# (device, opaque config): what one cycle's claim holds, in turn.
ROTATION: tuple[tuple[str, list[Any]], ...] = (
    ("gpu-1", []),
    ("gpu-0-mig-1g10gb-19-6", []),
    ("gpu-3", TIME_SLICING),
    ("gpu-2-mig-3g40gb-9-4", []),
)


def cycles() -> int:
    return int(os.environ.get("SOAK_CYCLES") or sized(100, 1_000, 10_000))


def _open_fds(pid: int | None = None) -> int:
    return len(os.listdir(f"/proc/{pid or 'self'}/fd"))


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def _cycle(stub: Any, rest: KubeRest, i: int) -> tuple[float, float]:
    device, config = ROTATION[i % len(ROTATION)]
    name = f"soak-{i}-{uuid.uuid4().hex[:8]}"
    stored = create_allocated_claim(
        rest, namespace="default", name=name, driver=DRIVER, pool=NODE, devices=[device], config=config
    )
    ref = pb.Claim(namespace="default", name=name, uid=stored["metadata"]["uid"])
    prepared = time_prepare(stub, ref)
    unprepared = time_unprepare(stub, ref)
    rest.request("DELETE", f"{CLAIMS}/{name}")
    return prepared, unprepared


def _sample(done: int, start: float, prep: Sequence[float], unprep: Sequence[float], pid: int | None) -> dict[str, Any]:
    """The plugin's figures: its own process's (`pid`), or this process's after a collection when it runs here."""
    if pid is None:
        gc.collect()
    row: dict[str, Any] = {
        "cycles": done,
        "rss_mib": rss_mib() if pid is None else proc_rss_mib(pid),
        "open_fds": _open_fds(pid),
        "threads": threading.active_count() if pid is None else _threads(pid),
        "elapsed_s": round(time.perf_counter() - start, 1),
    }
    if prep:
        row["prepare_p50_ms"] = summary_ms(prep)["p50_ms"]
        row["unprepare_p50_ms"] = summary_ms(unprep)["p50_ms"]
    if tracemalloc.is_tracing():
        row["python_heap_mib"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 2)
    return row


def run() -> dict[str, Any]:
    configure_logging("warning", "text")
    total = cycles()
    step = max(1, total // 10)
    trace = os.environ.get("SOAK_TRACEMALLOC") == "1"
    tmp = Path(tempfile.mkdtemp(dir="/tmp", prefix="drasoak-"))
    curve: list[dict[str, Any]] = []
    # Every latency, in arrays allocated before the first sample: lists of floats would grow this process by
    # ~64 bytes a cycle (the first full run showed exactly that slope) and be read as the plugin's growth.
    all_prep = array("d", bytes(8 * total))
    all_unprep = array("d", bytes(8 * total))
    growth: list[str] = []
    in_process = trace or os.environ.get("SOAK_IN_PROCESS") == "1"
    try:
        with api_server_process(tmp) as rest, contextlib.ExitStack() as stack:
            if in_process:
                plugin = bench_plugin(tmp, "fake:dgx-h100", rest, MigOffering.DYNAMIC)
                stack.callback(plugin.stop)
                socket, pid = plugin.server.dra_socket, None
            else:
                running = stack.enter_context(
                    plugin_process(
                        tmp / "plugin", tmp / "kubeconfig", "fake:dgx-h100", MigOffering.DYNAMIC.value, NODE, rest
                    )
                )
                socket, pid = running.socket, running.pid
            channel = grpc.insecure_channel(f"unix://{socket}")
            stub = pb_grpc.DRAPluginStub(channel)
            try:
                # One round of each kind first: what the first calls load and build once (lazy imports, caches,
                # pooled connections, MIG mode) is not growth.
                for i in range(len(ROTATION)):
                    _cycle(stub, rest, i)
                if trace:
                    tracemalloc.start(10)
                first_snapshot = tracemalloc.take_snapshot() if trace else None
                start = time.perf_counter()
                curve.append(_sample(0, start, [], [], pid))
                since = 0
                for i in range(total):
                    all_prep[i], all_unprep[i] = _cycle(stub, rest, len(ROTATION) + i)
                    if (i + 1) % step == 0 or i + 1 == total:
                        curve.append(_sample(i + 1, start, all_prep[since : i + 1], all_unprep[since : i + 1], pid))
                        since = i + 1
                if first_snapshot is not None:
                    stats = tracemalloc.take_snapshot().compare_to(first_snapshot, "lineno")
                    growth = [str(s) for s in stats[:10]]
                    tracemalloc.stop()
            finally:
                channel.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = curve[0]["rss_mib"]
    out: dict[str, Any] = {
        "cycles": total,
        "plugin": "in this process" if in_process else "its own process (dra-driver kubelet-plugin)",
        "claim_kinds": [device for device, _ in ROTATION],
        "rss_mib_start": base,
        "rss_mib_end": curve[-1]["rss_mib"],
        "rss_growth_mib": round(curve[-1]["rss_mib"] - base, 1),
        # The second half alone: a leak keeps growing; a cache filling up (or the allocator settling) does not.
        "rss_growth_second_half_mib": round(curve[-1]["rss_mib"] - curve[len(curve) // 2]["rss_mib"], 1),
        "open_fds_start_end": [curve[0]["open_fds"], curve[-1]["open_fds"]],
        "threads_start_end": [curve[0]["threads"], curve[-1]["threads"]],
        "prepare": summary_ms(all_prep),
        "unprepare": summary_ms(all_unprep),
        "curve": curve,
    }
    if growth:
        out["tracemalloc_top_growth"] = growth
    return out


def format_curve(result: dict[str, Any]) -> str:
    header = f"{'cycles':>8} {'rss MiB':>8} {'fds':>5} {'threads':>7} {'prep p50 ms':>11} {'unprep p50 ms':>13}"
    lines = [header, "-" * len(header)]
    for row in result["curve"]:
        lines.append(
            f"{row['cycles']:>8} {row['rss_mib']:>8} {row['open_fds']:>5} {row['threads']:>7} "
            f"{row.get('prepare_p50_ms', '-'):>11} {row.get('unprepare_p50_ms', '-'):>13}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    figures = run()
    emit("soak: prepare/unprepare cycles, plugin RSS curve (fake dgx-h100, dynamic MIG)", figures)
    print(format_curve(figures))
