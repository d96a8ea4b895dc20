"""Prepare/unprepare latency and throughput of the kubelet plugin, over its real unix socket.

Path measured: kubelet-style gRPC call -> engine -> GET ResourceClaim over HTTP from the sandbox API
server (its own process, as on a node) -> durable writes (checkpoint records, CDI spec) -> response.

Every figure is printed beside its floor, measured in the same run: the bare gRPC round trip (an empty
NodePrepareResources over the same socket), a GET of a ResourceClaim from the same server, and one fsynced atomic
write (`dra_driver.fsutil.atomic_write`) in the plugin's directory. A prepare's floor is gRPC + GET + the durable
writes crash safety needs for it (`WRITES_PER_PREPARE`); an unprepare's is gRPC + its writes (no GET).

    .venv/bin/python -m bench.prepare_bench          # full
    BENCH_SHORT=1 .venv/bin/python -m bench.prepare_bench
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from bench.common import SHORT, emit, many_gpus_node, rss_mib, summary_ms
from dra_driver import defaults
from dra_driver._gen import dra_v1_pb2 as pb
from dra_driver._gen import dra_v1_pb2_grpc as pb_grpc
from dra_driver.fsutil import atomic_write
from dra_driver.inventory.catalog import MigPolicy
from dra_driver.inventory.sharing import EXCLUSIVE, SharingPolicy
from dra_driver.k8s.client import KubeRest, connect
from dra_driver.nvml.factory import open_backend, open_mps_control
from dra_driver.observability.logging import configure_logging
from dra_driver.plugin.app import KubeletPlugin, PluginSettings
from dra_sandbox.objects import create_allocated_claim

DRIVER = defaults.DRIVER_NAME
NODE = "bench-node"
# Durable (fsynced) writes a whole-GPU prepare needs: the claim's CDI spec and the PrepareCompleted record. A
# device whose preparation touches hardware (MIG, time-slice, MPS) also needs PrepareStarted first.
WRITES_PER_PREPARE = 2
# A whole-GPU unprepare: the CDI spec's removal and the record's removal (UnprepareStarted first when it releases
# hardware).
WRITES_PER_UNPREPARE = 2


@contextlib.contextmanager
def api_server_process(work: Path) -> Iterator[KubeRest]:
    """`dra-sandbox apiserver` in its own process (so it does not compete with the plugin for the GIL); yields a
    client from the kubeconfig it writes."""
    kubeconfig = work / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dra_sandbox", "apiserver", "--kubeconfig-out", str(kubeconfig)],
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
        yield connect(str(kubeconfig))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def bench_plugin(
    tmp: Path, nvml_spec: str, rest: KubeRest, policy: MigPolicy, sharing: SharingPolicy = EXCLUSIVE
) -> KubeletPlugin:
    """A started in-process kubelet plugin on fake NVML (no publishing); with shares, MPS served by the fake."""
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
        mig_policy=policy,
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


def run() -> dict[str, Any]:
    configure_logging("warning", "text")
    tmp = Path(tempfile.mkdtemp(dir="/tmp", prefix="drab-"))
    results: dict[str, Any] = {}
    try:
        with api_server_process(tmp) as rest:
            gpus = 16 if SHORT else 64
            plugin = bench_plugin(tmp, many_gpus_node(tmp / "node.yaml", gpus), rest, MigPolicy.STATIC)
            channel = grpc.insecure_channel(f"unix://{plugin.server.dra_socket}")
            stub = pb_grpc.DRAPluginStub(channel)
            results.update(_floors(stub, rest, tmp / "p"))
            rounds = 2 if SHORT else 5
            for concurrency in (1, 16, 64):
                if concurrency > gpus:
                    continue
                prep, unprep = [], []
                wall = 0.0
                for r in range(rounds):
                    claims = [
                        create_allocated_claim(
                            rest,
                            namespace="default",
                            name=f"c{concurrency}-{r}-{i}",
                            driver=DRIVER,
                            pool=NODE,
                            devices=[f"gpu-{i}"],
                        )
                        for i in range(concurrency)
                    ]
                    refs = _claims(claims)

                    start = time.perf_counter()
                    with ThreadPoolExecutor(concurrency) as pool:
                        prep += list(pool.map(lambda c: time_prepare(stub, c), refs))
                    wall += time.perf_counter() - start
                    with ThreadPoolExecutor(concurrency) as pool:
                        unprep += list(pool.map(lambda c: time_unprepare(stub, c), refs))
                results[f"concurrency_{concurrency}"] = {
                    "prepare": summary_ms(prep),
                    "unprepare": summary_ms(unprep),
                    "prepare_claims_per_s": round(len(prep) / wall, 1),
                }
            channel.close()
            plugin.stop()
            results["rss_mib_after"] = rss_mib()
            results.update(_mig_vs_full(tmp, rest))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results["summary"] = summary_rows(results)
    return results


def _floors(stub: Any, rest: KubeRest, plugin_dir: Path) -> dict[str, Any]:
    """The parts a prepare cannot avoid, measured against the same socket, server and disk."""
    n = 50 if SHORT else 500
    grpc_s = []
    for _ in range(n):
        t = time.perf_counter()
        stub.NodePrepareResources(pb.NodePrepareResourcesRequest(), timeout=10)
        grpc_s.append(time.perf_counter() - t)
    claim = create_allocated_claim(
        rest, namespace="default", name="floor-get", driver=DRIVER, pool=NODE, devices=["gpu-0"]
    )
    path = f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{claim['metadata']['name']}"
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
    for conc in (1, 16, 64):
        # What the path's fixed costs allow at this concurrency: `conc` callers, each an empty gRPC call and a
        # GET (the writes of concurrent claims share fsyncs and overlap; they are left out of this rate).
        def both(_: int) -> None:
            stub.NodePrepareResources(pb.NodePrepareResourcesRequest(), timeout=10)
            rest.get(path)

        rounds = 2 if SHORT else 5
        start = time.perf_counter()
        with ThreadPoolExecutor(conc) as pool:
            for _ in range(rounds):
                list(pool.map(both, range(conc)))
        out[f"grpc_get_per_s_floor_{conc}"] = round(conc * rounds / (time.perf_counter() - start), 1)
    return out


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
        if "prepare_claims_per_s" in results[key]:
            conc = int(key.rsplit("_", 1)[1])
            best = float(results.get(f"grpc_get_per_s_floor_{conc}", float("nan")))
            value = results[key]["prepare_claims_per_s"]
            rows.append(
                {
                    "figure": f"{key} prepare claims/s",
                    "value": value,
                    "floor": round(best, 1),
                    "unit": "claims/s",
                    "ratio": round(best / value, 2) if value else float("nan"),
                }
            )
    return rows


def format_summary(rows: list[dict[str, Any]]) -> str:
    header = f"{'figure':<36} {'value':>10} {'floor':>10} {'ratio':>6}  unit"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['figure']:<36} {r['value']:>10} {r['floor']:>10} {r['ratio']:>6}  {r['unit']}")
    return "\n".join(lines)


def _claim(rest: KubeRest, name: str, device: str) -> dict[str, Any]:
    return create_allocated_claim(rest, namespace="default", name=name, driver=DRIVER, pool=NODE, devices=[device])


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


def _mig_vs_full(tmp: Path, rest: KubeRest) -> dict[str, Any]:
    """One GPU at a time: a 1g MIG claim (enable MIG, create GI + CI, find the UUID) vs a whole-GPU claim."""
    plugin = bench_plugin(tmp / "mig", "fake:dgx-h100", rest, MigPolicy.DYNAMIC)
    channel = grpc.insecure_channel(f"unix://{plugin.server.dra_socket}")
    stub = pb_grpc.DRAPluginStub(channel)
    out: dict[str, Any] = {}
    rounds = 5 if SHORT else 40
    for label, device in (
        ("full-gpu", "gpu-1"),
        ("mig-1g", "gpu-0-mig-1g10gb-19-6"),
        ("mig-3g", "gpu-2-mig-3g40gb-9-4"),
    ):
        prep, unprep = [], []
        for r in range(rounds):
            claim = create_allocated_claim(
                rest, namespace="default", name=f"{label}-{r}", driver=DRIVER, pool=NODE, devices=[device]
            )
            ref = _claims([claim])[0]
            prep.append(time_prepare(stub, ref))
            unprep.append(time_unprepare(stub, ref))
        out[f"single_{label}"] = {"prepare": summary_ms(prep), "unprepare": summary_ms(unprep)}
    channel.close()
    plugin.stop()
    return out


if __name__ == "__main__":
    figures = run()
    emit("prepare/unprepare (fake NVML, sandbox API server in its own process, real unix socket)", figures)
    print("== summary (ratio = value / floor; for claims/s, floor rate / value)")
    print(format_summary(figures["summary"]))
