"""The measuring half of `bench.peer_kubelet_bench` (its doc says what is measured): the real node, the two plugins,
the pods, the scrapes. Separate from the pure half so that its tests and the skip path start nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.peer_kubelet_bench import (
    EXAMPLE,
    OURS,
    PREPARE_OP,
    PREPARE_RPC,
    UNPREPARE_OP,
    UNPREPARE_RPC,
    Figure,
    grpc_call,
    increments,
    operation,
)
from dra_driver.k8s.client import KubeRest
from dra_sandbox.children import terminate
from dra_sandbox.polling import wait_for
from dra_sandbox.upstream.build import DEFAULT_MINOR
from dra_sandbox.upstream.images import BUSYBOX_IMAGE
from dra_sandbox.upstream.node import RealNode, RealNodeSpec
from dra_sandbox.upstream.session import UpstreamCluster

NODE = "node-peer"
NAMESPACE = "peer-kubelet"
EXAMPLE_DRIVER = "gpu.example.com"  # the example driver's gpu profile; its DeviceClass has the same name
EXAMPLE_DEVICES = 8  # as many as the dgx-h100 fake has GPUs
TIMEOUT = 120.0
RUNNING_POLL_S = 0.02
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


@dataclass(frozen=True)
class PodTimes:
    running_s: float  # create -> phase Running first seen


class Probe:
    """One pod with one claim of `device_class`, run to completion and deleted; the kubelet's metrics scraped."""

    def __init__(self, api: KubeRest, device_class: str) -> None:
        self.api, self.device_class = api, device_class

    def scrape(self) -> str:
        return self.api.request_bytes("GET", f"/api/v1/nodes/{NODE}/proxy/metrics").decode()

    def pod(self, name: str) -> PodTimes:
        api = self.api
        before_unprepares = operation(self.scrape(), UNPREPARE_OP).count
        api.request("POST", CLAIMS, body={
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": self.device_class}}]}}})
        start = time.perf_counter()
        api.request("POST", PODS, body={
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                                "command": ["sleep", "1"], "resources": {"claims": [{"name": "gpu"}]}}],
            }})

        def phase() -> str:
            obj = api.get(f"{PODS}/{name}") or {}
            got = str((obj.get("status") or {}).get("phase") or "")
            if got == "Failed":
                raise RuntimeError(f"pod {name} failed: {obj.get('status')}")
            return got

        wait_for(lambda: phase() in ("Running", "Succeeded"), TIMEOUT, f"pod {name} to run",
                 interval=RUNNING_POLL_S)
        running_s = time.perf_counter() - start
        wait_for(lambda: phase() == "Succeeded", TIMEOUT, f"pod {name} to succeed", interval=0.1)
        # The kubelet unprepares a pod's claims once it is terminated (SyncTerminatedPod), before it is deleted.
        wait_for(lambda: operation(self.scrape(), UNPREPARE_OP).count > before_unprepares, TIMEOUT,
                 f"the kubelet to unprepare the claim of pod {name}", interval=0.1)
        api.request("DELETE", f"{PODS}/{name}")
        api.request("DELETE", f"{CLAIMS}/{name}")
        wait_for(lambda: api.get(f"{PODS}/{name}") is None and api.get(f"{CLAIMS}/{name}") is None, TIMEOUT,
                 f"pod and claim {name} to be deleted", interval=0.1)
        return PodTimes(running_s)


