"""KEP-5007 binding conditions end to end in the sandbox (Kubernetes 1.37): the sandbox scheduler allocates a
ComputeDomain's channel (a slice as the compute-domain plugin publishes it: bindsToNode, imex-ready / imex-failed)
and holds the pod in PreBind; the controller labels the node for the domain, and sets imex-ready once the test
writes that node's daemon entry Ready (what the daemon does) — only then is the pod bound. A crashing daemon, the
timeout and a clique held by another domain set imex-failed, and the scheduler frees the claim. Steps are explicit
(`reconcile`, `sync`, the claim handed over as kopf's watch would); time moves on injected clocks."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dra_driver.computedomain import names
from dra_driver.controller.computedomains.loop import ComputeDomainController, ComputeDomainSettings
from dra_driver.controller.computedomains.objects import DaemonSetSettings
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.k8s.client import KubeRest
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.deviceclasses import compute_domain_device_classes
from dra_sandbox.kubelet.nodestatus import ready_node
from dra_sandbox.scheduler import SandboxScheduler
from tests.clocks import MovableClock
from tests.controller.test_compute_domains_sandbox import CDS, CLIQUE_ID, DRIVER_NS, PODS, apply_crds, write_entry

NODE = "n1"
RESOURCE = "/apis/resource.k8s.io/v1"
POD = "/api/v1/namespaces/team/pods/worker"


@dataclass
class Env:
    rest: KubeRest
    clock: MovableClock
    scheduler: SandboxScheduler
    controller: ComputeDomainController
    metrics: ControllerMetrics
    uid: str

    def claim(self) -> dict[str, Any]:
        [claim] = self.rest.request("GET", f"{RESOURCE}/namespaces/team/resourceclaims")["items"]
        assert isinstance(claim, dict)
        return claim

    def sync(self) -> None:
        """One controller pass after kopf's claims watch delivered the claim as it is now."""
        self.controller.on_claim("MODIFIED", self.claim())
        self.controller.sync()

    def bound_to(self) -> str:
        return str(((self.rest.get(POD) or {}).get("spec") or {}).get("nodeName") or "")

    def label(self, node: str = NODE) -> str | None:
        obj = self.rest.get(f"/api/v1/nodes/{node}") or {}
        value = ((obj.get("metadata") or {}).get("labels") or {}).get(names.DOMAIN_LABEL)
        return str(value) if value is not None else None

    def entry(self) -> dict[str, Any]:
        status = self.claim().get("status") or {}
        [entry] = [e for e in status.get("devices") or [] if e["driver"] == names.DRIVER_NAME]
        assert isinstance(entry, dict)
        return entry


def channel_slice(node: str, clique: str) -> dict[str, Any]:
    """What the compute-domain plugin publishes on a 1.36+ cluster (docs/compute-domains.md)."""
    attrs = {"type": {"string": "channel"}, "id": {"int": 0}, "cliqueID": {"string": clique}}
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-cd"},
        "spec": {"driver": names.DRIVER_NAME, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [
                     {"name": names.CHANNEL_DEVICE, "attributes": attrs, "bindsToNode": True,
                      "bindingConditions": [names.READY_CONDITION],
                      "bindingFailureConditions": [names.FAILED_CONDITION]},
                     {"name": names.DAEMON_DEVICE, "attributes": {
                         "type": {"string": "daemon"}, "id": {"int": 0}, "cliqueID": {"string": clique}}}]},
    }


@pytest.fixture
def env() -> Iterator[Env]:
    with ApiServer(kube_version="1.37.0") as srv, srv.rest() as rest:
        apply_crds(rest)
        for ns in (DRIVER_NS, "team"):
            rest.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                             "metadata": {"name": ns}})
        rest.request("POST", "/api/v1/nodes", body=ready_node(NODE))
        for cls in compute_domain_device_classes():
            rest.request("POST", f"{RESOURCE}/deviceclasses", body=cls)
        rest.request("POST", f"{RESOURCE}/resourceslices", body=channel_slice(NODE, CLIQUE_ID))
        clock, metrics = MovableClock(datetime(2026, 12, 1, 12, 0, tzinfo=UTC)), ControllerMetrics()
        settings = ComputeDomainSettings(daemon=DaemonSetSettings(namespace=DRIVER_NS, image="dra-driver:test"),
                                         binding_timeout_seconds=120)
        controller = ComputeDomainController(rest, settings, metrics, clock=clock)
        cd = rest.request("POST", CDS.format(ns="team"), body={
            "apiVersion": "gpu.dra.dev/v1beta1", "kind": "ComputeDomain",
            "metadata": {"name": "job", "namespace": "team"},
            "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "job-channel"}}}})
        controller.sync()  # the workload claim template
        rest.request("POST", "/api/v1/namespaces/team/pods", body={
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "worker", "namespace": "team"},
            "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "imex"}]}}],
                     "resourceClaims": [{"name": "imex", "resourceClaimTemplateName": "job-channel"}]}})
        scheduler = SandboxScheduler(rest, kubernetes_minor=37, clock=clock)
        env = Env(rest, clock, scheduler, controller, metrics, cd["metadata"]["uid"])
        for _ in range(3):  # the claim from the template, then the allocation
            scheduler.reconcile()
        yield env


