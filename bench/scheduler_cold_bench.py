"""The sandbox scheduler's cold pass (`plan_pod` with a fresh `SliceIndex`) over N fake nodes, in memory.

The same fleet as `bench/fleet_bench.py` (its presets and slices, GPU UUIDs unique per node, the claim that fits
only on the last node), built here without an API server: the slices carry a uid and resourceVersion of their own,
as a LIST would give them. Measures the cold pass, the pass again on the same index and the next pass with the
kept index, the cold pass without the pool sieve, and the cold pass of a claim that fits nowhere (sieved, then redone
in full for its message) with and without the sieve; `--profile` prints a cProfile of one cold pass by own time.

    .venv/bin/python -m bench.scheduler_cold_bench --nodes 200 [--profile] [--top 30]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import time
from collections.abc import Callable
from typing import Any

from bench.common import SHORT, emit, rss_mib
from bench.fleet_bench import LAST_PRESET, PRESETS, _claim, _inventories, _node_slices
from dra_driver.allocation import SliceIndex
from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.defaults import DRIVER_NAME
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.kubelet.nodestatus import ready_node
from dra_sandbox.scheduler import PodPlan, plan_pod


def fleet(n: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(nodes, slices) of an N-node fleet, as a LIST of each would return them."""
    inventories = _inventories()
    nodes: list[dict[str, Any]] = []
    slices: list[dict[str, Any]] = []
    for i in range(n):
        preset = LAST_PRESET if i == n - 1 else PRESETS[i % len(PRESETS)]
        name = f"fleet-{i:04d}"
        nodes.append(ready_node(name, {"preset": preset}))
        for s in _node_slices(inventories, name, preset, i):
            s["metadata"] = {**s["metadata"], "uid": f"uid-{len(slices)}", "resourceVersion": str(len(slices) + 10)}
            slices.append(s)
    return nodes, slices


def _timed(fn: Callable[[], object]) -> dict[str, float]:
    """Wall and CPU seconds (the CPU figure moves less with the machine's load)."""
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    return {"wall_s": round(time.perf_counter() - start, 3), "cpu_s": round(time.process_time() - cpu, 3)}


def run(n: int, profile: bool, top: int) -> dict[str, Any]:
    nodes, slices = fleet(n)
    classes = device_classes(DRIVER_NAME)
    claim = _claim("fits-last", "NVIDIA H200")
    claim["metadata"] = {**claim["metadata"], "uid": "claim-uid", "resourceVersion": "1"}
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {}}
    cel = DraCelEnvironment()
    plans: list[PodPlan] = []

    nowhere = _claim("fits-nowhere", "NVIDIA B200")
    nowhere["metadata"] = {**nowhere["metadata"], "uid": "nowhere-uid", "resourceVersion": "1"}

    def schedule(index: SliceIndex, sieve: bool = True) -> None:
        plans.append(plan_pod(pod, [claim], nodes=nodes, classes=classes, slices=index, allocated_claims=[],
                              namespace_labels={}, cel=cel, sieve=sieve))

    def schedule_nowhere(index: SliceIndex, sieve: bool = True) -> PodPlan:
        return plan_pod(pod, [nowhere], nodes=nodes, classes=classes, slices=index, allocated_claims=[],
                        namespace_labels={}, cel=cel, sieve=sieve)

    out: dict[str, Any] = {"nodes": n, "slices": len(slices),
                           "devices": sum(len(s["spec"].get("devices") or []) for s in slices)}
    gc.collect()
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        schedule(SliceIndex(slices))
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
        print(buf.getvalue())
    passes: dict[str, dict[str, float]] = {}
    passes["cold"] = _timed(lambda: schedule(SliceIndex(slices)))
    first = SliceIndex(slices)
    schedule(first)
    passes["again_same_index"] = _timed(lambda: schedule(first))
    passes["next_pass_kept_index"] = _timed(lambda: schedule(SliceIndex(slices, previous=first)))
    # The same cold pass without the pool sieve (every pool of every node parsed): what it was before it.
    passes["cold_without_sieve"] = _timed(lambda: schedule(SliceIndex(slices), sieve=False))
    last = f"fleet-{n - 1:04d}"
    assert all(p.node == last for p in plans), [p.node for p in plans]
    # A claim that fits nowhere: the sieved pass finds no node, so it is made again in full for the message.
    failed: list[PodPlan] = []
    passes["cold_fits_nowhere"] = _timed(lambda: failed.append(schedule_nowhere(SliceIndex(slices))))
    passes["cold_fits_nowhere_without_sieve"] = _timed(
        lambda: failed.append(schedule_nowhere(SliceIndex(slices), sieve=False)))
    assert failed[0] == failed[1] and failed[0].node is None
    out["scheduler_pass_s"] = passes
    out["rss_mib"] = rss_mib()
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=50 if SHORT else 1000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    emit(f"sandbox scheduler cold pass over {args.nodes} fake nodes (in memory)", run(args.nodes, args.profile,
                                                                                       args.top))


if __name__ == "__main__":
    main()
