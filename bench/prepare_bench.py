"""Prepare/unprepare latency and throughput of the kubelet plugin, over its real unix socket.

Path measured: kubelet-style gRPC call -> engine -> GET ResourceClaim over HTTP from the sandbox API
server -> checkpoint (fsync) -> CDI spec (fsync) -> checkpoint (fsync) -> response. The floor is the
bare gRPC round trip (an empty NodePrepareResources) over the same socket.

    .venv/bin/python -m bench.prepare_bench          # full
    BENCH_SHORT=1 .venv/bin/python -m bench.prepare_bench
"""

from __future__ import annotations

import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from bench.common import SHORT, emit, many_gpus_node, rss_mib, summary_ms
from dra_driver import defaults
from dra_driver._gen import dra_v1_pb2 as pb
from dra_driver._gen import dra_v1_pb2_grpc as pb_grpc
from dra_driver.inventory.catalog import MigPolicy
from dra_driver.k8s.client import KubeRest
from dra_driver.nvml.factory import open_backend
from dra_driver.observability.logging import configure_logging
from dra_driver.plugin.app import KubeletPlugin, PluginSettings
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.objects import create_allocated_claim

DRIVER = defaults.DRIVER_NAME
NODE = "bench-node"


def _plugin(tmp: Path, nvml_spec: str, rest: KubeRest, policy: MigPolicy) -> KubeletPlugin:
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
    )
    plugin = KubeletPlugin(config, nvml=nvml, rest=rest)
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
        with ApiServer() as srv:
            rest = KubeRest(srv.api_client())
            gpus = 16 if SHORT else 64
            plugin = _plugin(tmp, many_gpus_node(tmp / "node.yaml", gpus), rest, MigPolicy.STATIC)
            channel = grpc.insecure_channel(f"unix://{plugin.server.dra_socket}")
            stub = pb_grpc.DRAPluginStub(channel)
            floor = []
            for _ in range(50 if SHORT else 500):
                t = time.perf_counter()
                stub.NodePrepareResources(pb.NodePrepareResourcesRequest(), timeout=10)
                floor.append(time.perf_counter() - t)
            results["grpc_round_trip_floor"] = summary_ms(floor)
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
                        prep += list(pool.map(lambda c: _time_prepare(stub, c), refs))
                    wall += time.perf_counter() - start
                    with ThreadPoolExecutor(concurrency) as pool:
                        unprep += list(pool.map(lambda c: _time_unprepare(stub, c), refs))
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
    return results


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


def _time_prepare(stub: Any, claim: Any) -> float:
    return _timed_call(stub.NodePrepareResources, pb.NodePrepareResourcesRequest, claim)


def _time_unprepare(stub: Any, claim: Any) -> float:
    return _timed_call(stub.NodeUnprepareResources, pb.NodeUnprepareResourcesRequest, claim)


def _mig_vs_full(tmp: Path, rest: KubeRest) -> dict[str, Any]:
    """One GPU at a time: a 1g MIG claim (enable MIG, create GI + CI, find the UUID) vs a whole-GPU claim."""
    plugin = _plugin(tmp / "mig", "fake:dgx-h100", rest, MigPolicy.DYNAMIC)
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
            prep.append(_time_prepare(stub, ref))
            unprep.append(_time_unprepare(stub, ref))
        out[f"single_{label}"] = {"prepare": summary_ms(prep), "unprepare": summary_ms(unprep)}
    channel.close()
    plugin.stop()
    return out


if __name__ == "__main__":
    emit("prepare/unprepare (fake NVML, sandbox API server, real unix socket)", run())
