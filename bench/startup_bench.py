"""Kubelet-plugin start-up: process start -> both sockets serving (what the kubelet needs to register it),
and -> the node's pool fully published; the plugin's memory at rest; what the process imported and how long
the imports take.

The plugin runs as its own process (`dra-driver kubelet-plugin`, fake dgx-h100, dynamic MIG) against the
sandbox API server. `BENCH_PLUGIN_PYTHONPATH=/path/to/other/checkout` measures another tree's plugin
with the same harness (how the before/after figures in docs/benchmarks.md were taken).

Bytecode: the image's modules are compiled at install, so a plugin start never compiles. Here the plugin processes
get a private `PYTHONPYCACHEPREFIX` and one uncounted warm-up start fills it; without that, a checkout run with
PYTHONDONTWRITEBYTECODE (as CI is) would compile every module of the tree on every start and the figures would
measure the compiler.

Kubeconfig: JSON (`json_kubeconfig`), as the plugin in the cluster reads the in-cluster configuration and no YAML.

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

import yaml

from bench.common import IMAGE_ENV, emit, image_like_pythonpath, percentile, sized
from bench.prepare_bench import proc_cpu_s
from dra_driver import defaults
from dra_driver.k8s.client import KubeRest, connect
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.polling import socket_accepts

NODE = "bench-start"


def _published(server: ApiServer) -> bool:
    slices = server.snapshot("resource.k8s.io", "resourceslices")
    return bool(slices) and len(slices) == slices[0]["spec"]["pool"]["resourceSliceCount"]


# How long after the pool is published the plugin's memory is read "at rest": the publisher's watch is open,
# the first usage sample and health check have run.
REST_AFTER_PUBLISH_S = 2.0


def plugin_env(pycache: Path) -> dict[str, str]:
    """The environment of every plugin process: compiled bytecode kept under `pycache` (see the module's doc)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_") and k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    path = os.environ.get("BENCH_PLUGIN_PYTHONPATH") or env.get("PYTHONPATH", "")
    # Absolute: the plugin and the import probe run in other directories, where a relative entry (PYTHONPATH=.)
    # would miss the tree under test and the installed package would be measured instead.
    env = {**IMAGE_ENV, **env}
    env["PYTHONPATH"] = image_like_pythonpath(
        pycache.parent, os.pathsep.join(os.path.abspath(p) for p in path.split(os.pathsep) if p)
    )
    return env


def json_kubeconfig(yaml_kubeconfig: Path, target: Path) -> Path:
    """The sandbox's kubeconfig rewritten as JSON (JSON is YAML: still a kubeconfig). A deployed plugin reads the
    in-cluster configuration (a token file and two environment variables) and loads no YAML parser; the product's
    loader reads a JSON kubeconfig with `json`, so the figures do not include PyYAML's import and parse (≈ 0.02 s of
    CPU), which only a YAML kubeconfig given by hand costs."""
    target.write_text(json.dumps(yaml.safe_load(yaml_kubeconfig.read_text())))
    target.chmod(0o600)
    return target


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def one_start(server: ApiServer, api: KubeRest, kubeconfig: Path, work: Path, pycache: Path) -> tuple[float, ...]:
    """Seconds to registered, seconds to published, RSS (MiB) at rest, the plugin's CPU seconds until registered
    (user + system, from /proc: unlike the wall clock, it holds on a busy machine)."""
    registry = work / "registry"
    plugin_dir = work / "plugins" / defaults.DRIVER_NAME
    (work / "boot_id").write_text("bench\n")
    env = plugin_env(pycache)
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
    reg_sock = registry / f"{defaults.DRIVER_NAME}-reg.sock"
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dra_driver.cli", "kubelet-plugin"], env=env, stdout=subprocess.DEVNULL, cwd=work
    )
    registered = published = rss = registered_cpu = float("nan")
    try:
        deadline = start + 60
        while time.perf_counter() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"plugin exited {proc.returncode}")
            now = time.perf_counter()
            if math.isnan(registered) and socket_accepts(reg_sock) and socket_accepts(plugin_dir / "dra.sock"):
                registered = now - start
                registered_cpu = proc_cpu_s(proc.pid)
            if math.isnan(published) and _published(server):
                published = now - start
            if not math.isnan(registered) and not math.isnan(published):
                break
            time.sleep(0.005)
        time.sleep(REST_AFTER_PUBLISH_S)
        if proc.poll() is None:
            rss = _rss_mib(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        for s in server.snapshot("resource.k8s.io", "resourceslices"):
            api.request("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{s['metadata']['name']}")
    return registered, published, rss, registered_cpu


def imported_modules(pycache: Path) -> dict[str, Any]:
    """What importing the plugin loads, how long it takes and the peak RSS of that bare import (a fresh
    interpreter each time, the median of 5)."""
    # VmHWM, not getrusage's ru_maxrss: Linux carries the forking parent's peak into a child's ru_maxrss.
    code = "import json, sys, time; t = time.perf_counter(); "
    code += "import dra_driver.cli, dra_driver.commands.kubelet_plugin, dra_driver.plugin.app; "
    code += "s = time.perf_counter() - t; "
    code += "hwm = [int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmHWM:')][0]; "
    code += "print(json.dumps([s, hwm, sorted({m.split('.')[0] for m in sys.modules})]))"
    env = plugin_env(pycache)
    seconds: list[float] = []
    peaks: list[float] = []
    tops: set[str] = set()
    for _ in range(5):
        # cwd "/" so that `-c` (which puts the cwd first on sys.path) imports the tree under test.
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False, cwd="/"
        )
        if out.returncode != 0:
            return {"error": out.stderr.strip().splitlines()[-1]}
        took, peak_kib, names = json.loads(out.stdout)
        seconds.append(took)
        peaks.append(peak_kib / 1024)
        tops = set(names)
    return {
        "import_s_p50": round(percentile(seconds, 50), 3),
        "import_max_rss_mib_p50": round(percentile(peaks, 50), 1),
        "top_level_packages": len(tops),
        "cel_or_lark": sorted(tops & {"celpy", "lark"}),
        "kubernetes": "kubernetes" in tops,
    }


