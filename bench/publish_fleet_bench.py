"""The ResourceSlice publisher at fleet scale: API requests of N nodes, counted by the API server.

N real `SlicePublisher`s (each with its own `KubeRest`, its loop and watch threads; desired slices from the
plugin's own `build_slices`, dynamic MIG, presets cycling dgx-h100, dgx-a100, a30x4, l4x2, hgx-h200) and, beside
each, the plugin's `HealthKeeper` (which sends no request since admin taints became DeviceTaintRules), all in this
one process, against the sandbox API server in its own process. Releases before sent a GET of the plugin's Node
every `--health-check-interval` (10 s) for the admin annotation; phase `per_hour_before` measures that poll
(`LegacyNodePoll`, the old keeper's request) beside the same fleet, for the before/after figure. The
server counts every request (`/debug/requests`: verb, resource, code); nothing here polls the API, so every counted
request is the fleet's. The plugin's other loops make no API call while no claim is prepared (stale-claim sweep,
usage sampler, claim Events) or none at all (re-discovery unless the hardware changes, the publisher lease: a
file lock).

Phases:
  by_preset           one node of each preset alone: requests from start until published and watching, then the
                      same publisher restarted over its slices (a plugin restart);
  first_minute        FIRST_WAVE nodes start at once (real periods); every request in their first minute. The
                      sandbox API server is one Python thread (~35 ms per created 200-device slice): a 1000-node
                      fleet starting at once would wait minutes for it and time out, which the real API server
                      would not, so the fleet's first minute is this wave's per-node figure times N (requests per
                      node do not depend on N as long as none fails: `failed` says);
  per_hour            PERIODIC_NODES nodes with every publisher period divided by PERIOD_SCALE (so that each one
                      passes several times in the window) and the health keepers at their real period; per hour =
                      count * 3600 / window, divided by PERIOD_SCALE for the publisher's requests; times N / nodes;
  per_hour_before     the same nodes with the earlier releases' Node poll added (GET resourceVersion=0 every 10 s):
                      what the fleet sent per hour before; `per_hour` is after;
  fleet_start_in_waves, fleet_steady_state
                      all N nodes at real periods, started FIRST_WAVE at a time (each wave once the previous one
                      has published), then a window: what the server's CPU and memory and this process hold.

    .venv/bin/python -m bench.publish_fleet_bench                 # 1000 nodes
    BENCH_SHORT=1 .venv/bin/python -m bench.publish_fleet_bench   # 20 nodes, short windows
    FLEET_NODES=200 .venv/bin/python -m bench.publish_fleet_bench # any N
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import SHORT, emit, rss_mib
from bench.fleet_bench import LAST_PRESET, PRESETS
from bench.prepare_bench import api_server_subprocess, proc_cpu_s
from dra_driver import defaults
from dra_driver.inventory.catalog import AllocatableDevice, MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.model import NodeInventory
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest, connect
from dra_driver.kubeletplugin.nodeevents import NodeEvents
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.factory import open_backend
from dra_driver.observability.logging import configure_logging
from dra_driver.observability.metrics import PluginMetrics
from dra_driver.plugin.health.healing import HealthLedger
from dra_driver.plugin.health.keeper import HealthKeeper, KeeperParts
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_driver.slices.publisher import SlicePublisher

DRIVER = defaults.DRIVER_NAME
FLEET_PRESETS = (*PRESETS, LAST_PRESET)
WRITE_VERBS = ("create", "update", "patch", "delete")
# The real periods (the plugin's defaults) and the bench's scale for the steady-state window.
RESYNC_S = 300.0  # SlicePublisher(resync_seconds=...) default
WATCH_TIMEOUT_S = 300.0  # SlicePublisher(watch_timeout_seconds=...) default; each watch runs 1-2x this
HEALTH_S = defaults.HEALTH_CHECK_INTERVAL_S
PERIOD_SCALE = 100.0 if SHORT else 10.0
FIRST_WINDOW_S = 5.0 if SHORT else 60.0
FIRST_WAVE = 40  # nodes started at once: what the sandbox API server answers within the client's 10 s timeout
# A steady-state pass costs the publisher 0.05-0.1 s of CPU for a 200-device node (build, decode, plan): with the
# periods divided by PERIOD_SCALE, 1000 nodes in one process would need several cores and their requests time out
# waiting for the GIL (tried). The per-hour figures come from at most this many nodes, per node times N.
PERIODIC_NODES = 200
STEADY_WINDOW_S = 8.0 if SHORT else 120.0
FLEET_WINDOW_S = 3.0 if SHORT else 60.0
# The real API server's watch cache keeps at least the last ~75 s of events (up to 100Ki per resource); the
# sandbox's default of 1000 events per resource would expire a resume point within seconds while 1000 nodes
# publish ~3000 slices, which the real server would not.
WATCH_HISTORY = 100 * 1024


def node_count() -> int:
    return int(os.environ.get("FLEET_NODES") or (20 if SHORT else 1000))


@dataclass(frozen=True)
class Preset:
    name: str
    nvml: NvmlBackend
    inventory: NodeInventory
    devices: dict[str, AllocatableDevice]


def _presets() -> dict[str, Preset]:
    out = {}
    for name in FLEET_PRESETS:
        backend = open_backend(f"fake:{name}")
        backend.init()
        inventory = discover(backend)
        out[name] = Preset(name, backend, inventory, dict(catalog(inventory, MigOffering.DYNAMIC)))
    return out


class Server:
    """The API server process as the bench sees it: its request counts, CPU time and memory."""

    def __init__(self, pid: int, rest: KubeRest) -> None:
        self.pid = pid
        self.rest = rest

    def counts(self) -> tuple[Counter[str], int]:
        """("verb resource" -> requests, failed requests) since the server started."""
        counts: Counter[str] = Counter()
        failed = 0
        for row in self.rest.request("GET", "/debug/requests")["requests"]:
            counts[f"{row['verb']} {row['resource']}"] += int(row["count"])
            if not 200 <= int(row["code"]) < 300:
                failed += int(row["count"])
        return counts, failed

    def cpu_s(self) -> float:
        return proc_cpu_s(self.pid)

    def memory_mib(self) -> dict[str, float]:
        out = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out["rss_mib" if key == "VmRSS" else "peak_rss_mib"] = round(int(value.split()[0]) / 1024, 1)
        return out


class Window:
    """Requests, failures and the server's CPU between `start` and `end`."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self._counts, self._failed = server.counts()
        self._cpu = server.cpu_s()
        self._own_cpu = time.process_time()
        self._start = time.monotonic()

    def end(self) -> dict[str, Any]:
        counts, failed = self._server.counts()
        seconds = time.monotonic() - self._start
        requests = {k: v for k, v in sorted((counts - self._counts).items()) if v}
        return {
            "seconds": round(seconds, 1),
            "requests": requests,
            "total": sum(requests.values()),
            "failed": failed - self._failed,
            "resourceslice_writes": sum(requests.get(f"{v} resourceslices", 0) for v in WRITE_VERBS),
            "server_cpu_pct_of_one_core": round(100 * (self._server.cpu_s() - self._cpu) / seconds, 1),
            "fleet_process_cpu_pct_of_one_core": round(100 * (time.process_time() - self._own_cpu) / seconds, 1),
        }


