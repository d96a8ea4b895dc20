"""ResourceSlice publishing cost: plugin start -> fully published pool, steady-state re-discovery, RSS.

The plugin runs as its own process (`dra-driver kubelet-plugin`, fake dgx-h100, dynamic MIG: 208 devices in
5 slices) against the sandbox API server; the API server's request log counts every request it made.

    .venv/bin/python -m bench.publish_bench
    BENCH_SHORT=1 .venv/bin/python -m bench.publish_bench
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import SHORT, emit
from dra_driver.observability.logging import configure_logging
from dra_sandbox.cluster import ClusterConfig, NodeSpec, SandboxCluster

NODE = "bench-h100"


def _proc_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def _requests(cluster: SandboxCluster) -> dict[str, int]:
    counts: dict[str, int] = {}
    for (verb, resource), n in cluster.server.request_log.summary().items():
        counts[f"{verb} {resource}"] = counts.get(f"{verb} {resource}", 0) + n
    return dict(sorted(counts.items()))


def _slice_writes(cluster: SandboxCluster) -> int:
    log = cluster.server.request_log
    return sum(log.count(verb=v, resource="resourceslices") for v in ("create", "update", "patch", "delete"))


def run() -> dict[str, Any]:
    configure_logging("warning", "text")
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="drapub-"))
    out: dict[str, Any] = {}
    try:
        config = ClusterConfig(work_dir=work, nodes=[NodeSpec(NODE, "fake:dgx-h100")], runtime="cdi-check")
        with SandboxCluster(config) as cluster:
            # Only the plugin talks to the API during the measurement.
            assert cluster.scheduler is not None
            cluster.scheduler.stop()
            for kubelet in cluster.kubelets.values():
                kubelet.stop()
            plugin = cluster.plugins[NODE]
            plugin.stop()
            for s in cluster.items("/apis/resource.k8s.io/v1/resourceslices"):
                cluster.api.request("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{s['metadata']['name']}")
            cluster.server.request_log.reset()
            start = time.perf_counter()
            plugin.start()
            polls = 0
            while True:  # our own polling is counted and taken out of the plugin's figures below
                polls += 1
                slices = cluster.items("/apis/resource.k8s.io/v1/resourceslices")
                if slices and len(slices) == slices[0]["spec"]["pool"]["resourceSliceCount"]:
                    break
                if time.perf_counter() - start > 60:
                    raise TimeoutError("the pool was not published within 60 s")
                time.sleep(0.02)
            out["start_to_published_s"] = round(time.perf_counter() - start, 3)
            out["slices"] = len(slices)
            out["devices"] = sum(len(s["spec"].get("devices", [])) for s in slices)
            requests = _requests(cluster)
            requests["list resourceslices"] -= polls
            out["plugin_requests_start_to_published"] = {k: v for k, v in requests.items() if v}

            idle = 4.0 if SHORT else 20.0
            cluster.server.request_log.reset()
            time.sleep(idle)  # measuring an interval, not synchronising: re-discovery runs every 2 s here
            out["steady_state"] = {
                "seconds": idle,
                "resourceslice_writes": _slice_writes(cluster),
                "requests": _requests(cluster),
            }
            assert plugin.process is not None
            cluster.server.request_log.reset()
            plugin.process.send_signal(signal.SIGHUP)
            time.sleep(2.0)  # an observation window, not synchronisation
            out["sighup_rediscovery_unchanged"] = {
                "window_s": 2.0,
                "resourceslice_writes": _slice_writes(cluster),
                "requests": _requests(cluster),
            }
            out["plugin_rss_mib_steady"] = _proc_rss_mib(plugin.process.pid)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


if __name__ == "__main__":
    emit("ResourceSlice publishing (dgx-h100, dynamic MIG, plugin process vs sandbox API server)", run())
