"""A one-node sandbox cluster (API server, kubelet simulator, real plugin process) shared by a module."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_driver.observability.logging import configure_logging
from dra_driver.sandbox.cluster import ClusterConfig, NodeSpec, SandboxCluster
from dra_driver.sandbox.kubelet.draclient import ClaimRef, DraClient

DRIVER = "gpu.dra.dev"
NODE = "node-a"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SandboxCluster]:
    configure_logging("warning", "text")
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra-it-"))
    config = ClusterConfig(work_dir=work, nodes=[NodeSpec(NODE, "fake:dgx-h100")], runtime="cdi-check")
    with SandboxCluster(config) as c:
        yield c
    shutil.rmtree(work, ignore_errors=True)


def allocated_claim(
    cluster: SandboxCluster, devices: list[str], namespace: str = "default", config: list[Any] | None = None
) -> ClaimRef:
    """A ResourceClaim allocated to `devices` on NODE, written straight into the API (no scheduler)."""
    name = f"c-{uuid.uuid4().hex[:10]}"
    claim = cluster.api.request(
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims",
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "devices": {
                    "requests": [{"name": f"r{i}", "exactly": {"deviceClassName": DRIVER}} for i in range(len(devices))]
                }
            },
        },
    )
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": f"r{i}", "driver": DRIVER, "pool": NODE, "device": d} for i, d in enumerate(devices)
                ],
                "config": config or [],
            }
        }
    }
    cluster.api.request(
        "PUT", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}/status", body=claim
    )
    return ClaimRef(namespace=namespace, name=name, uid=claim["metadata"]["uid"])


def dra_client(cluster: SandboxCluster, service: str = "v1.DRAPlugin") -> tuple[grpc.Channel, DraClient]:
    plugin = cluster.plugins[NODE]
    channel = grpc.insecure_channel(f"unix://{plugin.plugin_dir / 'dra.sock'}")
    return channel, DraClient(channel, service, timeout_s=20)


def restart_plugin(cluster: SandboxCluster, extra_env: dict[str, str] | None = None) -> None:
    plugin = cluster.plugins[NODE]
    plugin.stop()
    plugin.start(extra_env)
    plugin.wait_serving()


def spec_files(cluster: SandboxCluster, uid: str) -> list[Path]:
    return sorted(cluster.cdi_root.glob(f"k8s.{DRIVER}-claim_{NODE}_{uid}.json"))


def checkpoint(cluster: SandboxCluster) -> Any:
    from dra_driver.plugin.checkpoint import decode

    path = cluster.plugins[NODE].plugin_dir / "checkpoint.json"
    return decode(path.read_bytes()) if path.exists() else None
