"""Kubelet-plugin start-up: process start -> both sockets serving (what the kubelet needs to register it),
and -> the node's pool fully published; plus what the process imported.

The plugin runs as its own process (`dra-driver kubelet-plugin`, fake dgx-h100, dynamic MIG) against the
sandbox API server. `BENCH_PLUGIN_PYTHONPATH=/path/to/other/checkout` measures another tree's plugin
with the same harness (how the before/after figures in docs/benchmarks.md were taken).

    .venv/bin/python -m bench.startup_bench
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import SHORT, emit, percentile
from dra_driver import defaults
from dra_driver.k8s.client import KubeRest, connect
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.cluster import socket_accepts

NODE = "bench-start"


def _published(server: ApiServer) -> bool:
    slices = server.snapshot("resource.k8s.io", "resourceslices")
    return bool(slices) and len(slices) == slices[0]["spec"]["pool"]["resourceSliceCount"]


def one_start(server: ApiServer, api: KubeRest, kubeconfig: Path, work: Path) -> tuple[float, float]:
    registry = work / "registry"
    plugin_dir = work / "plugins" / defaults.DRIVER_NAME
    (work / "boot_id").write_text("bench\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")}
    env.update(
        {
            "DRA_DRIVER_NODE_NAME": NODE,
            "DRA_DRIVER_KUBECONFIG": str(kubeconfig),
            "DRA_DRIVER_PLUGIN_DIR": str(plugin_dir),
            "DRA_DRIVER_REGISTRY_DIR": str(registry),
            "DRA_DRIVER_CDI_ROOT": str(work / "cdi"),
            "DRA_DRIVER_NVML": f"fake:dgx-h100,state={work / 'state.json'}",
            "DRA_DRIVER_HEALTHZ_PORT": "-1",
            "DRA_DRIVER_BOOT_ID_PATH": str(work / "boot_id"),
            "DRA_DRIVER_LOG_LEVEL": "warning",
        }
    )
    other = os.environ.get("BENCH_PLUGIN_PYTHONPATH")
    if other:
        env["PYTHONPATH"] = other
    reg_sock = registry / f"{defaults.DRIVER_NAME}-reg.sock"
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dra_driver.cli", "kubelet-plugin"], env=env, stdout=subprocess.DEVNULL, cwd=work
    )
    registered = published = float("nan")
    try:
        deadline = start + 60
        while time.perf_counter() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"plugin exited {proc.returncode}")
            now = time.perf_counter()
            if math.isnan(registered) and socket_accepts(reg_sock) and socket_accepts(plugin_dir / "dra.sock"):
                registered = now - start
            if math.isnan(published) and _published(server):
                published = now - start
            if not math.isnan(registered) and not math.isnan(published):
                break
            time.sleep(0.005)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        for s in server.snapshot("resource.k8s.io", "resourceslices"):
            api.request("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{s['metadata']['name']}")
    return registered, published


def imported_modules() -> dict[str, Any]:
    code = "import json,sys; import dra_driver.cli, dra_driver.commands.kubelet_plugin, dra_driver.plugin.app; "
    code += "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    env = dict(os.environ)
    if os.environ.get("BENCH_PLUGIN_PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["BENCH_PLUGIN_PYTHONPATH"]
        code = code.replace("dra_driver.commands.kubelet_plugin", "dra_driver.cli")
    # cwd "/" so that `-c` (which puts the cwd first on sys.path) imports the tree under test.
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False, cwd="/")
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1]}
    tops = set(json.loads(out.stdout))
    return {"top_level_packages": len(tops), "cel_or_lark": sorted(tops & {"celpy", "lark"})}


def run() -> dict[str, Any]:
    rounds = 3 if SHORT else 10
    registered: list[float] = []
    published: list[float] = []
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="drastart-"))
    try:
        with ApiServer() as server:
            kubeconfig = Path(server.write_kubeconfig(work / "kubeconfig"))
            api = connect(str(kubeconfig))
            for i in range(rounds):
                (work / f"run{i}").mkdir()
                reg, pub = one_start(server, api, kubeconfig, work / f"run{i}")
                registered.append(reg)
                published.append(pub)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "rounds": rounds,
        "start_to_registered_s": {"p50": round(percentile(registered, 50), 3), "max": round(max(registered), 3)},
        "start_to_published_s": {"p50": round(percentile(published, 50), 3), "max": round(max(published), 3)},
        "plugin_imports": imported_modules(),
    }


if __name__ == "__main__":
    emit("kubelet-plugin start-up (fake dgx-h100, dynamic MIG)", run())
