"""`dra-driver controller` on the sandbox API server: how long a GpuSharingPolicy takes to become a usable
DeviceClass, and how it converges under API errors.

The controller runs as in the chart (kopf, in a thread of this process, resync 60 s, leader election off),
logging in through a kubeconfig of the sandbox API server. Everything is read back from the server's store
(not over HTTP, so measuring is never faulted).

  sequential      one policy at a time: apply → its DeviceClass exists (`class_s`) and apply → Ready=True
                  observed for this generation (`ready_s`), over N policies;
  burst           N policies applied at once: apply of the first → every class exists / every policy Ready;
  errors_500      a policy is applied while every DeviceClass request and every policy patch of the
                  controller fails with 500 for ERRORS_S seconds; then the errors stop;
  errors_409      the same with 409 for every DeviceClass create and update.
                  `after_errors_s`: end of errors → class correct and Ready=True (the retry backoff is 1, 2,
                  4... s, so this is at most the pending backoff step);
  faults_30pct    the same requests fail at random (p=0.3; 500, or 409 where the API can answer it; seeded)
                  the whole time:
                  apply → converged, faults still on.
  fleet_start     (issue 27 item 4) the slices of N fake nodes (bench/fleet_bench.py's fleet) in a sandbox API
                  server of its own process, one policy counting the H100 GPUs; `dra-driver controller` started
                  as a process of its own: start → the policy's status.devices/nodes are the fleet's
                  (`start_to_counts_s`, the interpreter's start and imports included), the controller's CPU
                  seconds until then, its RSS then and its peak (VmHWM), and the machine's load average beside
                  them. N from CONTROLLER_FLEET_NODES (comma-separated; default 300,1000; 30 with BENCH_SHORT).
                  CONTROLLER_SOURCES=<dir>,  runs the controller of each tree named (a `git archive` of main's
                  dra_driver/ in <dir>; empty: this tree) one after the other on the same server and fleet: a
                  before/after pair.
Figures are printed, never asserted (tests/test_bench_short.py checks that they exist).

    .venv/bin/python -m bench.controller_bench
    BENCH_SHORT=1 .venv/bin/python -m bench.controller_bench
    .venv/bin/python -m bench.controller_bench fleet_start      # only the named phases
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import fleet_bench
from bench.common import SHORT, emit, percentile
from bench.prepare_bench import api_server_process
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.operator import ControllerSettings
from dra_driver.controller.operator import run as run_controller
from dra_driver.k8s.client import KubeRest
from dra_driver.observability.logging import configure_logging
from dra_driver.policy.crd import custom_resource_definition
from dra_sandbox.apiserver import ApiServer, ChaosFaults

DRIVER = "gpu.dra.dev"
POLICIES = "/apis/gpu.dra.dev/v1beta1/gpusharingpolicies"
N = 5 if SHORT else 20
ERRORS_S = 1.0 if SHORT else 5.0
TIMEOUT_S = 90.0
# The controller's own requests: its DeviceClass reads and writes, and kopf's merge patches of the policy
# (status, annotations). 500 can come for any of them; 409 only for the class writes (create: AlreadyExists,
# update: stale resourceVersion): a merge patch without resourceVersion never conflicts on a real API server,
# and kopf does not retry one that does (the event waits for the resync timer).
CLASS_REQUESTS: tuple[tuple[str | None, str], ...] = (
    ("get", "deviceclasses"),
    ("create", "deviceclasses"),
    ("update", "deviceclasses"),
)
POLICY_PATCHES: tuple[tuple[str | None, str], ...] = (
    ("patch", "gpusharingpolicies"),
    ("patch", "gpusharingpolicies/status"),
)


def inject(faults: ChaosFaults, probability: float, status: int | None) -> None:
    """`status` None: 500 or 409 at random where each can happen."""
    for verb, resource in CLASS_REQUESTS:
        conflict = verb in ("create", "update")
        statuses = (status,) if status is not None else (500, 409) if conflict else (500,)
        if status == 409 and not conflict:
            continue
        faults.fail_randomly(probability, statuses, verb=verb, resource=resource)
    if status in (None, 500):
        for verb, resource in POLICY_PATCHES:
            faults.fail_randomly(probability, (500,), verb=verb, resource=resource)


def policy(name: str, pct: int = 50) -> dict[str, Any]:
    return {
        "apiVersion": "gpu.dra.dev/v1beta1",
        "kind": "GpuSharingPolicy",
        "metadata": {"name": name},
        "spec": {
            "devices": {"type": "gpu", "productNames": ["NVIDIA H100 80GB HBM3"]},
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": pct}},
        },
    }


class Cluster:
    def __init__(self, srv: ApiServer, rest: KubeRest, metrics: ControllerMetrics) -> None:
        self.srv = srv
        self.rest = rest
        self.metrics = metrics

    def class_of(self, name: str) -> dict[str, Any] | None:
        return next(
            (c for c in self.srv.snapshot("resource.k8s.io", "deviceclasses") if c["metadata"]["name"] == name), None
        )

    def class_correct(self, name: str, pct: int) -> bool:
        cls = self.class_of(name)
        if cls is None:
            return False
        config = (cls.get("spec") or {}).get("config") or []
        sharing = config[0]["opaque"]["parameters"]["sharing"] if config else {}
        return bool(sharing.get("mpsConfig", {}).get("defaultActiveThreadPercentage") == pct)

    def ready(self, name: str) -> bool:
        obj = next(
            (p for p in self.srv.snapshot("gpu.dra.dev", "gpusharingpolicies") if p["metadata"]["name"] == name), None
        )
        if obj is None:
            return False
        status = obj.get("status") or {}
        cond = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        return bool(
            cond and cond["status"] == "True" and status.get("observedGeneration") == obj["metadata"]["generation"]
        )


@contextmanager
def cluster(faults: ChaosFaults | None = None) -> Iterator[Cluster]:
    with ApiServer(faults=faults) as srv, srv.rest() as rest, tempfile.TemporaryDirectory() as tmp:
        rest.request(
            "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=custom_resource_definition()
        )
        kubeconfig = Path(tmp) / "kubeconfig"
        srv.write_kubeconfig(kubeconfig)
        metrics = ControllerMetrics()
        stop, ready = threading.Event(), threading.Event()
        options = ControllerSettings(
            driver_name=DRIVER,
            kubeconfig=str(kubeconfig),
            healthz_port=-1,
            resync_seconds=60.0,
            watch_timeout_seconds=30,
            stale_slice_grace_seconds=0,
        )
        thread = threading.Thread(
            target=run_controller,
            args=(options,),
            daemon=True,
            kwargs={"stop_flag": stop, "ready_flag": ready, "metrics": metrics},
        )
        thread.start()
        try:
            if not ready.wait(TIMEOUT_S):
                raise RuntimeError("the controller did not start")
            yield Cluster(srv, rest, metrics)
        finally:
            stop.set()
            thread.join(TIMEOUT_S)


def time_until(predicate: Callable[[], bool], start: float) -> float:
    while not predicate():
        if time.monotonic() - start > TIMEOUT_S:
            return float("nan")
        time.sleep(0.002)
    return time.monotonic() - start


def stats(samples: list[float]) -> dict[str, float]:
    return {
        "n": len(samples),
        "p50": round(percentile(samples, 50), 4),
        "p99": round(percentile(samples, 99), 4),
        "max": round(max(samples), 4),
    }


def sequential() -> dict[str, Any]:
    class_s: list[float] = []
    ready_s: list[float] = []
    with cluster() as c:
        for i in range(N):
            name = f"seq-{i}"
            start = time.monotonic()
            c.rest.request("POST", POLICIES, body=policy(name))
            class_s.append(time_until(lambda: c.class_of(name) is not None, start))  # noqa: B023
            ready_s.append(time_until(lambda: c.ready(name), start))  # noqa: B023
    return {"class_s": stats(class_s), "ready_s": stats(ready_s)}


def burst() -> dict[str, Any]:
    with cluster() as c:
        names = [f"burst-{i}" for i in range(N)]
        start = time.monotonic()
        for name in names:
            c.rest.request("POST", POLICIES, body=policy(name))
        classes = time_until(lambda: all(c.class_of(n) is not None for n in names), start)
        ready = time_until(lambda: all(c.ready(n) for n in names), start)
    return {"policies": N, "all_classes_s": round(classes, 4), "all_ready_s": round(ready, 4)}


def errors(status: int) -> dict[str, Any]:
    faults = ChaosFaults(seed=1)
    with cluster(faults) as c:
        inject(faults, 1.0, status)
        start = time.monotonic()
        c.rest.request("POST", POLICIES, body=policy("during-errors", 40))
        while time.monotonic() - start < ERRORS_S:
            time.sleep(0.05)  # the error window itself (not a synchronisation)
        failed = faults.random_failures
        faults.clear()
        ended = time.monotonic()
        after = time_until(lambda: c.class_correct("during-errors", 40) and c.ready("during-errors"), ended)
        return {
            "errors_s": ERRORS_S,
            "failed_requests": failed,
            "after_errors_s": round(after, 4),
            "reconciles": {
                o: c.metrics.value("dra_driver_controller_reconciles_total", {"outcome": o})
                for o in ("ready", "retry", "error")
            },
        }


def random_faults() -> dict[str, Any]:
    samples: list[float] = []
    failed = 0
    for seed in range(1 if SHORT else 5):
        faults = ChaosFaults(seed=seed)
        with cluster(faults) as c:
            inject(faults, 0.3, None)
            start = time.monotonic()
            c.rest.request("POST", POLICIES, body=policy("flaky", 30))
            samples.append(time_until(lambda: c.class_correct("flaky", 30) and c.ready("flaky"), start))
            failed += faults.random_failures
    return {"converged_s": stats(samples), "failed_requests": failed}


def fleet_sizes() -> list[int]:
    raw = os.environ.get("CONTROLLER_FLEET_NODES") or ("30" if SHORT else "300,1000")
    return [int(n) for n in raw.split(",") if n.strip()]


def _proc_status(pid: int) -> dict[str, float]:
    """RSS now and at its peak (MiB), CPU seconds (user + system) of a process."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    out["cpu_s"] = round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)
    return out


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def fleet_start(nodes: int) -> dict[str, Any]:
    """Start → first complete counts of a policy over `nodes` fake nodes, the controller in a process of its own."""
    inventories = fleet_bench._inventories()
    with tempfile.TemporaryDirectory() as tmp, api_server_process(Path(tmp)) as rest:
        kubeconfig = Path(tmp) / "kubeconfig"
        fleet = fleet_bench._publish(rest, inventories, nodes)
        rest.request(
            "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=custom_resource_definition()
        )
        rest.request("POST", POLICIES, body={
            "apiVersion": "gpu.dra.dev/v1beta1", "kind": "GpuSharingPolicy", "metadata": {"name": "fleet-h100"},
            "spec": {"devices": {"type": "gpu", "productNames": [fleet_bench.H100]}},
        })
        h100_nodes = sum(1 for i in range(nodes - 1) if fleet_bench.PRESETS[i % len(fleet_bench.PRESETS)] == "dgx-h100")
        wanted = (len(inventories["dgx-h100"].gpus) * h100_nodes, h100_nodes)
        runs = [_start_to_counts(Path(tmp), rest, kubeconfig, wanted, source)
                for source in (os.environ.get("CONTROLLER_SOURCES") or "").split(",")]
    return {"nodes": nodes, "slices": fleet["slices"], "devices": fleet["devices"], "runs": runs}


