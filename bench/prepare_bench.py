"""Prepare/unprepare latency and throughput of the kubelet plugin, over its real unix socket.

Path measured: kubelet-style gRPC call -> engine -> GET ResourceClaim over HTTP from the sandbox API
server -> durable writes (checkpoint records, CDI spec) -> response. Three kinds of process, as on a node: the
sandbox API server, the plugin (`dra-driver kubelet-plugin`, fake NVML, product defaults but its ports), and the
callers: one claim at a time from this process, concurrent calls from `bench.prepare_load` client processes (16
callers each; BENCH_CLIENT_PROCS sets how many), so no caller shares a GIL with the plugin.

Every figure is printed beside its floor, measured in the same run from the same callers: the bare gRPC round
trip (an empty NodePrepareResources over the same socket), a GET of a ResourceClaim from the same server, one
fsynced atomic write (`dra_driver.fsutil.atomic_write`) in the plugin's directory, and the rates of gRPC + GET
(and of gRPC alone) at 1/16/64 callers. A prepare's floor is gRPC + GET + the durable writes crash safety needs
for it (`WRITES_PER_PREPARE`); an unprepare's is gRPC + its writes (no GET).

    .venv/bin/python -m bench.prepare_bench          # full
    BENCH_SHORT=1 .venv/bin/python -m bench.prepare_bench
    BENCH_SIZE=medium .venv/bin/python -m bench.prepare_bench   # full shapes (64 concurrent), fewer repetitions

Wall clock vs CPU: on a machine shared with other work (the project's 2-core VM), the latencies, rates and floors
move by 2x between runs; the plugin's CPU per claim (utime + stime from /proc/<pid>/stat) and its RSS do not, but
for the disk: the CDI dir lies on a tmpfs as /var/run/cdi does on a node (`common.runtime_dir`), the plugin dir
under BENCH_WORK_DIR (default /tmp), and on the VM's journal-less ext4 each new file costs 0.3-0.6 ms of system CPU
while the bench churns files (docs/benchmarks.md "Where the benches' files lie": put BENCH_WORK_DIR on a journaled
filesystem for CPU figures that hold). Compare the wall-clock figures only with the floors of the same run, and
re-run on a quiet machine for them.
    BENCH_PLUGIN_PYTHONPATH=/other/checkout .venv/bin/python -m bench.prepare_bench   # that tree's plugin
    BENCH_WORK_DIR=/mnt/journaled .venv/bin/python -m bench.prepare_bench             # plugin dirs there
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench.common import (
    IMAGE_ENV,
    SHORT,
    cpu_seconds_from_stat,
    emit,
    filesystem,
    image_like_pythonpath,
    many_gpus_node,
    rss_mib_from_status,
    runtime_dir,
    sized,
    summary_ms,
    system_seconds_from_stat,
    work_dir,
)
from dra_driver import defaults
from dra_driver._gen import dra_v1_pb2 as pb
from dra_driver._gen import dra_v1_pb2_grpc as pb_grpc
from dra_driver.fsutil import atomic_write
from dra_driver.inventory.catalog import MigOffering
from dra_driver.inventory.sharing import EXCLUSIVE, SharingSettings
from dra_driver.k8s.client import KubeRest, connect
from dra_driver.nvml.factory import open_backend, open_mps_control
from dra_driver.observability.logging import configure_logging
from dra_driver.plugin.app import KubeletPlugin, PluginSettings
from dra_sandbox.children import terminate
from dra_sandbox.objects import create_allocated_claim
from dra_sandbox.polling import socket_accepts

DRIVER = defaults.DRIVER_NAME
NODE = "bench-node"
MIG_NODE = "bench-mig"  # the dynamic-MIG node of the one-at-a-time MIG figures
# Durable (fsynced) writes a whole-GPU prepare needs: the claim's CDI spec and the PrepareCompleted record. A
# device whose preparation touches hardware (MIG, time-slice, MPS) also needs PrepareStarted first.
WRITES_PER_PREPARE = 2
# A whole-GPU unprepare: the CDI spec's removal and the record's removal (UnprepareStarted first when it releases
# hardware).
WRITES_PER_UNPREPARE = 2
TITLE = "prepare/unprepare (fake NVML; API server, plugin and callers in processes of their own; real unix socket)"


@dataclass(frozen=True)
class ServerProcess:
    pid: int
    kubeconfig: Path


@contextlib.contextmanager
def api_server_subprocess(work: Path, *args: str) -> Iterator[ServerProcess]:
    """`dra-sandbox apiserver [args]` in its own process (so it does not compete with the plugin for the GIL);
    yields its pid (for its CPU and RSS) and the kubeconfig it writes."""
    kubeconfig = work / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dra_sandbox", "apiserver", "--kubeconfig-out", str(kubeconfig), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the server listens (or exits)
        if "listening" not in line or not kubeconfig.exists():
            raise RuntimeError(f"sandbox API server did not start: {line}{proc.stdout.read()}")
        yield ServerProcess(proc.pid, kubeconfig)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@contextlib.contextmanager
def api_server_process(work: Path) -> Iterator[KubeRest]:
    """The sandbox API server in its own process; yields a client from the kubeconfig it writes."""
    with api_server_subprocess(work) as server:
        yield connect(str(server.kubeconfig))


def bench_plugin(
    tmp: Path, nvml_spec: str, rest: KubeRest, policy: MigOffering, sharing: SharingSettings = EXCLUSIVE
) -> KubeletPlugin:
    """A started in-process kubelet plugin on fake NVML (no publishing); with shares, MPS served by the fake. For the
    sharing bench and `bench.prepare_profile` (which profiles it); this bench's own figures come from
    `plugin_process`."""
    nvml = open_backend(nvml_spec)
    nvml.init()
    tmp.mkdir(parents=True, exist_ok=True)
    boot = tmp / "boot_id"
    boot.write_text("bench\n")
    config = PluginSettings(
        node_name=NODE,
        driver_name=DRIVER,
        plugin_dir=tmp / "p",
        registry_dir=tmp / "r",
        cdi_root=tmp / "cdi",
        driver_root=Path("/"),
        host_driver_root=Path("/"),
        mig_offering=policy,
        fake_cdi=True,
        healthz_port=None,
        boot_id_path=boot,
        publish=False,
        sharing=sharing,
    )
    mps = open_mps_control(nvml) if sharing.enabled else None
    plugin = KubeletPlugin(config, nvml=nvml, rest=rest, mps_control=mps)
    plugin.start()
    return plugin


def _claims(refs: list[dict[str, Any]]) -> list[Any]:
    return [
        pb.Claim(namespace=c["metadata"]["namespace"], name=c["metadata"]["name"], uid=c["metadata"]["uid"])
        for c in refs
    ]


@dataclass(frozen=True)
class RunningPlugin:
    socket: Path  # the DRA socket the kubelet would call
    pid: int
    plugin_dir: Path
    log: Path


@contextlib.contextmanager
def plugin_process(
    work: Path,
    kubeconfig: Path,
    nvml_spec: str,
    mig_mode: str,
    node: str,
    rest: KubeRest,
    argv: tuple[str, ...] = ("-m", "dra_driver.cli", "kubelet-plugin"),
    extra_env: dict[str, str] | None = None,
    cdi_root: Path | None = None,
) -> Iterator[RunningPlugin]:
    """`dra-driver kubelet-plugin` as its own process, as on a node (product defaults: JSON logs at info to a file,
    usage sampling, Events; only the ports are off), serving once its pool is published (so the publisher's start
    is not measured). `BENCH_PLUGIN_PYTHONPATH=<other checkout>` runs another tree's plugin with this harness;
    `argv` (after the interpreter) may name another entry point (bench.profiled_plugin)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "boot_id").write_text("bench\n")
    plugin_dir = work / "plugin"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")}
    env.update(
        {
            "DRA_DRIVER_NODE_NAME": node,
            "DRA_DRIVER_KUBECONFIG": str(kubeconfig),
            "DRA_DRIVER_PLUGIN_DIR": str(plugin_dir),
            "DRA_DRIVER_REGISTRY_DIR": str(work / "registry"),
            "DRA_DRIVER_CDI_ROOT": str(cdi_root or work / "cdi"),  # common.runtime_dir: a tmpfs, as on a node
            "DRA_DRIVER_NVML": nvml_spec,
            "DRA_DRIVER_MIG_MODE": mig_mode,
            "DRA_DRIVER_HEALTHZ_PORT": "-1",
            "DRA_DRIVER_METRICS_PORT": "-1",
            "DRA_DRIVER_BOOT_ID_PATH": str(work / "boot_id"),
        }
    )
    other = os.environ.get("BENCH_PLUGIN_PYTHONPATH")
    if other:
        env["PYTHONPATH"] = other
    elif argv[:2] != ("-m", "dra_driver.cli"):  # a bench entry point: the plugin runs in `work`, not the checkout
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, (str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH")))
        )
    # Experiments: BENCH_PLUGIN_ENV="DRA_DRIVER_USAGE_INTERVAL=0,DRA_DRIVER_LOG_LEVEL=warning" (flags as env).
    for setting in filter(None, os.environ.get("BENCH_PLUGIN_ENV", "").split(",")):
        key, _, value = setting.partition("=")
        env[key.strip()] = value.strip()
    env.update(extra_env or {})
    env["PYTHONPATH"] = image_like_pythonpath(work, env.get("PYTHONPATH", ""))
    env = {**IMAGE_ENV, **env}  # BENCH_PLUGIN_ENV's and the caller's settings still win
    log_path = work / "plugin.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, *argv],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=work,
        )
    try:
        socket = plugin_dir / "dra.sock"
        deadline = time.monotonic() + 60
        while not (socket_accepts(socket) and _published(rest, node)):
            if proc.poll() is not None:
                raise RuntimeError(f"plugin exited {proc.returncode}: {log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"plugin not serving and published within 60 s: {log_path.read_text()[-2000:]}")
            time.sleep(0.05)  # polling for readiness, not synchronising the measurement
        yield RunningPlugin(socket=socket, pid=proc.pid, plugin_dir=plugin_dir, log=log_path)
    finally:
        terminate(proc, 30)


def _published(rest: KubeRest, node: str) -> bool:
    items = (rest.get("/apis/resource.k8s.io/v1/resourceslices") or {}).get("items") or []
    ours = [s for s in items if s["spec"]["pool"]["name"] == node]
    return bool(ours) and len(ours) == ours[0]["spec"]["pool"]["resourceSliceCount"]


def settled_cpu_s(pid: int, quiet_s: float = 0.5, timeout_s: float = 10.0) -> float:
    """The process's CPU seconds once its background work has stopped: polled until it grows by less than 10 % of a
    core for `quiet_s` (or `timeout_s` passed)."""
    deadline = time.monotonic() + timeout_s
    last, since = proc_cpu_s(pid), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)  # a poll interval, not a synchronisation
        now = proc_cpu_s(pid)
        if now - last > 0.005:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
    return proc_cpu_s(pid)


def proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far."""
    return cpu_seconds_from_stat(Path(f"/proc/{pid}/stat").read_text(), os.sysconf("SC_CLK_TCK"))


def proc_system_cpu_s(pid: int) -> float:
    return system_seconds_from_stat(Path(f"/proc/{pid}/stat").read_text(), os.sysconf("SC_CLK_TCK"))


def proc_rss_mib(pid: int) -> float:
    return rss_mib_from_status(Path(f"/proc/{pid}/status").read_text())


class LoadClients:
    """`bench.prepare_load` processes that make the concurrent calls: their CPU and GIL are not the plugin's
    (nor the benchmark's). `procs` processes, each with threads for an equal share of `concurrency` callers."""

    def __init__(self, socket: Path, kubeconfig: Path, concurrency: int, procs: int) -> None:
        self.concurrency = concurrency
        self.procs: list[subprocess.Popen[str]] = []
        threads = str(-(-concurrency // procs))
        argv = [sys.executable, "-m", "bench.prepare_load", "--socket", str(socket), "--kubeconfig", str(kubeconfig)]
        try:
            for _ in range(procs):
                self.procs.append(
                    subprocess.Popen(
                        [*argv, "--threads", threads],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                )
            for proc in self.procs:
                assert proc.stdout is not None
                if json.loads(proc.stdout.readline() or "{}").get("ready") is not True:
                    raise RuntimeError("a load client did not start")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for proc in self.procs:
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()

    def __enter__(self) -> LoadClients:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _round(self, commands: list[dict[str, Any]]) -> tuple[list[float], float]:
        """Send one command to each client at once; every call's latency and the round's wall time."""
        for proc, command in zip(self.procs, commands, strict=True):
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(command) + "\n")
            proc.stdin.flush()
        calls: list[list[float]] = []
        for proc in self.procs:
            assert proc.stdout is not None
            reply = json.loads(proc.stdout.readline())
            if reply["errors"]:
                raise RuntimeError(f"load client: {reply['errors'][0]}")
            calls += reply["calls"]
        return [end - start for start, end in calls], max(e for _, e in calls) - min(s for s, _ in calls)

    def claims(self, op: str, refs: list[Any]) -> tuple[list[float], float]:
        """Each claim in its own NodePrepareResources / NodeUnprepareResources call, all at once."""
        shares = [refs[i :: len(self.procs)] for i in range(len(self.procs))]
        return self._round([{"op": op, "claims": [[c.namespace, c.name, c.uid] for c in share]} for share in shares])

    def grpc_get(self, path: str, calls: int) -> tuple[list[float], float]:
        """`calls` times (empty NodePrepareResources + GET `path`), spread over every caller thread."""
        per = [calls // len(self.procs) + (i < calls % len(self.procs)) for i in range(len(self.procs))]
        return self._round([{"op": "grpc_get", "path": path, "calls": n} for n in per])


def load_procs(concurrency: int) -> int:
    """How many client processes share `concurrency` callers (BENCH_CLIENT_PROCS; default: 16 callers each)."""
    configured = os.environ.get("BENCH_CLIENT_PROCS")
    return max(1, min(concurrency, int(configured) if configured else -(-concurrency // 16)))


def run() -> dict[str, Any]:
    configure_logging("warning", "text")
    tmp = work_dir("drab-")
    results: dict[str, Any] = {}
    try:
        with api_server_process(tmp) as rest, runtime_dir("drab-run-") as run_dir:
            results["filesystems"] = {"plugin_dir": filesystem(tmp), "cdi_root": filesystem(run_dir)}
            kubeconfig = tmp / "kubeconfig"
            gpus = 16 if SHORT else 64
            nvml = many_gpus_node(tmp / "node.yaml", gpus)
            with plugin_process(tmp / "static", kubeconfig, nvml, MigOffering.STATIC.value, NODE, rest,
                                cdi_root=run_dir / "static") as plugin:
                results["plugin_rss_mib_at_rest"] = proc_rss_mib(plugin.pid)  # published, no claim yet
                with grpc.insecure_channel(f"unix://{plugin.socket}") as channel:
                    stub = pb_grpc.DRAPluginStub(channel)
                    results.update(_floors(stub, rest, plugin.plugin_dir))
                    results["concurrency_1"] = _one_at_a_time(stub, rest, sized(20, 100, 200), gpus, plugin.pid)
                rounds = sized(2, 3, 5)
                for concurrency in (16, 64):
                    if concurrency > gpus:
                        continue
                    with LoadClients(plugin.socket, kubeconfig, concurrency, load_procs(concurrency)) as load:
                        results.update(_floor_rate(load, rest, concurrency, rounds))
                        results[f"concurrency_{concurrency}"] = _concurrent(load, rest, concurrency, rounds, plugin.pid)
                results["client_processes"] = {str(c): load_procs(c) for c in (16, 64) if c <= gpus}
                results["plugin_rss_mib_after"] = proc_rss_mib(plugin.pid)
            results.update(_mig_vs_full(tmp / "mig", kubeconfig, rest, run_dir / "mig"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results["summary"] = summary_rows(results)
    results["goals"] = goal_rows(results)
    return results


def _one_at_a_time(stub: Any, rest: KubeRest, count: int, gpus: int, pid: int) -> dict[str, Any]:
    """One claim at a time from this process, as a kubelet with one pod starting would call."""
    prep, unprep = [], []
    refs = _claims([_claim(rest, f"c1-{i}", f"gpu-{i % gpus}") for i in range(count)])
    start, cpu, system = time.perf_counter(), proc_cpu_s(pid), proc_system_cpu_s(pid)
    prep_cpu = unprep_cpu = 0.0
    for ref in refs:
        before = proc_cpu_s(pid)
        prep.append(time_prepare(stub, ref))
        between = proc_cpu_s(pid)
        unprep.append(time_unprepare(stub, ref))
        prep_cpu += between - before
        unprep_cpu += proc_cpu_s(pid) - between
    wall = time.perf_counter() - start
    return {
        "plugin_cpu_ms_per_claim": round((proc_cpu_s(pid) - cpu) / count * 1000, 3),  # prepare + unprepare
        "plugin_system_cpu_ms_per_claim": round((proc_system_cpu_s(pid) - system) / count * 1000, 3),  # of it
        # Split by operation (clock ticks of 10 ms, summed over many calls; the background threads' CPU in
        # between falls into whichever call it ran beside).
        "plugin_cpu_ms_per_prepare": round(prep_cpu / count * 1000, 3),
        "plugin_cpu_ms_per_unprepare": round(unprep_cpu / count * 1000, 3),
        "prepare": summary_ms(prep),
        "unprepare": summary_ms(unprep),
        "prepare_claims_per_s": round(count / sum(prep), 1),
        "unprepare_claims_per_s": round(count / sum(unprep), 1),
        "wall_s": round(wall, 3),
    }


def _concurrent(load: LoadClients, rest: KubeRest, concurrency: int, rounds: int, pid: int) -> dict[str, Any]:
    """`rounds` times: `concurrency` claims on distinct GPUs prepared at once, then unprepared at once."""
    prep: list[float] = []
    unprep: list[float] = []
    prep_wall = unprep_wall = prep_cpu = unprep_cpu = 0.0
    total, system = proc_cpu_s(pid), proc_system_cpu_s(pid)
    for r in range(rounds):
        refs = _claims([_claim(rest, f"c{concurrency}-{r}-{i}", f"gpu-{i}") for i in range(concurrency)])
        cpu = proc_cpu_s(pid)
        latencies, wall = load.claims("prepare", refs)
        prep_cpu += proc_cpu_s(pid) - cpu
        prep += latencies
        prep_wall += wall
        cpu = proc_cpu_s(pid)
        latencies, wall = load.claims("unprepare", refs)
        unprep_cpu += proc_cpu_s(pid) - cpu
        unprep += latencies
        unprep_wall += wall
    total = settled_cpu_s(pid) - total
    system = proc_system_cpu_s(pid) - system
    return {
        "plugin_cpu_ms_per_prepare": round(prep_cpu / len(prep) * 1000, 3),
        "plugin_cpu_ms_per_unprepare": round(unprep_cpu / len(unprep) * 1000, 3),
        # Prepare + unprepare + the background work they bring (status.devices writes, usage passes), which the two
        # windows above split by when it ran: the figure to compare trees by.
        "plugin_cpu_ms_per_claim": round(total / len(prep) * 1000, 3),
        "plugin_system_cpu_ms_per_claim": round(system / len(prep) * 1000, 3),  # the kernel's part of it
        "prepare": summary_ms(prep),
        "unprepare": summary_ms(unprep),
        "prepare_claims_per_s": round(len(prep) / prep_wall, 1),
        "unprepare_claims_per_s": round(len(unprep) / unprep_wall, 1),
    }


def _floors(stub: Any, rest: KubeRest, plugin_dir: Path) -> dict[str, Any]:
    """The parts a prepare cannot avoid, measured from this process against the same socket, server and disk."""
    n = sized(50, 200, 500)
    grpc_s = []
    for _ in range(n):
        t = time.perf_counter()
        stub.NodePrepareResources(pb.NodePrepareResourcesRequest(), timeout=10)
        grpc_s.append(time.perf_counter() - t)
    path = _claim_path(_claim(rest, "floor-get", "gpu-0"))
    get_s = []
    for _ in range(n):
        t = time.perf_counter()
        rest.get(path)
        get_s.append(time.perf_counter() - t)
    write_s = []
    target = plugin_dir / "floor-write.json"
    payload = b"x" * 2048  # about one claim's checkpoint or CDI spec
    for _ in range(n // 2):
        t = time.perf_counter()
        atomic_write(target, payload)
        write_s.append(time.perf_counter() - t)
    target.unlink()
    out: dict[str, Any] = {
        "grpc_round_trip_floor": summary_ms(grpc_s),
        "claim_get_floor": summary_ms(get_s),
        "fsynced_write_floor": summary_ms(write_s),
    }
    # One caller: the fixed costs back to back (empty gRPC call + GET), as the one-at-a-time claims run.
    start = time.perf_counter()
    for _ in range(n // 5):
        stub.NodePrepareResources(pb.NodePrepareResourcesRequest(), timeout=10)
        rest.get(path)
    out["grpc_get_per_s_floor_1"] = round((n // 5) / (time.perf_counter() - start), 1)
    out["grpc_per_s_floor_1"] = round(len(grpc_s) / sum(grpc_s), 1)
    return out


def _floor_rate(load: LoadClients, rest: KubeRest, concurrency: int, rounds: int) -> dict[str, Any]:
    """What the path's fixed costs allow at this concurrency, from the same client processes as the claims:
    `concurrency` callers, each an empty gRPC call and a GET (the writes of concurrent claims share fsyncs and
    overlap; they are left out of this rate)."""
    path = _claim_path(_claim(rest, f"floor-get-{concurrency}", "gpu-0"))
    out = {}
    for key, get in (("grpc_get_per_s_floor", path), ("grpc_per_s_floor", "")):
        calls, wall = 0, 0.0
        for _ in range(rounds):
            latencies, elapsed = load.grpc_get(get, concurrency)
            calls += len(latencies)
            wall += elapsed
        out[f"{key}_{concurrency}"] = round(calls / wall, 1)
    return out


def _claim_path(claim: dict[str, Any]) -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{claim['metadata']['name']}"


def summary_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per figure: its value, its floor (from the floors of the same run) and the ratio."""
    rows: list[dict[str, Any]] = []

    def floor(pct: str, writes: int, get: bool = True) -> float:
        total = results["grpc_round_trip_floor"][pct] + writes * results["fsynced_write_floor"][pct]
        return float(total + (results["claim_get_floor"][pct] if get else 0.0))

    def row(figure: str, value: float, floor_value: float, unit: str) -> None:
        ratio = round(value / floor_value, 2) if floor_value else float("nan")
        rows.append(
            {"figure": figure, "value": round(value, 3), "floor": round(floor_value, 3), "unit": unit, "ratio": ratio}
        )

    for name, label in (
        ("grpc_round_trip_floor", "gRPC round trip"),
        ("claim_get_floor", "claim GET"),
        ("fsynced_write_floor", "fsynced atomic write"),
    ):
        for pct in ("p50_ms", "p99_ms"):
            row(f"floor: {label} {pct[:3]}", results[name][pct], results[name][pct], "ms")
    for key in ("concurrency_1", "single_full-gpu", "single_mig-1g", "concurrency_16", "concurrency_64"):
        if key not in results:
            continue
        # On the dynamic-MIG node (single_*) a prepare may change the hardware (MIG mode, instances): PrepareStarted
        # is written first; releasing a MIG instance writes UnprepareStarted first.
        hw_prepare = key.startswith("single_")
        hw_unprepare = key.startswith("single_mig")
        for op, writes, get in (
            ("prepare", WRITES_PER_PREPARE + hw_prepare, True),
            ("unprepare", WRITES_PER_UNPREPARE + hw_unprepare, False),
        ):
            for pct in ("p50_ms", "p99_ms"):
                row(f"{key} {op} {pct[:3]}", results[key][op][pct], floor(pct, writes, get), "ms")
        conc = key.rsplit("_", 1)[1]
        for op, floor_key in (("prepare", "grpc_get_per_s_floor"), ("unprepare", "grpc_per_s_floor")):
            if f"{op}_claims_per_s" not in results[key]:
                continue
            # The rate of the fixed costs alone at the same concurrency, from the same callers: gRPC + GET for a
            # prepare, the gRPC call alone for an unprepare.
            best = float(results.get(f"{floor_key}_{conc}", float("nan")))
            value = results[key][f"{op}_claims_per_s"]
            rows.append(
                {
                    "figure": f"{key} {op} claims/s",
                    "value": value,
                    "floor": round(best, 1),
                    "unit": "claims/s",
                    "ratio": round(best / value, 2) if value else float("nan"),
                }
            )
    return rows


# Issue 22's goals for this bench's figures: (figure, where in the results, goal, True when lower is better).
GOALS: tuple[tuple[str, tuple[str, ...], float, bool], ...] = (
    ("plugin CPU ms per prepare, 1 at a time", ("concurrency_1", "plugin_cpu_ms_per_prepare"), 2.0, True),
    ("plugin CPU ms per prepare, 64 concurrent", ("concurrency_64", "plugin_cpu_ms_per_prepare"), 2.0, True),
    ("plugin CPU ms per unprepare, 64 concurrent", ("concurrency_64", "plugin_cpu_ms_per_unprepare"), 2.0, True),
    ("prepare claims/s, 64 concurrent", ("concurrency_64", "prepare_claims_per_s"), 500.0, False),
    ("unprepare claims/s, 64 concurrent", ("concurrency_64", "unprepare_claims_per_s"), 500.0, False),
    ("prepare p50 / floor, 1 at a time", ("ratio", "concurrency_1 prepare p50"), 1.5, True),
    ("prepare p99 / floor, 1 at a time", ("ratio", "concurrency_1 prepare p99"), 2.0, True),
    ("plugin RSS MiB at rest", ("plugin_rss_mib_at_rest",), 60.0, True),
)


def goal_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each goal of issue 22 that this bench measures, its value in this run and whether it is met. CPU and RSS are
    meaningful on a busy machine; rates and ratios only on a quiet one."""
    ratios = {r["figure"]: r["ratio"] for r in results.get("summary") or summary_rows(results)}
    rows = []
    for figure, where, goal, lower in GOALS:
        value: Any = ratios.get(where[1]) if where[0] == "ratio" else results
        if where[0] != "ratio":
            for key in where:
                value = value.get(key) if isinstance(value, dict) else None
        if not isinstance(value, int | float):
            continue
        rows.append({"figure": figure, "value": value, "goal": goal, "met": value <= goal if lower else value >= goal})
    return rows


def format_goals(rows: list[dict[str, Any]]) -> str:
    header = f"{'goal (issue 22)':<44} {'value':>9} {'goal':>7}  met"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['figure']:<44} {r['value']:>9} {r['goal']:>7}  {'yes' if r['met'] else 'no'}")
    return "\n".join(lines)


def format_summary(rows: list[dict[str, Any]]) -> str:
    header = f"{'figure':<36} {'value':>10} {'floor':>10} {'ratio':>6}  unit"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['figure']:<36} {r['value']:>10} {r['floor']:>10} {r['ratio']:>6}  {r['unit']}")
    return "\n".join(lines)


def _claim(rest: KubeRest, name: str, device: str, pool: str = NODE) -> dict[str, Any]:
    """An allocated claim reserved for a pod (as the scheduler leaves it before the kubelet prepares it)."""
    return create_allocated_claim(
        rest, namespace="default", name=name, driver=DRIVER, pool=pool, devices=[device], reserved_for=f"pod-{name}"
    )


def _timed_call(method: Any, request_type: Any, claim: Any) -> float:
    """Seconds one single-claim call takes; a per-claim error aborts the benchmark."""
    t = time.perf_counter()
    resp = method(request_type(claims=[claim]), timeout=30)
    elapsed = time.perf_counter() - t
    if resp.claims[claim.uid].error:
        raise RuntimeError(resp.claims[claim.uid].error)
    return elapsed


def time_prepare(stub: Any, claim: Any) -> float:
    return _timed_call(stub.NodePrepareResources, pb.NodePrepareResourcesRequest, claim)


def time_unprepare(stub: Any, claim: Any) -> float:
    return _timed_call(stub.NodeUnprepareResources, pb.NodeUnprepareResourcesRequest, claim)


def _mig_vs_full(work: Path, kubeconfig: Path, rest: KubeRest, cdi_root: Path) -> dict[str, Any]:
    """One GPU at a time on a dynamic-MIG node (its own plugin process): a 1g MIG claim (enable MIG, create GI + CI,
    find the UUID) vs a whole-GPU claim (MIG-mode check, PrepareStarted)."""
    out: dict[str, Any] = {}
    nvml = "fake:dgx-h100"  # in memory: the plugin is its only user
    work.mkdir(parents=True, exist_ok=True)
    with (
        plugin_process(work, kubeconfig, nvml, MigOffering.DYNAMIC.value, MIG_NODE, rest, cdi_root=cdi_root) as plugin,
        grpc.insecure_channel(f"unix://{plugin.socket}") as channel,
    ):
        stub = pb_grpc.DRAPluginStub(channel)
        rounds = sized(5, 10, 40)
        for label, device in (
            ("full-gpu", "gpu-1"),
            ("mig-1g", "gpu-0-mig-1g10gb-19-6"),
            ("mig-3g", "gpu-2-mig-3g40gb-9-4"),
        ):
            prep, unprep = [], []
            for r in range(rounds):
                ref = _claims([_claim(rest, f"{label}-{r}", device, MIG_NODE)])[0]
                prep.append(time_prepare(stub, ref))
                unprep.append(time_unprepare(stub, ref))
            out[f"single_{label}"] = {"prepare": summary_ms(prep), "unprepare": summary_ms(unprep)}
    return out


if __name__ == "__main__":
    figures = run()
    emit(TITLE, figures)
    print("== summary (ratio = value / floor; for claims/s, floor rate / value)")
    print(format_summary(figures["summary"]))
    print("== goals (CPU and RSS hold on a busy machine; rates and ratios need a quiet one)")
    print(format_goals(figures["goals"]))
