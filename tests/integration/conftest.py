"""Sandbox clusters for the integration tests (API server, kubelet simulator, real plugin processes) and the
objects the tests put into them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.observability.logging import configure_logging
from dra_sandbox.cluster import ClusterConfig, NodeSpec, SandboxCluster
from dra_sandbox.kubelet.draclient import ClaimRef, DraClient
from dra_sandbox.objects import create_allocated_claim

NODE = "node-a"


@contextmanager
def sandbox(prefix: str, nodes: list[NodeSpec], **settings: Any) -> Iterator[SandboxCluster]:
    """A started cluster in a short /tmp work dir (unix socket paths stay under 108 bytes), removed afterwards.
    `settings` are further ClusterConfig fields; the runtime defaults to the CDI check (no containers)."""
    configure_logging("warning", "text")
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix=prefix))
    try:
        with SandboxCluster(ClusterConfig(work_dir=work, nodes=nodes, **{"runtime": "cdi-check", **settings})) as c:
            yield c
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[SandboxCluster]:
    with sandbox("dra-it-", [NodeSpec(NODE, "fake:dgx-h100")]) as c:
        yield c


def claim_object(name: str, device_class: str = DRIVER_NAME, selector: str | None = None) -> dict[str, Any]:
    """A ResourceClaim in `default` with one request `gpu` for one device of the class."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if selector is not None:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def explained(kubeconfig: Path, name: str, namespace: str = "default") -> str:
    """What `dra-driver explain <namespace>/<name>` prints against the API server of `kubeconfig` (DeviceTaintRules
    included): the per-node reason that kube-scheduler's Pending message ("cannot allocate all claims") leaves out."""
    done = subprocess.run(
        [sys.executable, "-m", "dra_driver.cli", "explain", f"{namespace}/{name}", "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.stdout, f"explain printed nothing (exit {done.returncode}): {done.stderr}"
    return done.stdout


def pod_object(name: str, claim: str, restart_policy: str = "Always") -> dict[str, Any]:
    """A pod in `default` whose one container uses ResourceClaim `claim` (as pod claim `gpu`)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": restart_policy,
            "containers": [{"name": "main", "image": "busybox:1.36", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }


def allocated_claim(
    cluster: SandboxCluster, devices: list[str], namespace: str = "default", config: list[Any] | None = None
) -> ClaimRef:
    """A ResourceClaim allocated to `devices` on NODE, written straight into the API (no scheduler)."""
    name = f"c-{uuid.uuid4().hex[:10]}"
    claim = create_allocated_claim(
        cluster.api, namespace=namespace, name=name, driver=DRIVER_NAME, pool=NODE, devices=devices, config=config or ()
    )
    return ClaimRef(namespace=namespace, name=name, uid=claim["metadata"]["uid"])


def dra_client(cluster: SandboxCluster, service: str = "v1.DRAPlugin") -> tuple[grpc.Channel, DraClient]:
    plugin = cluster.plugins[NODE]
    channel = grpc.insecure_channel(f"unix://{plugin.sockets.dra}")
    return channel, DraClient(channel, service, timeout_s=20)


def restart_plugin(cluster: SandboxCluster, extra_env: dict[str, str] | None = None) -> None:
    plugin = cluster.plugins[NODE]
    plugin.stop()
    plugin.start(extra_env)
    plugin.wait_serving()


def spec_files(cluster: SandboxCluster, uid: str) -> list[Path]:
    return sorted(cluster.cdi_root.glob(f"k8s.{DRIVER_NAME}-claim_{NODE}_{uid}.json"))


def checkpoint(cluster: SandboxCluster) -> Any:
    from dra_driver.kubeletplugin.claimrecord import decode_checkpoint
    from dra_driver.plugin.checkpoint import GPU_RECORDS

    path = cluster.plugins[NODE].plugin_dir / "checkpoint.json"
    return decode_checkpoint(path.read_bytes(), GPU_RECORDS) if path.exists() else None