@dataclass
class FleetNode:
    name: str
    preset: Preset
    rest: KubeRest
    publisher: SlicePublisher | None = None
    keeper: HealthKeeper | None = None


def _desired(preset: Preset, node: str) -> Callable[[int], list[JsonObject]]:
    settings = SliceSettings(DRIVER, node)
    return lambda generation: build_slices(preset.inventory.system, preset.devices, settings, generation)


def _publisher(node: FleetNode, scale: float) -> SlicePublisher:
    return SlicePublisher(
        node.rest,
        driver_name=DRIVER,
        node_name=node.name,
        desired=_desired(node.preset, node.name),
        resync_seconds=RESYNC_S / scale,
        watch_timeout_seconds=WATCH_TIMEOUT_S / scale,
    )


def _keeper(node: FleetNode, metrics: PluginMetrics) -> HealthKeeper:
    """The plugin's health keeper as `KubeletPlugin` builds it (no Events: nothing is ever tainted here)."""
    devices = node.preset.devices
    return HealthKeeper(
        HealthLedger(DRIVER, heal_after=defaults.HEALTH_HEAL_AFTER_S, heal_after_max=defaults.HEALTH_HEAL_AFTER_MAX_S),
        KeeperParts(
            nvml=node.preset.nvml,
            devices=lambda: devices,
            events=NodeEvents(None, node.name),
            metrics=metrics,
            on_change=lambda problems: None,
        ),
        driver_name=DRIVER,
        interval=HEALTH_S,
    )


