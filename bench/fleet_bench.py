"""Fleet scale: `dra-driver explain`, the sandbox scheduler's pass and the controller's counts over N fake nodes.

The sandbox API server runs in its own process (as a real one would: its JSON encoding does not share this
process's GIL). This process publishes the slices of N nodes (mixed presets, dynamic MIG; built with the plugin's
own `build_slices`, GPU UUIDs unique per node; POSTed: no plugin processes), then measures

- `explain` (the real command, `dra_driver.commands.explain.run`, its requests included) for a claim that fits on
  no node and one that fits only on the last node, for one node (`--node`) and for all nodes;
- the sandbox scheduler's pass (`plan_pod`) for a pod with the last-node claim over every node;
- API server objects and bytes per node;
- `dra-driver controller` (kopf, in a thread here) with one policy selecting the H100 GPUs: start -> its status
  counts them, and a new node's slices written -> status.devices/nodes count it.

    .venv/bin/python -m bench.fleet_bench                 # 1000 nodes
    BENCH_SHORT=1 .venv/bin/python -m bench.fleet_bench   # 50 nodes
    FLEET_NODES=20 .venv/bin/python -m bench.fleet_bench  # any N
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import SHORT, emit, rss_mib
from bench.prepare_bench import api_server_process
from dra_driver.allocation import SliceIndex
from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.commands import explain
from dra_driver.commands.flags import FlagParser
from dra_driver.commands.listing import list_all
from dra_driver.controller.operator import ControllerSettings
from dra_driver.controller.operator import run as run_controller
from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.k8s.client import KubeRest
from dra_driver.nvml.factory import open_backend
from dra_driver.observability.logging import configure_logging
from dra_driver.policy.crd import custom_resource_definition
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.kubelet.nodestatus import ready_node
from dra_sandbox.scheduler import plan_pod

RESOURCE = "/apis/resource.k8s.io/v1"
# Every node but the last cycles through these; the last one is the only H200 node.
PRESETS = ("dgx-h100", "dgx-a100", "a30x4", "l4x2")
LAST_PRESET = "hgx-h200"
H100 = "NVIDIA H100 80GB HBM3"
POLICIES = "/apis/gpu.dra.dev/v1beta1/gpusharingpolicies"
POLICY_NAME = "fleet-h100"
CONTROLLER_TIMEOUT_S = 600.0


def node_count() -> int:
    return int(os.environ.get("FLEET_NODES") or (50 if SHORT else 1000))


def _claim(name: str, product: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DRIVER_NAME,
                            "count": 1,
                            "selectors": [
                                {
                                    "cel": {
                                        "expression": f"device.attributes['{DRIVER_NAME}'].productName == '{product}'"
                                    }
                                }
                            ],
                        },
                    }
                ]
            }
        },
    }


def _inventories() -> dict[str, Any]:
    out = {}
    for preset in {*PRESETS, LAST_PRESET}:
        backend = open_backend(f"fake:{preset}")
        backend.init()
        out[preset] = discover(backend)
    return out


_GPU_UUID = re.compile(r"GPU-([0-9a-f]{8})")


def _node_slices(inventories: dict[str, Any], node: str, preset: str, i: int) -> list[dict[str, Any]]:
    """The node's slices as its plugin builds them, with GPU UUIDs of its own (one fake inventory per preset would
    repeat them on every node of that preset, which no fleet does and which would flatter any cache keyed by a
    device's content)."""
    inv = inventories[preset]
    built = build_slices(inv.system, catalog(inv, MigOffering.DYNAMIC), SliceSettings(DRIVER_NAME, node), 1)
    text = _GPU_UUID.sub(lambda m: f"GPU-{int(m.group(1), 16) ^ (i * 2654435761 % 2**32):08x}", json.dumps(built))
    slices: list[dict[str, Any]] = json.loads(text)
    return slices


