"""Prepare/unprepare of shared GPUs vs a whole GPU, over the plugin's real unix socket (fake dgx-h100, 8 GPUs,
sharing mode `shares`).

- whole GPU: nothing but the checkpoint and the CDI spec;
- an MPS claim (`sharing.strategy: MPS`): + MPS directories, compute mode, daemon start (the fake daemon lives in
  the fake NVML state file, so this measures the plugin's own work, not `nvidia-cuda-mps-control`);
- a share (consumable capacity): + the per-GPU daemon re-limited to its shares;
- 64 concurrent share claims spread over the 8 GPUs (8 shares per GPU): claims/s.

    .venv/bin/python -m bench.sharing_bench
    BENCH_SHORT=1 .venv/bin/python -m bench.sharing_bench
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from bench.common import SHORT, emit, summary_ms
from bench.prepare_bench import bench_plugin, time_prepare, time_unprepare
from dra_driver import defaults
from dra_driver._gen import dra_v1_pb2 as pb
from dra_driver._gen import dra_v1_pb2_grpc as pb_grpc
from dra_driver.inventory.catalog import MigOffering
from dra_driver.inventory.sharing import SharingMode, SharingSettings
from dra_driver.k8s.client import KubeRest
from dra_driver.observability.logging import configure_logging
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.objects import create_allocated_claim

DRIVER = defaults.DRIVER_NAME
NODE = "bench-node"
GPUS = 8
MPS_CONFIG: list[Any] = [
    {
        "source": "FromClaim",
        "requests": [],
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "gpu.dra.dev/v1beta1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}},
            },
        },
    }
]


def _claim(rest: KubeRest, device: str, config: list[Any] | None = None, share: tuple[str, str] | None = None) -> Any:
    name = f"b-{uuid.uuid4().hex[:12]}"
    fields = []
    if share is not None:
        fields.append({"shareID": str(uuid.uuid4()), "consumedCapacity": {"memory": share[0], "compute": share[1]}})
    stored = create_allocated_claim(
        rest,
        namespace="default",
        name=name,
        driver=DRIVER,
        pool=NODE,
        devices=[device],
        config=config or [],
        result_fields=fields,
    )
    return pb.Claim(namespace="default", name=name, uid=stored["metadata"]["uid"])


def _sequential(stub: Any, rest: KubeRest, rounds: int, **claim: Any) -> dict[str, Any]:
    prep, unprep = [], []
    for _ in range(rounds):
        ref = _claim(rest, **claim)
        prep.append(time_prepare(stub, ref))
        unprep.append(time_unprepare(stub, ref))
    return {"prepare": summary_ms(prep), "unprepare": summary_ms(unprep)}


def _concurrent_shares(stub: Any, rest: KubeRest, rounds: int) -> dict[str, Any]:
    prep, unprep, wall = [], [], 0.0
    for _ in range(rounds):
        refs = [_claim(rest, f"gpu-{i % GPUS}-shared", share=("8Gi", "12")) for i in range(64)]
        start = time.perf_counter()
        with ThreadPoolExecutor(64) as pool:
            prep += list(pool.map(lambda c: time_prepare(stub, c), refs))
        wall += time.perf_counter() - start
        with ThreadPoolExecutor(64) as pool:
            unprep += list(pool.map(lambda c: time_unprepare(stub, c), refs))
    return {
        "prepare": summary_ms(prep),
        "unprepare": summary_ms(unprep),
        "prepare_claims_per_s": round(len(prep) / wall, 1),
    }


def run() -> dict[str, Any]:
    configure_logging("warning", "text")
    tmp = Path(tempfile.mkdtemp(dir="/tmp", prefix="drash-"))
    results: dict[str, Any] = {}
    try:
        with ApiServer() as srv:
            rest = srv.rest()
            plugin = bench_plugin(
                tmp,
                f"fake:dgx-h100,state={tmp / 'nvml-state.json'}",
                rest,
                MigOffering.STATIC,
                SharingSettings(SharingMode.SHARES),
            )
            channel = grpc.insecure_channel(f"unix://{plugin.server.dra_socket}")
            stub = pb_grpc.DRAPluginStub(channel)
            rounds = 10 if SHORT else 100
            results["whole_gpu"] = _sequential(stub, rest, rounds, device="gpu-0")
            results["mps_claim"] = _sequential(stub, rest, rounds, device="gpu-1", config=MPS_CONFIG)
            results["mps_share"] = _sequential(stub, rest, rounds, device="gpu-2-shared", share=("20Gi", "30"))
            results["concurrency_64_shares_over_8_gpus"] = _concurrent_shares(stub, rest, 1 if SHORT else 5)
            channel.close()
            plugin.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results


if __name__ == "__main__":
    emit("sharing: whole GPU vs MPS claim vs MPS share (fake dgx-h100, shares on)", run())