class LegacyNodePoll:
    """What the health keeper of releases before DeviceTaintRules sent: its Node, every HEALTH_S, from the watch
    cache (for the before figure only)."""

    def __init__(self, node: FleetNode, phase_s: float) -> None:
        self._node = node
        self._phase = phase_s  # nodes are not in step: each starts its period at its own offset
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"legacy-poll {node.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        wait = self._phase
        while not self._stop.wait(wait):
            with contextlib.suppress(ApiError):  # counted by the server either way
                self._node.rest.get(f"/api/v1/nodes/{self._node.name}", query={"resourceVersion": "0"})
            wait = HEALTH_S


def _create_node(rest: KubeRest, name: str, preset: str) -> None:
    rest.request(
        "POST",
        "/api/v1/nodes",
        body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"preset": preset}}},
    )


def _wait_watching(server: Server, before: Counter[str], watches: int, timeout: float) -> None:
    """Until the server has registered `watches` more slice watches (it counts a watch once it is registered)."""
    deadline = time.monotonic() + timeout
    while server.counts()[0]["watch resourceslices"] - before["watch resourceslices"] < watches:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{watches} slice watches were not open within {timeout:.0f} s")
        time.sleep(0.05)  # polling the server's counters (not counted as requests)


def _by_preset(server: Server, kubeconfig: Path, presets: dict[str, Preset]) -> dict[str, Any]:
    """One node of each preset alone: every request from its publisher's start until its pool is published and
    its watch is open; then the same for a new publisher over the published slices (a plugin restart)."""
    out: dict[str, Any] = {}
    for preset in presets.values():
        name = f"solo-{preset.name}"
        _create_node(server.rest, name, preset.name)
        node = FleetNode(name, preset, connect(str(kubeconfig)))
        figures: dict[str, Any] = {"devices": len(preset.devices)}
        for phase in ("first_publish", "restart"):
            publisher = _publisher(node, 1.0)
            before = server.counts()[0]
            window = Window(server)
            publisher.start()
            try:
                if not publisher.wait_for_reconciles(1, timeout=60):
                    raise TimeoutError(f"{name} was not published within 60 s")
                _wait_watching(server, before, 1, 30)
                result = window.end()
            finally:
                publisher.stop()
            assert publisher.last_result is not None
            if phase == "first_publish":
                figures["slices"] = publisher.last_result.created
            figures[phase] = {"requests": result["total"], "by_request": result["requests"]}
        out[preset.name] = figures
    return out


def _start(nodes: list[FleetNode], scale: float, metrics: PluginMetrics) -> None:
    """Each node's publisher and health keeper, as the plugin starts them."""
    for node in nodes:
        node.publisher, node.keeper = _publisher(node, scale), _keeper(node, metrics)
        node.publisher.start()
        node.keeper.start()


def _stop_all(nodes: list[FleetNode]) -> None:
    for node in nodes:
        if node.publisher is not None:
            node.publisher.stop()
        if node.keeper is not None:
            node.keeper.stop()


def _wait_published(nodes: list[FleetNode], timeout: float) -> float:
    """Seconds (from now) until every publisher finished a first pass; raises if that takes `timeout`."""
    start = time.monotonic()
    for node in nodes:
        assert node.publisher is not None
        left = timeout - (time.monotonic() - start)
        if not node.publisher.wait_for_reconciles(1, timeout=max(left, 0.0)):
            raise TimeoutError(f"{node.name} was not published within {timeout:.0f} s")
    return time.monotonic() - start