def _publish_node(rest: KubeRest, node: str, preset: str, built: list[dict[str, Any]]) -> tuple[int, int]:
    rest.request(
        "POST",
        "/api/v1/nodes",
        body=ready_node(node, {"preset": preset}),
    )
    slices = devices = 0
    for obj in built:
        rest.request("POST", f"{RESOURCE}/resourceslices", body=obj)
        slices += 1
        devices += len(obj["spec"].get("devices") or [])
    return slices, devices


def _publish(rest: KubeRest, inventories: dict[str, Any], n: int) -> dict[str, Any]:
    start = time.perf_counter()
    slices = devices = 0
    for i in range(n):
        preset = LAST_PRESET if i == n - 1 else PRESETS[i % len(PRESETS)]
        node = f"fleet-{i:04d}"
        added = _publish_node(rest, node, preset, _node_slices(inventories, node, preset, i))
        slices, devices = slices + added[0], devices + added[1]
    return {"nodes": n, "slices": slices, "devices": devices, "publish_s": round(time.perf_counter() - start, 2)}


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return round(time.perf_counter() - start, 3)


def _explain(kubeconfig: Path, claim: str, nodes: list[str]) -> int:
    # The command's own parser: a flag it gains gets its default here too.
    parser = FlagParser()
    explain.add_arguments(parser)
    args = parser.parse_args([f"default/{claim}", "--kubeconfig", str(kubeconfig), "--watch-list",
                              *(f"--node={n}" for n in nodes)])
    with contextlib.redirect_stdout(io.StringIO()):
        return explain.run(args)


def _policy_counts(rest: KubeRest) -> tuple[int | None, int | None]:
    status = (rest.get(f"{POLICIES}/{POLICY_NAME}") or {}).get("status") or {}
    return status.get("devices"), status.get("nodes")


def _wait_counts(rest: KubeRest, wanted: tuple[int, int], since: float) -> float:
    while _policy_counts(rest) != wanted:
        if time.monotonic() - since > CONTROLLER_TIMEOUT_S:
            return float("nan")
        time.sleep(0.005)
    return round(time.monotonic() - since, 3)


def _controller(rest: KubeRest, kubeconfig: Path, inventories: dict[str, Any], n: int) -> dict[str, Any]:
    """`dra-driver controller` (kopf, in a thread of this process, as bench/controller_bench.py runs it) with one
    policy counting the fleet's H100 GPUs: start -> first counts, then a new dgx-h100 node's slices written ->
    the policy's status.devices/nodes count it."""
    rest.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=custom_resource_definition())
    rest.request(
        "POST",
        POLICIES,
        body={
            "apiVersion": "gpu.dra.dev/v1beta1",
            "kind": "GpuSharingPolicy",
            "metadata": {"name": POLICY_NAME},
            "spec": {"devices": {"type": "gpu", "productNames": [H100]}},
        },
    )
    h100_nodes = sum(1 for i in range(n - 1) if PRESETS[i % len(PRESETS)] == "dgx-h100")
    gpus = len(inventories["dgx-h100"].gpus)
    options = ControllerSettings(
        driver_name=DRIVER_NAME, kubeconfig=str(kubeconfig), healthz_port=-1, stale_slice_grace_seconds=0
    )
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=run_controller, args=(options,), daemon=True, kwargs={"stop_flag": stop, "ready_flag": ready}
    )
    out: dict[str, Any] = {"status_interval_s": options.status_interval_seconds}
    start = time.monotonic()
    thread.start()
    try:
        if not ready.wait(CONTROLLER_TIMEOUT_S):
            raise RuntimeError("the controller did not start")
        out["start_to_counts_s"] = _wait_counts(rest, (gpus * h100_nodes, h100_nodes), start)
        # A node that joins a quiet cluster (nothing changed for one interval: the recount is not held back by the
        # at-most-once-per-interval limit, which bounds the delay under a steady stream of changes).
        time.sleep(options.status_interval_seconds)
        built = _node_slices(inventories, f"fleet-{n:04d}", "dgx-h100", n)
        first = time.monotonic()
        _publish_node(rest, f"fleet-{n:04d}", "dgx-h100", built)
        written = time.monotonic()
        counted = _wait_counts(rest, (gpus * (h100_nodes + 1), h100_nodes + 1), first)
        out["node_added_to_counts_s"] = counted
        out["last_slice_written_to_counts_s"] = round(counted - (written - first), 3)
    finally:
        stop.set()
        thread.join(CONTROLLER_TIMEOUT_S)
    return out