def run() -> dict[str, Any]:
    rounds = sized(2, 4, 10)
    registered: list[float] = []
    published: list[float] = []
    rss: list[float] = []
    registered_cpu: list[float] = []
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="drastart-"))
    pycache = work / "pycache"
    try:
        with ApiServer() as server:
            kubeconfig = json_kubeconfig(Path(server.write_kubeconfig(work / "kubeconfig.yaml")), work / "kubeconfig")
            api = connect(str(kubeconfig))
            (work / "warm-up").mkdir()
            one_start(server, api, kubeconfig, work / "warm-up", pycache)  # compiles into `pycache`; not counted
            for i in range(rounds):
                (work / f"run{i}").mkdir()
                reg, pub, mib, cpu = one_start(server, api, kubeconfig, work / f"run{i}", pycache)
                registered.append(reg)
                registered_cpu.append(cpu)
                published.append(pub)
                rss.append(mib)
            imports = imported_modules(pycache)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "rounds": rounds,
        "start_to_registered_s": {"p50": round(percentile(registered, 50), 3), "max": round(max(registered), 3)},
        "cpu_to_registered_s": {
            "p50": round(percentile(registered_cpu, 50), 3),
            "max": round(max(registered_cpu), 3),
        },
        "start_to_published_s": {"p50": round(percentile(published, 50), 3), "max": round(max(published), 3)},
        "plugin_rss_mib_at_rest": {"p50": round(percentile(rss, 50), 1), "max": round(max(rss), 1)},
        "plugin_imports": imports,
    }


if __name__ == "__main__":
    emit("kubelet-plugin start-up (fake dgx-h100, dynamic MIG)", run())
