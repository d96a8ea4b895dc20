"""The sandbox kubelet's host-process runtime and pod IPs: pods whose containers run `dra-driver` run as child
processes (a stub stands in for the binary here) with the downward API, the CDI edits and mapped mount paths;
exec readiness probes drive Ready; deletion sends SIGTERM, then SIGKILL after the grace period, before the claim
is unprepared; restartPolicy Always restarts; every pod gets a distinct loopback pod IP."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from dra_sandbox.kubelet import Backoff, KubeletConfig, KubeletSimulator, PodSyncConfig, RegistrationConfig
from dra_sandbox.kubelet.podips import PodIpAllocator, PodIpRangeFull, node_pod_cidr
from dra_sandbox.kubelet.processpods import (
    PodAddresses,
    ProcessPodError,
    ProcessPodSettings,
    expand,
    map_paths,
    process_pod_request,
    runs_as_process,
)
from dra_sandbox.runtime import CdiCheckedRuntime
from dra_sandbox.runtime.cdi import ContainerConfig
from dra_sandbox.runtime.hostprocess import RestartBackoff
from tests.kube_models import meta
from tests.polling import wait_for
from tests.sandbox.test_kubelet_fakeplugin import FakePlugin, short_tmpdir
from tests.sandbox.test_kubelet_pods import DRIVER, MERGE

# The stand-in for `dra-driver`: `run --state DIR [--exit-first N] [--ignore-term]` records its argv and env, makes
# DIR/ready after a moment and on SIGTERM writes DIR/terminated; `check --state DIR` succeeds once DIR/ready exists.
STUB = r'''
import json, os, signal, sys, time
args = sys.argv[1:]
mode, state = args[0], args[args.index("--state") + 1]
if mode == "check":
    sys.exit(0 if os.path.exists(os.path.join(state, "ready")) else 1)
os.makedirs(state, exist_ok=True)
runs = os.path.join(state, "runs")
count = int(open(runs).read()) + 1 if os.path.exists(runs) else 1
open(runs, "w").write(str(count))
# The handler goes in before seen.json appears: a test that deletes the pod once it sees the file must find its
# SIGTERM handled.
def term(signum, frame):
    open(os.path.join(state, "terminated"), "w").write(str(time.time()))
    if "--ignore-term" not in args:
        sys.exit(0)
signal.signal(signal.SIGTERM, term)
# Written whole and renamed into place: the test polls for the file and must never read it half-written.
with open(os.path.join(state, "seen.json.tmp"), "w") as out:
    json.dump({"argv": sys.argv, "env": dict(os.environ), "pid": os.getpid()}, out)
os.replace(os.path.join(state, "seen.json.tmp"), os.path.join(state, "seen.json"))
if "--exit-first" in args and count == 1:
    sys.exit(int(args[args.index("--exit-first") + 1]))
time.sleep(0.3)
open(os.path.join(state, "ready"), "w").write("yes")
while True:
    time.sleep(0.05)
'''


class Node:
    def __init__(self, api: k8s.ApiClient, base: Path) -> None:
        self.node = f"node-{uuid.uuid4().hex[:8]}"
        self.ns = "default"
        self.core = k8s.CoreV1Api(api)
        self.res = k8s.ResourceV1Api(api)
        self.base = base
        self.cdi_dir = base / "cdi"
        self.state = base / "state"
        (base / "bin").mkdir()
        stub = base / "bin" / "stub.py"
        stub.write_text(STUB)
        self.plugin = FakePlugin(base / "registry", base / "plugins", driver=DRIVER, cdi_dir=self.cdi_dir,
                                 cdi_mount=base)
        settings = ProcessPodSettings(log_root=base / "logs", bin_dirs=(base / "bin",),
                                      executables={"dra-driver": (sys.executable, str(stub))},
                                      extra_env={"KUBECONFIG": "/nowhere"}, cdi_dirs=(self.cdi_dir,),
                                      backoff=RestartBackoff(initial_s=0.2, maximum_s=1.0))
        config = KubeletConfig(
            node_name=self.node, registry_dir=base / "registry", plugins_dir=base / "plugins",
            registration=RegistrationConfig(poll_interval_s=0.2, dial_timeout_s=2.0,
                                            backoff=Backoff(0.05, 2.0, 0.2), health_reopen_s=0.1),
            pods=PodSyncConfig(resync_interval_s=0.05, backoff=Backoff(0.1, 2.0, 0.4), wiping_delay_s=30,
                               watch_timeout_s=5, request_timeout_s=10.0, stop_grace_s=1.0),
            pod_cidr="127.77.3.0/24", process_pods=settings)
        self.kubelet = KubeletSimulator(config, CdiCheckedRuntime([self.cdi_dir]), api)

    def claim(self, name: str) -> None:
        self.res.create_namespaced_resource_claim(self.ns, k8s.ResourceV1ResourceClaim.model_validate({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.test"}}]}}}))

    def allocate(self, claim: str, pod: Any) -> str:
        body = {"status": {
            "allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "p", "device": "d"}]}},
            "reservedFor": [{"resource": "pods", "name": meta(pod).name, "uid": meta(pod).uid}]}}
        out = self.res.patch_namespaced_resource_claim_status(claim, self.ns, body, _content_type=MERGE)
        return str(meta(out).uid)

    def daemon_pod(self, name: str, claim: str | None = None, extra: tuple[str, ...] = (), grace: int = 5,
                   probe: bool = True) -> Any:
        # With a claim, a container path the CDI mount (/usr/local/dra -> base) maps to the host; else a host path.
        state = f"/usr/local/dra/state/{name}" if claim else str(self.base / "state" / name)
        container: dict[str, Any] = {
            "name": "daemon", "image": "dra-driver:test",
            "command": ["dra-driver", "run"], "args": ["--state", state, *extra],
            "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                    {"name": "GREETING", "value": "hi-$(NODE_NAME)"}]}
        if probe:
            container["readinessProbe"] = {"exec": {"command": ["dra-driver", "check", "--state", state]},
                                           "periodSeconds": 1, "failureThreshold": 1}
        spec: dict[str, Any] = {"nodeName": self.node, "restartPolicy": "Always", "containers": [container],
                                "terminationGracePeriodSeconds": grace}
        if claim:
            spec["resourceClaims"] = [{"name": "c", "resourceClaimName": claim}]
            container["resources"] = {"claims": [{"name": "c"}]}
        return self.core.create_namespaced_pod(self.ns, k8s.V1Pod.model_validate(
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}))

    def read(self, name: str) -> Any:
        pods = self.core.list_namespaced_pod(self.ns, field_selector=f"metadata.name={name}").items
        return pods[0] if pods else None

    def ready(self, name: str) -> str | None:
        pod = self.read(name)
        conds = (pod.status.conditions or []) if pod and pod.status else []
        return next((c.status for c in conds if c.type == "Ready"), None)

    def seen(self, name: str) -> dict[str, Any]:
        path = self.base / "state" / name / "seen.json"
        return dict(json.loads(path.read_text())) if path.exists() else {}


@pytest.fixture
def node(api: k8s.ApiClient) -> Iterator[Node]:
    base = short_tmpdir()
    n = Node(api, base)
    n.kubelet.start()
    n.plugin.start()
    yield n
    n.kubelet.stop()
    n.plugin.stop()
    shutil.rmtree(base, ignore_errors=True)


def test_daemon_pod_runs_as_a_process_with_downward_api_cdi_and_probes(node: Node) -> None:
    node.claim("imex")
    pod = node.daemon_pod("daemon-a", claim="imex")
    claim_uid = node.allocate("imex", pod)
    seen = wait_for(lambda: node.seen("daemon-a"), what="the process started")
    running = wait_for(lambda: p if (p := node.read("daemon-a")).status.phase == "Running" else None, what="Running")
    ip = running.status.pod_ip
    assert ipaddress.ip_address(ip) in ipaddress.ip_network("127.77.3.0/24")
    assert [i.ip for i in running.status.pod_ips] == [ip]
    env = seen["env"]
    assert (env["NODE_NAME"], env["POD_IP"], env["POD_NAME"], env["POD_NAMESPACE"], env["POD_UID"]) == (
        node.node, ip, "daemon-a", "default", meta(pod).uid)
    assert env["GREETING"] == f"hi-{node.node}"  # $(VAR) expansion of an earlier entry
    assert env["DRA_CLAIM_UID"] == claim_uid  # the claim's CDI edits reach the process
    assert env["PATH"].split(":")[0] == str(node.base / "bin")
    assert env["HOSTNAME"] == "daemon-a" and env["KUBECONFIG"] == "/nowhere"
    # The container path under the CDI mount (/usr/local/dra -> the host dir) is mapped in argv.
    assert seen["argv"][1:] == ["run", "--state", str(node.base / "state" / "daemon-a")]
    # Ready only once the exec readiness probe passes (the stub makes its marker 0.3 s after start).
    wait_for(lambda: node.ready("daemon-a") == "True", timeout=15, what="Ready via the readiness probe")
    status = node.read("daemon-a").status.container_statuses[0]
    assert status.ready is True and status.state.running is not None and status.restart_count == 0
    annotation = json.loads(node.read("daemon-a").metadata.annotations["sandbox.dra.dev/containers"])
    assert annotation["daemon"]["runtime"] == "host-process" and annotation["daemon"]["executed"] is True
    # Deletion: SIGTERM, the process exits, then the claim is unprepared and the deletion confirmed.
    pid = seen["pid"]
    node.core.delete_namespaced_pod("daemon-a", node.ns)
    wait_for(lambda: node.read("daemon-a") is None, timeout=15, what="pod deleted")
    assert (node.base / "state" / "daemon-a" / "terminated").exists()
    assert not _alive(pid)
    assert node.plugin.calls.unprepare and node.plugin.calls.unprepare[-1][1] == [claim_uid]
    assert node.kubelet.pods is not None and node.kubelet.pods.pod_ips is not None
    assert meta(pod).uid not in node.kubelet.pods.pod_ips.in_use()  # the address is free again


def test_sigkill_after_the_grace_period_when_sigterm_is_ignored(node: Node) -> None:
    node.daemon_pod("stubborn", extra=("--ignore-term",), grace=1, probe=False)
    seen = wait_for(lambda: node.seen("stubborn"), what="started")
    wait_for(lambda: node.ready("stubborn") == "True", what="Ready without a probe once running")
    started = time.monotonic()
    node.core.delete_namespaced_pod("stubborn", node.ns)
    wait_for(lambda: node.read("stubborn") is None, timeout=15, what="pod deleted")
    assert time.monotonic() - started >= 0.9  # the grace period was waited out
    assert (node.base / "state" / "stubborn" / "terminated").exists()  # SIGTERM came first
    assert not _alive(seen["pid"])  # then SIGKILL


def test_restart_policy_always_restarts_an_exited_container(node: Node) -> None:
    node.daemon_pod("flaky", extra=("--exit-first", "3"), probe=False)

    def restarted() -> Any:
        pod = node.read("flaky")
        statuses = (pod.status.container_statuses or []) if pod and pod.status else []
        return statuses[0] if statuses and statuses[0].restart_count == 1 and statuses[0].state.running else None

    status = wait_for(restarted, timeout=15, what="restarted once")
    assert status.last_state.terminated.exit_code == 3 and status.last_state.terminated.reason == "Error"
    runs = node.base / "state" / "flaky" / "runs"
    wait_for(lambda: runs.read_text() == "2", what="the second run")
    assert node.read("flaky").status.phase == "Running"


def test_pods_get_distinct_ips_and_a_mixed_pod_is_refused(node: Node) -> None:
    for name in ("ip-a", "ip-b"):
        node.daemon_pod(name, probe=False)
    ips = wait_for(lambda: i if all(i := [getattr(node.read(n).status, "pod_ip", None) for n in ("ip-a", "ip-b")])
                   else None, what="two pod IPs")
    assert len(set(ips)) == 2
    node.core.create_namespaced_pod(node.ns, k8s.V1Pod.model_validate({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mixed"},
        "spec": {"nodeName": node.node, "restartPolicy": "Always", "containers": [
            {"name": "d", "image": "x", "command": ["dra-driver", "run", "--state", "/tmp/x"]},
            {"name": "side", "image": "busybox", "command": ["sh"]}]}}))
    wait_for(lambda: node.read("mixed").status.phase == "Failed", what="mixed pod Failed")
    message = node.read("mixed").status.container_statuses[0].state.terminated.message
    assert "'side' does not run `dra-driver`" in message


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


# ---- pure parts ------------------------------------------------------------------------------------------------


def test_pod_ip_allocator_is_stable_distinct_and_reuses_only_after_wrapping() -> None:
    ips = PodIpAllocator("127.9.1.0/29")  # six host addresses
    a, b = ips.assign("a"), ips.assign("b")
    assert (a, b) == ("127.9.1.1", "127.9.1.2") and ips.assign("a") == a
    ips.release("a")
    assert ips.assign("c") == "127.9.1.3"  # the next one, not a's just-released address
    for uid in ("d", "e", "f"):
        ips.assign(uid)
    assert ips.assign("g") == "127.9.1.1"  # wrapped around to the free one
    with pytest.raises(PodIpRangeFull, match=r"no IP addresses available in range set: 127\.9\.1\.0/29"):
        ips.assign("h")
    with pytest.raises(ValueError, match=r"inside 127\.0\.0\.0/8"):
        PodIpAllocator("10.0.0.0/24")
    assert node_pod_cidr(42, 0) == "127.42.1.0/24"


def test_runs_as_process_rule_expansion_and_path_mapping(tmp_path: Path) -> None:
    daemon = {"spec": {"containers": [{"name": "d", "command": ["dra-driver", "x"]}]}}
    assert runs_as_process(daemon) is True
    assert runs_as_process({"spec": {"containers": [{"name": "w", "command": ["sh"]}]}}) is False
    with pytest.raises(ProcessPodError, match="'w' does not run"):
        runs_as_process({"spec": {"initContainers": [{"name": "w", "image": "x"}],
                                  "containers": [{"name": "d", "command": ["dra-driver"]}]}})
    assert expand("$(A)-$$(A)-$(MISSING)", {"A": "1"}) == "1-$(A)-$(MISSING)"
    mounts = [("/imexd/sub", "/host/sub"), ("/imexd", "/host/imexd")]
    assert map_paths("/imexd", mounts) == "/host/imexd"
    assert map_paths("/imexd/sub/f", mounts) == "/host/sub/f"
    assert map_paths("--config=/imexd/a.cfg", mounts) == "--config=/host/imexd/a.cfg"
    assert map_paths("/imexdx", mounts) == "/imexdx"
    pod = {"metadata": {"name": "p", "namespace": "n", "uid": "u"},
           "spec": {"nodeName": "a", "containers": [{"name": "d", "command": ["dra-driver", "run"],
                                                     "env": [{"name": "S", "valueFrom": {"secretKeyRef": {}}}]}]}}
    settings = ProcessPodSettings(log_root=tmp_path)
    with pytest.raises(ProcessPodError, match=r"env\[0\]\.valueFrom\.secretKeyRef"):
        process_pod_request(pod, {"d": ContainerConfig()}, PodAddresses("127.0.0.2", "10.0.0.1"), settings)
    pod["spec"]["containers"][0]["env"] = []  # type: ignore[index]
    request = process_pod_request(pod, {}, PodAddresses("127.0.0.2", "10.0.0.1"), settings)
    assert request.containers[0].argv == (sys.executable, "-m", "dra_driver.cli", "run")
    # Never the machine's /etc/hosts (the runner's --system-hosts-file turned off).
    assert request.containers[0].env["DRA_DRIVER_SYSTEM_HOSTS_FILE"] == ""
    assert request.grace_period_s == 30.0
