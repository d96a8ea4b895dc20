"""Fleet scale: `dra-driver explain` and the sandbox scheduler's pass over N fake nodes' ResourceSlices.

One process publishes the slices of N nodes (mixed presets, dynamic MIG; built with the plugin's own
`build_slices`, POSTed to the sandbox API server: no plugin processes), then measures

- `explain` (the real command, `dra_driver.commands.explain.run`, LISTs included) for a claim that fits on no
  node and one that fits only on the last node, for one node (`--node`) and for all nodes;
- the sandbox scheduler's pass (`plan_pod`) for a pod with the last-node claim over every node;
- API server objects and bytes per node.

    .venv/bin/python -m bench.fleet_bench                 # 1000 nodes
    BENCH_SHORT=1 .venv/bin/python -m bench.fleet_bench   # 50 nodes
    FLEET_NODES=20 .venv/bin/python -m bench.fleet_bench  # any N
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import SHORT, emit, rss_mib
from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.commands import explain
from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigPolicy, catalog
from dra_driver.inventory.discover import discover
from dra_driver.k8s.client import KubeRest
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.scheduler import plan_pod

RESOURCE = "/apis/resource.k8s.io/v1"
# Every node but the last cycles through these; the last one is the only H200 node.
PRESETS = ("dgx-h100", "dgx-a100", "a30x4", "l4x2")
LAST_PRESET = "hgx-h200"


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


def _publish(rest: KubeRest, n: int) -> dict[str, Any]:
    inventories = {}
    for preset in {*PRESETS, LAST_PRESET}:
        backend = open_backend(f"fake:{preset}")
        backend.init()
        inventories[preset] = discover(backend)
    start = time.perf_counter()
    slices = devices = 0
    for i in range(n):
        node = f"fleet-{i:04d}"
        preset = LAST_PRESET if i == n - 1 else PRESETS[i % len(PRESETS)]
        inv = inventories[preset]
        rest.request(
            "POST",
            "/api/v1/nodes",
            body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"preset": preset}}},
        )
        for obj in build_slices(inv.system, catalog(inv, MigPolicy.DYNAMIC), SliceSettings(DRIVER_NAME, node), 1):
            rest.request("POST", f"{RESOURCE}/resourceslices", body=obj)
            slices += 1
            devices += len(obj["spec"].get("devices") or [])
    return {"nodes": n, "slices": slices, "devices": devices, "publish_s": round(time.perf_counter() - start, 2)}


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return round(time.perf_counter() - start, 3)


def _explain(kubeconfig: Path, claim: str, nodes: list[str]) -> int:
    args = argparse.Namespace(claim=f"default/{claim}", namespace="default", node=nodes, kubeconfig=str(kubeconfig))
    with contextlib.redirect_stdout(io.StringIO()):
        return explain.run(args)


def run() -> dict[str, Any]:
    n = node_count()
    out: dict[str, Any] = {}
    with ApiServer() as srv, srv.rest() as rest, tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        srv.write_kubeconfig(kubeconfig)
        for cls in device_classes(DRIVER_NAME):
            rest.request("POST", f"{RESOURCE}/deviceclasses", body=cls)
        out["fleet"] = _publish(rest, n)
        nowhere, last = _claim("fits-nowhere", "NVIDIA B200"), _claim("fits-last", "NVIDIA H200")
        for claim in (nowhere, last):
            rest.request("POST", f"{RESOURCE}/namespaces/default/resourceclaims", body=claim)

        body = json.dumps(rest.request("GET", f"{RESOURCE}/resourceslices"), separators=(",", ":")).encode()
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

        nodes = rest.request("GET", "/api/v1/nodes")["items"]
        classes = rest.request("GET", f"{RESOURCE}/deviceclasses")["items"]
        start = time.perf_counter()
        slices = rest.request("GET", f"{RESOURCE}/resourceslices")["items"]
        list_s = time.perf_counter() - start
        pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {}}
        cel = DraCelEnvironment()
        plans: list[Any] = []

        def schedule() -> None:
            plans.append(
                plan_pod(
                    pod,
                    [last],
                    nodes=nodes,
                    classes=classes,
                    slices=slices,
                    allocated_claims=[],
                    namespace_labels={},
                    cel=cel,
                )
            )

        out["scheduler_pass_s"] = {"list_slices": round(list_s, 3), "plan_pod_cold": _timed(schedule)}
        out["scheduler_pass_s"]["plan_pod_warm_cel"] = _timed(schedule)
        assert all(p.node == last_node for p in plans), [p.node for p in plans]
        out["rss_mib"] = rss_mib()
    return out


if __name__ == "__main__":
    emit(f"fleet scale: explain and scheduler pass over {node_count()} fake nodes (sandbox API server)", run())