def phase(api: KubeRest, label: str, device_class: str, driver: str, pods: int,
          say: Callable[[str], None]) -> dict[str, Any]:
    """`pods` pods one after the other (after one warm-up pod); each figure per pod and over the phase."""
    probe = Probe(api, device_class)
    probe.pod(f"{label}-warm-up")
    load_before = os.getloadavg()
    scrapes = [probe.scrape()]
    running: list[float] = []
    for i in range(pods):
        running.append(probe.pod(f"{label}-{i}").running_s)
        scrapes.append(probe.scrape())
        if (i + 1) % 10 == 0 or i + 1 == pods:
            say(f"bench-peer-kubelet: {label}: {i + 1}/{pods} pods")
    picks: dict[str, Callable[[str], Any]] = {
        PREPARE_OP: lambda text: operation(text, PREPARE_OP),
        UNPREPARE_OP: lambda text: operation(text, UNPREPARE_OP),
        PREPARE_RPC: lambda text: grpc_call(text, driver, PREPARE_RPC),
        UNPREPARE_RPC: lambda text: grpc_call(text, driver, UNPREPARE_RPC),
    }
    rows: dict[str, Any] = {}
    calls_per_pod: dict[str, list[float]] = {}
    for key, pick in picks.items():
        steps = increments(scrapes, pick)
        calls_per_pod[key] = [count for count, _ in steps]
        rows[key] = Figure(tuple(total for _, total in steps), pick(scrapes[-1]) - pick(scrapes[0])).row()
    rows["create_to_running"] = Figure(tuple(running)).row()
    return {"rows": rows, "calls_per_pod": calls_per_pod,
            "loadavg": [[round(x, 2) for x in load_before], [round(x, 2) for x in os.getloadavg()]]}


def start_example(node: RealNode, binary: Path, kubeconfig: Path) -> subprocess.Popen[bytes]:
    """The example driver's kubelet plugin with bench.peer_run's flags (gpu profile, device status, health and
    metrics ports off) but the real kubelet's directories and the node's CDI directory (containerd's)."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["NODE_NAME"] = NODE
    argv = [str(binary), "--node-name", NODE, "--cdi-root", str(node.cdi_dir), "--num-devices", str(EXAMPLE_DEVICES),
            "--kubelet-registrar-directory-path", str(node.registry_dir),
            "--kubelet-plugins-directory-path", str(node.kubelet_root / "plugins"), "--kubeconfig", str(kubeconfig),
            "--kube-api-qps", "1000", "--kube-api-burst", "1000"]
    with open(node.logs / "example-plugin.log", "ab") as log:
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                process_group=0)


def run(binary: Path, pods: int, mig_mode: str, say: Callable[[str], None] = print) -> dict[str, Any]:
    # Short paths: the kubelet's plugin sockets are below the node's run dir (AF_UNIX paths < 108 bytes).
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="drpk-"))
    started = time.monotonic()
    out: dict[str, Any] = {"rows": {}, "calls_per_pod": {}, "loadavg": {}}
    try:
        with UpstreamCluster(work, DEFAULT_MINOR, say, real_node=RealNodeSpec(NODE, mig_mode=mig_mode)) as cluster:
            node, plane = cluster.node, cluster.plane
            assert node is not None and plane is not None  # bench.peer_kubelet_bench.unavailable() checked
            api = plane.admin()
            out["kubernetes"] = plane.config.binaries.release.kubernetes
            api.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                            "metadata": {"name": NAMESPACE}})
            got = phase(api, OURS, node.driver_name, node.driver_name, pods, say)
            for key, value in got.items():
                out[key][OURS] = value
            # Ours stops before the example driver starts: one plugin's background work at a time.
            terminate(node.plugin, 20.0)
            node.plugin = None
            api.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", body={
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": EXAMPLE_DRIVER},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{EXAMPLE_DRIVER}"'}}]}})
            example = start_example(node, binary, plane.admin_kubeconfig)
            try:
                def published() -> bool:
                    if example.poll() is not None:
                        log = (node.logs / "example-plugin.log").read_text(errors="replace")[-2000:]
                        raise RuntimeError(f"the example driver's plugin exited {example.returncode}: {log}")
                    slices = (api.get("/apis/resource.k8s.io/v1/resourceslices") or {}).get("items") or []
                    return any(s["spec"]["driver"] == EXAMPLE_DRIVER for s in slices)

                wait_for(published, TIMEOUT, "the example driver to publish its slice", interval=0.2)
                got = phase(api, EXAMPLE, EXAMPLE_DRIVER, EXAMPLE_DRIVER, pods, say)
                for key, value in got.items():
                    out[key][EXAMPLE] = value
            finally:
                terminate(example, 20.0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["seconds"] = round(time.monotonic() - started, 1)
    return out