def _start_to_counts(
    tmp: Path, rest: KubeRest, kubeconfig: Path, wanted: tuple[int, int], source: str
) -> dict[str, Any]:
    """One controller process (of `source`'s tree; "": this one) from its start until the policy's counts are
    `wanted`; the counts are cleared first (an earlier run's would be right already)."""
    rest.request("PATCH", f"{POLICIES}/fleet-h100/status", body={"status": {"devices": None, "nodes": None}},
                 content_type="application/merge-patch+json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")}
    if source:
        env["PYTHONPATH"] = source
    out: dict[str, Any] = {"source": source or "this tree", "load_before": _load()}
    command = [sys.executable, "-m", "dra_driver.cli", "controller", "--kubeconfig", str(kubeconfig),
               "--healthz-port", "-1", "--stale-slice-grace", "0",
               "--log-level", os.environ.get("CONTROLLER_LOG_LEVEL", "warning")]
    log_path = tmp / "controller.log"
    start = time.monotonic()
    with log_path.open("wb") as log_file:
        # cwd outside the checkout: `-m` puts the working directory first on sys.path, before PYTHONPATH, which
        # would run this tree's controller for every source.
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log_file, cwd=tmp)
    try:
        while True:
            status = (rest.get(f"{POLICIES}/fleet-h100") or {}).get("status") or {}
            if (status.get("devices"), status.get("nodes")) == wanted:
                out["start_to_counts_s"] = round(time.monotonic() - start, 2)
                break
            if proc.poll() is not None or time.monotonic() - start > 900:
                out["start_to_counts_s"] = float("nan")
                out["error"] = log_path.read_text(errors="replace")[-2000:]
                break
            time.sleep(0.02)
        if proc.poll() is None:
            figures = _proc_status(proc.pid)
            out.update(rss_mib=figures["VmRSS"], peak_rss_mib=figures["VmHWM"], cpu_to_counts_s=figures["cpu_s"])
        out["load_after"] = _load()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return out


PHASES: dict[str, Callable[[], Any]] = {
    "sequential": sequential,
    "burst": burst,
    "errors_500": lambda: errors(500),
    "errors_409": lambda: errors(409),
    "faults_30pct": random_faults,
    "fleet_start": lambda: [fleet_start(n) for n in fleet_sizes()],
}


def run(phases: list[str] | None = None) -> dict[str, Any]:
    configure_logging("critical", "text")
    return {name: PHASES[name]() for name in phases or PHASES}


if __name__ == "__main__":
    emit("controller: policy → DeviceClass, and start → first counts over a fleet (sandbox API server)",
         run(sys.argv[1:]))