def run() -> dict[str, Any]:
    configure_logging("critical", "text")
    n = node_count()
    out: dict[str, Any] = {}
    inventories = _inventories()
    with tempfile.TemporaryDirectory() as tmp, api_server_process(Path(tmp)) as rest:
        kubeconfig = Path(tmp) / "kubeconfig"
        for cls in device_classes(DRIVER_NAME):
            rest.request("POST", f"{RESOURCE}/deviceclasses", body=cls)
        out["fleet"] = _publish(rest, inventories, n)
        nowhere, last = _claim("fits-nowhere", "NVIDIA B200"), _claim("fits-last", "NVIDIA H200")
        for claim in (nowhere, last):
            rest.request("POST", f"{RESOURCE}/namespaces/default/resourceclaims", body=claim)

        start = time.perf_counter()
        slices = list_all(rest, f"{RESOURCE}/resourceslices")
        list_s = time.perf_counter() - start
        body = json.dumps(slices, separators=(",", ":")).encode()
        out["api_per_node"] = {
            "resourceslices": round(out["fleet"]["slices"] / n, 2),
            "devices": round(out["fleet"]["devices"] / n, 2),
            "list_json_bytes": len(body) // n,
        }
        last_node = f"fleet-{n - 1:04d}"
        out["explain_s"] = {
            "nowhere_one_node": _timed(lambda: _explain(kubeconfig, "fits-nowhere", [last_node])),
            "last_one_node": _timed(lambda: _explain(kubeconfig, "fits-last", [last_node])),
            "nowhere_all_nodes": _timed(lambda: _explain(kubeconfig, "fits-nowhere", [])),
            "last_all_nodes": _timed(lambda: _explain(kubeconfig, "fits-last", [])),
        }
        assert _explain(kubeconfig, "fits-last", [last_node]) == 0
        assert _explain(kubeconfig, "fits-nowhere", [last_node]) == 2

        nodes = list_all(rest, "/api/v1/nodes")
        classes = rest.request("GET", f"{RESOURCE}/deviceclasses")["items"]
        pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {}}
        cel = DraCelEnvironment()
        plans: list[Any] = []

        def schedule(index: SliceIndex) -> None:
            plans.append(
                plan_pod(
                    pod,
                    [last],
                    nodes=nodes,
                    classes=classes,
                    slices=index,
                    allocated_claims=[],
                    namespace_labels={},
                    cel=cel,
                )
            )

        passes: dict[str, Any] = {"list_slices": round(list_s, 3)}
        passes["plan_pod_cold"] = _timed(lambda: schedule(SliceIndex(slices)))
        first = SliceIndex(slices)
        passes["plan_pod_warm_cel"] = _timed(lambda: schedule(first))
        # The sandbox scheduler's next pass: a new LIST, an index that takes over the last pass's parses.
        relisted = list_all(rest, f"{RESOURCE}/resourceslices")
        passes["plan_pod_next_pass"] = _timed(lambda: schedule(SliceIndex(relisted, previous=first)))
        assert all(p.node == last_node for p in plans), [p.node for p in plans]
        out["scheduler_pass_s"] = passes
        out["rss_mib"] = rss_mib()
        slices, body, relisted, first = [], b"", [], SliceIndex(())  # free them before the controller lists again
        out["controller"] = _controller(rest, kubeconfig, inventories, n)
    return out


if __name__ == "__main__":
    emit(f"fleet scale: explain and scheduler pass over {node_count()} fake nodes (sandbox API server)", run())