def _publisher_stats(nodes: list[FleetNode]) -> dict[str, int]:
    pubs = [n.publisher for n in nodes if n.publisher is not None]
    return {
        "reconciles": sum(p.reconcile_count for p in pubs),
        "retried_requests": sum(p.retries for p in pubs),
        "failed_passes": sum(p.failed_passes for p in pubs),
        "rollbacks": sum(p.rollbacks for p in pubs),
    }


def _per_hour(requests: dict[str, int], seconds: float) -> dict[str, int]:
    """Per hour at the real periods: in the window the publisher's periods were PERIOD_SCALE times shorter, so
    its requests (resourceslices) count 1/PERIOD_SCALE; the Node GETs are the health keepers' (real period)."""
    per_hour: dict[str, int] = {}
    for key, count in requests.items():
        value = count / PERIOD_SCALE if key.endswith(" resourceslices") else float(count)
        per_hour[key] = round(value * 3600 / seconds)
    return per_hour


def run() -> dict[str, Any]:
    configure_logging("warning", "text")
    # Thousands of threads in one process: each thread waiting for the GIL wakes every switch interval (5 ms by
    # default) to ask for it, so with hundreds of them busy at once the kernel sees hundreds of runnable threads
    # and the API server's process gets a tiny share of the CPU. A longer interval keeps the waiting threads
    # asleep; a real fleet runs each plugin on its own machine.
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(0.05)
    n = node_count()
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="drapubfleet-"))
    out: dict[str, Any] = {
        "nodes": n,
        "presets": list(FLEET_PRESETS),
        "periods_s": {
            "real": {"publisher_resync": RESYNC_S, "publisher_watch_timeout": WATCH_TIMEOUT_S, "health": HEALTH_S},
            "fleet_and_steady_state": {
                "publisher_resync": RESYNC_S / PERIOD_SCALE,
                "publisher_watch_timeout": WATCH_TIMEOUT_S / PERIOD_SCALE,
                "health": HEALTH_S,
            },
        },
        "machine": {"cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in os.getloadavg()]},
    }
    nodes: list[FleetNode] = []
    try:
        with api_server_subprocess(work, "--watch-history", str(WATCH_HISTORY)) as proc:
            try:
                _measure(out, nodes, proc.pid, proc.kubeconfig)
            finally:
                _stop_all(nodes)  # while the server still answers
    finally:
        shutil.rmtree(work, ignore_errors=True)
        sys.setswitchinterval(switch_interval)
    out["machine"]["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def _waves(server: Server, nodes: list[FleetNode], scale: float, metrics: PluginMetrics) -> dict[str, Any]:
    """Start `nodes` FIRST_WAVE at a time, each wave once the previous one has published."""
    window = Window(server)
    for start in range(0, len(nodes), FIRST_WAVE):
        wave = nodes[start : start + FIRST_WAVE]
        _start(wave, scale, metrics)
        _wait_published(wave, timeout=600)
    return window.end()


def _measure(out: dict[str, Any], nodes: list[FleetNode], pid: int, kubeconfig: Path) -> None:
    """The phases (module docstring); `nodes` collects the fleet as it is built, for the caller to stop."""
    n = out["nodes"]
    server = Server(pid, connect(str(kubeconfig)))
    presets = _presets()
    out["by_preset"] = _by_preset(server, kubeconfig, presets)
    for i in range(n):
        preset = presets[FLEET_PRESETS[i % len(FLEET_PRESETS)]]
        name = f"fleet-{i:04d}"
        _create_node(server.rest, name, preset.name)
        nodes.append(FleetNode(name, preset, connect(str(kubeconfig))))
    metrics = PluginMetrics(process_collectors=False)

    # --- first minute: one wave starts at once, real periods ----------------------------------------
    wave = nodes[:FIRST_WAVE]
    window = Window(server)
    _start(wave, 1.0, metrics)
    published_s = _wait_published(wave, timeout=600)
    time.sleep(max(0.0, FIRST_WINDOW_S - published_s))  # the rest of the window being measured
    first = window.end()
    first.update(nodes=len(wave), all_published_s=round(published_s, 1), publishers=_publisher_stats(wave))
    first["per_node"] = {k: round(v / len(wave), 2) for k, v in first["requests"].items()}
    first["per_node_total"] = round(first["total"] / len(wave), 2)
    first["fleet_of_n_extrapolated"] = {k: round(v * n) for k, v in first["per_node"].items()}
    first["fleet_of_n_extrapolated_total"] = round(first["per_node_total"] * n)
    out["first_minute"] = first
    _stop_all(wave)

    # --- per hour: PERIODIC_NODES nodes, the publisher's periods divided by PERIOD_SCALE ----------------
    periodic_nodes = nodes[:PERIODIC_NODES]
    _waves(server, periodic_nodes, PERIOD_SCALE, metrics)
    window = Window(server)
    time.sleep(STEADY_WINDOW_S)  # the window being measured, not synchronisation
    periodic = window.end()
    periodic.update(nodes=len(periodic_nodes), publishers=_publisher_stats(periodic_nodes))
    per_hour = _per_hour(periodic["requests"], periodic["seconds"])
    periodic["per_node_per_hour"] = {k: round(v / len(periodic_nodes), 1) for k, v in per_hour.items()}
    periodic["per_node_per_hour_total"] = round(sum(per_hour.values()) / len(periodic_nodes), 1)
    periodic["fleet_of_n_per_hour_extrapolated"] = {k: round(v * n / len(periodic_nodes)) for k, v in per_hour.items()}
    periodic["fleet_of_n_per_hour_extrapolated_total"] = round(sum(per_hour.values()) * n / len(periodic_nodes))
    out["per_hour"] = periodic

    # --- per hour before: the same nodes plus the Node poll of earlier releases --------------------------
    pollers = [LegacyNodePoll(node, HEALTH_S * i / len(periodic_nodes)) for i, node in enumerate(periodic_nodes)]
    for poller in pollers:
        poller.start()
    window = Window(server)
    time.sleep(STEADY_WINDOW_S)  # the window being measured, not synchronisation
    before = window.end()
    for poller in pollers:
        poller.stop()
    before_hour = _per_hour(before["requests"], before["seconds"])
    node_gets = {k: v for k, v in before_hour.items() if k.endswith(" nodes")}
    out["per_hour_before"] = {
        "nodes": len(periodic_nodes),
        "node_gets_per_node_per_hour": round(sum(node_gets.values()) / len(periodic_nodes), 1),
        "fleet_of_n_per_hour_extrapolated_total": round(sum(before_hour.values()) * n / len(periodic_nodes)),
        "fleet_of_n_node_gets_per_hour": round(sum(node_gets.values()) * n / len(periodic_nodes)),
        "after_fleet_of_n_node_gets_per_hour": round(sum(v for k, v in per_hour.items() if k.endswith(" nodes"))
                                                     * n / len(periodic_nodes)),
    }
    _stop_all(periodic_nodes)

    # --- the whole fleet at real periods: does one server (and one process) hold it ----------------
    fleet = _waves(server, nodes, 1.0, metrics)
    fleet["note"] = f"{len(periodic_nodes)} restarts (slices adopted) and {n - len(periodic_nodes)} first publishes"
    out["fleet_start_in_waves"] = fleet
    window = Window(server)
    time.sleep(FLEET_WINDOW_S)  # the window being measured, not synchronisation
    steady = window.end()
    steady.update(
        nodes=n,
        publishers=_publisher_stats(nodes),
        threads=threading.active_count(),
        requests_per_s=round(steady["total"] / steady["seconds"], 1),
        server_memory=server.memory_mib(),
        fleet_process_rss_mib=rss_mib(),
    )
    out["fleet_steady_state"] = steady


def title() -> str:
    return f"ResourceSlice publisher at fleet scale: {node_count()} nodes' publishers + health keepers, one process"


if __name__ == "__main__":
    emit(title(), run())