def daemon_pod(env: Env, *, waiting: str = "") -> None:
    """The DaemonSet's pod on the node (what the DaemonSet controller makes once the node is labelled)."""
    status: dict[str, Any] = {"phase": "Running"}
    if waiting:
        status["containerStatuses"] = [{"name": "imex-daemon", "ready": False, "restartCount": 5, "image": "x",
                                        "imageID": "", "state": {"waiting": {"reason": waiting, "message": "boom"}}}]
    pod = env.rest.request("POST", PODS, body={
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "daemon-n1", "namespace": DRIVER_NS, "labels": {names.DOMAIN_LABEL: env.uid}},
        "spec": {"nodeName": NODE, "containers": [{"name": "imex-daemon", "image": "dra-driver:test"}]}})
    if waiting:
        env.rest.request("PUT", f"{PODS}/daemon-n1/status", body={**pod, "status": status})


def test_the_pod_is_bound_only_once_its_nodes_daemon_is_ready(env: Env) -> None:
    allocation = env.claim()["status"]["allocation"]
    [result] = allocation["devices"]["results"]
    assert (result["driver"], result["pool"], result["device"]) == (names.DRIVER_NAME, NODE, names.CHANNEL_DEVICE)
    assert result["bindingConditions"] == [names.READY_CONDITION]
    assert env.bound_to() == ""  # held in PreBind

    env.sync()
    assert env.label() == env.uid  # the daemon's DaemonSet selects the node now
    assert "devices" not in env.claim()["status"]
    env.scheduler.reconcile()
    assert env.bound_to() == ""

    daemon_pod(env)
    write_entry(env.rest, env.uid, NODE, "NotReady")
    env.sync()
    env.scheduler.reconcile()
    assert env.bound_to() == "" and "devices" not in env.claim()["status"]

    write_entry(env.rest, env.uid, NODE, "Ready")
    env.sync()
    [condition] = env.entry()["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        names.READY_CONDITION, "True", "IMEXDaemonReady")
    assert env.metrics.value("dra_driver_controller_compute_domain_binding_conditions_total",
                             {"verdict": "ready"}) == 1
    env.scheduler.reconcile()
    assert env.bound_to() == NODE
    # A later pass writes nothing more (the claim is settled) and keeps the label (the claim is still allocated).
    version = env.claim()["metadata"]["resourceVersion"]
    env.sync()
    assert env.claim()["metadata"]["resourceVersion"] == version and env.label() == env.uid
    assert (env.rest.get(f"{CDS.format(ns='team')}/job") or {})["status"]["status"] == "Ready"


def test_a_crashing_daemon_fails_the_binding_and_the_label_is_taken_back(env: Env) -> None:
    env.sync()
    daemon_pod(env, waiting="CrashLoopBackOff")
    env.sync()
    [condition] = env.entry()["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        names.FAILED_CONDITION, "True", "IMEXDaemonFailed")
    assert "CrashLoopBackOff" in condition["message"]
    env.scheduler.reconcile()  # the failure condition: the attempt fails and the claim is freed
    assert env.bound_to() == "" and not env.claim()["status"].get("allocation")
    env.sync()  # the controller sees the claim without that allocation: the label it set goes
    assert env.label() is None
    env.scheduler.reconcile()  # a fresh attempt (the node is the only one): allocated and waiting again
    assert env.claim()["status"]["allocation"] and env.bound_to() == ""


def test_a_daemon_that_is_not_ready_in_time_fails_the_binding(env: Env) -> None:
    env.sync()
    daemon_pod(env)
    write_entry(env.rest, env.uid, NODE, "NotReady")
    env.clock.now += timedelta(seconds=121)
    env.sync()
    [condition] = env.entry()["conditions"]
    assert (condition["type"], condition["reason"]) == (names.FAILED_CONDITION, "IMEXDaemonNotReady")
    assert "within 120 s" in condition["message"]


def test_a_clique_held_by_another_domain_fails_the_binding_before_any_label(env: Env) -> None:
    """Another domain already has a daemon in the node's clique (on another node) and this one has none there: the
    clique is the other's, so this domain's channel there is refused at once (NVIDIA #892), without a label."""
    other = env.rest.request("POST", CDS.format(ns="team"), body={
        "apiVersion": "gpu.dra.dev/v1beta1", "kind": "ComputeDomain",
        "metadata": {"name": "older", "namespace": "team"},
        "spec": {"channel": {"resourceClaimTemplate": {"name": "older-channel"}}}})
    other_uid = other["metadata"]["uid"]
    env.rest.request("POST", "/api/v1/nodes", body=ready_node("n2"))
    env.rest.request("POST", PODS, body={
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "older-n2", "namespace": DRIVER_NS, "labels": {names.DOMAIN_LABEL: other_uid}},
        "spec": {"nodeName": "n2", "containers": [{"name": "imex-daemon", "image": "dra-driver:test"}]}})
    write_entry(env.rest, other_uid, "n2", "Ready")
    env.sync()
    [condition] = env.entry()["conditions"]
    assert (condition["type"], condition["reason"]) == (names.FAILED_CONDITION, "CliqueInUse")
    assert "team/older" in condition["message"]
    assert env.label() is None
