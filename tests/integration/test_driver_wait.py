"""The plugin started before the NVIDIA driver (issue 26.1) and a corrupt checkpoint (26.5), on the sandbox: real
plugin processes on the fake NVML, whose kernel driver this test loads from outside through the state file (a
second FakeNvml on the same spec and state path), as the GPU Operator's driver container would.

While the driver is absent: no registration socket, no ResourceSlice written or deleted, /readyz and /healthz 503
with the reason, /livez 200, a Node Event NvidiaDriverNotReady and the Node annotation. Once it is loaded: the
plugin registers, publishes and says so (annotation `ready`, Event NvidiaDriverReady)."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.kubeletplugin.nodeevents import CHECKPOINT_QUARANTINED
from dra_driver.nvidiadriver.state import NODE_ANNOTATION
from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.plugin.driverreport import NOT_READY_EVENT, READY_EVENT
from dra_sandbox.cluster import NodeSpec, SandboxCluster, free_tcp_port
from dra_sandbox.polling import socket_accepts
from tests.integration.conftest import NODE, sandbox
from tests.polling import wait_for

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SandboxCluster]:
    with sandbox("dra-dw-", [NodeSpec(NODE, "fake:dgx-h100")]) as c:
        yield c


def node_driver(cluster: SandboxCluster) -> FakeNvml:
    """The node's kernel driver as another process sees it (same spec, same state file)."""
    backend = open_backend(cluster.plugins[NODE].nvml_spec)
    assert isinstance(backend, FakeNvml)
    return backend


def http(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return 0, ""


def answered(result: tuple[int, str]) -> tuple[int, str] | None:
    return result if result[0] else None


def reason_given(result: tuple[int, str]) -> tuple[int, str] | None:
    return result if result[0] and "not checked yet" not in result[1] else None


def not_ready(value: str | None) -> str | None:
    return value if value is not None and value.startswith("not-ready: ") else None


def node_events(cluster: SandboxCluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.items("/api/v1/namespaces/default/events")
            if e["reason"] == reason and e["involvedObject"]["kind"] == "Node" and e["involvedObject"]["name"] == NODE]


def annotation(cluster: SandboxCluster) -> str | None:
    node = cluster.api.get(f"/api/v1/nodes/{NODE}") or {}
    value = ((node.get("metadata") or {}).get("annotations") or {}).get(NODE_ANNOTATION)
    return str(value) if value is not None else None


def start_without_driver(cluster: SandboxCluster, healthz: int, *, fresh: bool = False) -> None:
    """Restart the node's plugin with its driver unloaded, not waiting for it to serve (it must not). `fresh`: its
    pool is wiped first, as on a node that never published."""
    plugin = cluster.plugins[NODE]
    plugin.stop()
    node_driver(cluster).unload_driver()
    if fresh:
        for s in cluster.items(SLICES):
            cluster.api.request("DELETE", f"{SLICES}/{s['metadata']['name']}")
    plugin.start({"DRA_DRIVER_HEALTHZ_PORT": str(healthz), "DRA_DRIVER_DRIVER_WAIT_MAX_INTERVAL": "0.5"})


def test_a_plugin_started_before_the_driver_waits_then_registers_and_publishes(cluster: SandboxCluster) -> None:
    plugin = cluster.plugins[NODE]
    port = free_tcp_port()
    start_without_driver(cluster, port, fresh=True)
    try:
        # /readyz answers from before the first check ("not checked yet"): poll until that check's reason is there.
        code, body = wait_for(lambda: reason_given(http(port, "/readyz")), 30, "the plugin's /readyz with a reason")
        assert code == 503 and body.startswith("driver not ready: ") and "DRIVER_NOT_LOADED" in body
        assert http(port, "/healthz") == (code, body)
        assert http(port, "/livez")[0] == 200  # alive: the kubelet must not restart it
        [event] = wait_for(lambda: node_events(cluster, NOT_READY_EVENT), 30, "the NvidiaDriverNotReady Event")
        assert event["type"] == "Warning" and "DRIVER_NOT_LOADED" in event["message"]
        value = wait_for(lambda: not_ready(annotation(cluster)), 30, "the not-ready annotation")
        assert "DRIVER_NOT_LOADED" in value
        # Waiting: nothing the kubelet could see, nothing published (never an empty slice).
        assert not plugin.sockets.registration.exists() and not socket_accepts(plugin.sockets.dra)
        assert cluster.items(SLICES) == []
        assert plugin.process is not None and plugin.process.poll() is None

        node_driver(cluster).load_driver("580.65.06")
        plugin.wait_serving(30)
        wait_for(lambda: sum(len(s["spec"].get("devices") or []) for s in cluster.items(SLICES)), 30,
                 "the node's devices published")
        wait_for(lambda: annotation(cluster) == "ready", 30, "the ready annotation")
        [ready] = wait_for(lambda: node_events(cluster, READY_EVENT), 30, "the NvidiaDriverReady Event")
        assert ready["type"] == "Normal" and "580.65.06" in ready["message"]
        assert wait_for(lambda: http(port, "/readyz")[0] == 200 or None, 30, "readiness")
        assert len(node_events(cluster, NOT_READY_EVENT)) == 1  # once per reason, not every retry
    finally:
        node_driver(cluster).load_driver()  # the next test starts from a loaded driver
        plugin.stop()
        plugin.start()
        plugin.wait_serving()


def test_a_restart_without_the_driver_leaves_the_published_slices_alone(cluster: SandboxCluster) -> None:
    plugin = cluster.plugins[NODE]
    before = wait_for(lambda: cluster.items(SLICES), 30, "the node's slices")
    versions = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in before}
    port = free_tcp_port()
    start_without_driver(cluster, port)
    try:
        wait_for(lambda: http(port, "/readyz")[0] == 503 or None, 30, "/readyz saying not ready")
        wait_for(lambda: (annotation(cluster) or "").startswith("not-ready: ") or None, 30, "the not-ready annotation")
        after = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in cluster.items(SLICES)}
        assert after == versions  # no write, no delete: the good slices stay for the scheduler
    finally:
        node_driver(cluster).load_driver()
        plugin.wait_serving(30)
    wait_for(lambda: annotation(cluster) == "ready", 30, "the ready annotation")


def test_a_corrupt_checkpoint_is_quarantined_the_plugin_starts_and_a_node_event_names_the_file(
    cluster: SandboxCluster,
) -> None:
    plugin = cluster.plugins[NODE]
    plugin.stop()
    (plugin.plugin_dir / "checkpoint.json").write_bytes(b'{"version": "v9", "claims": {{{ not json')
    plugin.start()
    plugin.wait_serving(30)
    [quarantined] = wait_for(lambda: list(plugin.plugin_dir.glob("checkpoint.json.corrupt-*")), 30,
                             "the quarantined checkpoint")
    [event] = wait_for(lambda: node_events(cluster, CHECKPOINT_QUARANTINED), 30, "the CheckpointQuarantined Event")
    assert event["type"] == "Warning" and str(quarantined) in event["message"]
    assert event["involvedObject"].get("uid")  # kubectl describe node finds it
