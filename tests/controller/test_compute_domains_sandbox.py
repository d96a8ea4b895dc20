"""The ComputeDomain reconciler against the sandbox API server (the chart's CRDs): a domain's templates and
DaemonSet as a real server stores them, status from clique entries a test writes as the daemons would, pruning,
the one-domain-per-clique rule, and deletion that leaves nothing behind. Passes are run one by one (`sync`), so
every expectation is read back from the API without waiting; tests/controller/test_compute_domains_operator.py
runs the same through kopf and the leader election."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.computedomain import names
from dra_driver.controller.computedomains.loop import ComputeDomainController, ComputeDomainSettings
from dra_driver.controller.computedomains.objects import DaemonSetSettings
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.k8s.client import KubeRest
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.deviceclasses import compute_domain_crds

REPO = Path(__file__).resolve().parents[2]
CRDS = [REPO / "charts/dra-driver/crds/computedomains.yaml", REPO / "charts/dra-driver/crds/computedomaincliques.yaml"]
DRIVER_NS = "dra-driver"
CDS = "/apis/gpu.dra.dev/v1beta1/namespaces/{ns}/computedomains"
CLIQUES = f"/apis/gpu.dra.dev/v1beta1/namespaces/{DRIVER_NS}/computedomaincliques"
RCTS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates"
DAEMONSETS = f"/apis/apps/v1/namespaces/{DRIVER_NS}/daemonsets"
PODS = f"/api/v1/namespaces/{DRIVER_NS}/pods"
CLIQUE_ID = "0f6a3c1e-5b2d-4c8e-9a7f-1d2e3f4a5b6c.1"
SETTINGS = ComputeDomainSettings(daemon=DaemonSetSettings(namespace=DRIVER_NS, image="dra-driver:test",
                                                       service_account="cd-daemon"))


def apply_crds(rest: KubeRest) -> None:
    """The chart's ComputeDomain CRDs (as a sandbox with compute domains installs them)."""
    crds = compute_domain_crds()
    assert crds == [yaml.safe_load(p.read_text()) for p in CRDS]
    for crd in crds:
        rest.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd)


@pytest.fixture
def api() -> Iterator[tuple[KubeRest, ComputeDomainController, ControllerMetrics]]:
    with ApiServer() as srv, srv.rest() as rest:
        apply_crds(rest)
        for ns in (DRIVER_NS, "team"):
            rest.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                             "metadata": {"name": ns}})
        for node in ("n1", "n2", "n3"):
            rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        metrics = ControllerMetrics()
        yield rest, ComputeDomainController(rest, SETTINGS, metrics), metrics


def domain(rest: KubeRest, name: str = "job", *, num_nodes: int = 2, template: str = "job-channel",
           mode: str = "Single") -> dict[str, Any]:
    return rest.request("POST", CDS.format(ns="team"), body={
        "apiVersion": "gpu.dra.dev/v1beta1", "kind": "ComputeDomain", "metadata": {"name": name, "namespace": "team"},
        "spec": {"numNodes": num_nodes, "channel": {"resourceClaimTemplate": {"name": template},
                                                    "allocationMode": mode}}})


def get(rest: KubeRest, path: str) -> dict[str, Any]:
    obj = rest.get(path)
    assert obj is not None, path
    return obj


def daemon_pod(rest: KubeRest, uid: str, node: str) -> None:
    rest.request("POST", PODS, body={
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"daemon-{node}", "namespace": DRIVER_NS, "labels": {names.DOMAIN_LABEL: uid}},
        "spec": {"nodeName": node, "containers": [{"name": "imex-daemon", "image": "dra-driver:test"}]}})


def write_entry(rest: KubeRest, uid: str, node: str, status: str, *, clique: str = CLIQUE_ID, index: int = 0) -> None:
    """What a daemon does: GET + PUT its own entry of `<uid>.<clique>` (create the clique when missing)."""
    name = names.clique_object_name(uid, clique)
    entry = {"nodeName": node, "ipAddress": f"127.0.0.{index + 2}", "cliqueID": clique, "index": index,
             "status": status}
    current = rest.get(f"{CLIQUES}/{name}")
    if current is None:
        rest.request("POST", CLIQUES, body={"apiVersion": "gpu.dra.dev/v1beta1", "kind": "ComputeDomainClique",
                                            "metadata": {"name": name, "namespace": DRIVER_NS}, "daemons": [entry]})
        return
    daemons = [d for d in current.get("daemons") or [] if d["nodeName"] != node] + [entry]
    rest.request("PUT", f"{CLIQUES}/{name}", body={**current, "daemons": daemons})


def test_a_new_domain_gets_its_finalizer_templates_and_daemonset(api: Any) -> None:
    rest, controller, _ = api
    cd = domain(rest, mode="All")
    uid = cd["metadata"]["uid"]
    controller.sync()

    stored = get(rest, f"{CDS.format(ns='team')}/job")
    assert stored["metadata"]["finalizers"] == [names.DOMAIN_FINALIZER]
    assert stored["status"]["status"] == "NotReady"
    ready = stored["status"]["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "WaitingForNodes")

    workload = get(rest, f"{RCTS.format(ns='team')}/job-channel")
    assert workload["metadata"]["labels"][names.DOMAIN_LABEL] == uid
    assert workload["metadata"]["labels"][names.TARGET_LABEL] == "Workload"
    assert workload["metadata"]["finalizers"] == [names.DOMAIN_FINALIZER]
    assert workload["metadata"]["ownerReferences"][0]["uid"] == uid
    devices = workload["spec"]["spec"]["devices"]
    assert devices["requests"] == [{"name": "channel", "exactly": {
        "deviceClassName": "compute-domain-default-channel.gpu.dra.dev", "allocationMode": "ExactCount", "count": 1}}]
    assert devices["config"] == [{"requests": ["channel"], "opaque": {"driver": "compute-domain.gpu.dra.dev",
                                  "parameters": {"apiVersion": "gpu.dra.dev/v1beta1",
                                                 "kind": "ComputeDomainChannelConfig", "domainID": uid,
                                                 "allocationMode": "All"}}}]

    daemon_rct = get(rest, f"{RCTS.format(ns=DRIVER_NS)}/computedomain-daemon-{uid}")
    assert daemon_rct["metadata"]["labels"][names.TARGET_LABEL] == "Daemon"
    assert daemon_rct["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"] == {
        "apiVersion": "gpu.dra.dev/v1beta1", "kind": "ComputeDomainDaemonConfig", "domainID": uid}

    ds = get(rest, f"{DAEMONSETS}/computedomain-daemon-{uid}")
    pod = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"] == {"matchLabels": {names.DOMAIN_LABEL: uid}}
    assert pod["nodeSelector"] == {names.DOMAIN_LABEL: uid}
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["serviceAccountName"] == "cd-daemon"
    assert pod["resourceClaims"] == [{"name": "daemon", "resourceClaimTemplateName": f"computedomain-daemon-{uid}"}]
    [container] = pod["containers"]
    assert container["image"] == "dra-driver:test"
    assert container["command"] == ["dra-driver", "compute-domain-daemon", "run", "--config-dir", "/imexd"]
    check = ["dra-driver", "compute-domain-daemon", "check", "--config-dir", "/imexd"]
    assert container["readinessProbe"]["exec"]["command"] == check
    assert container["startupProbe"]["exec"]["command"] == check
    env = {e["name"]: e.get("value", e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")) for e in container["env"]}
    assert env == {"NODE_NAME": "spec.nodeName", "POD_IP": "status.podIP", "POD_NAME": "metadata.name",
                   "POD_NAMESPACE": "metadata.namespace", "POD_UID": "metadata.uid",
                   "MAX_NODES_PER_IMEX_DOMAIN": "18", "NVIDIA_VISIBLE_DEVICES": "void"}
    assert container["resources"] == {"claims": [{"name": "daemon"}]}

    # A second pass changes nothing (no new objects, no status write).
    before = get(rest, f"{CDS.format(ns='team')}/job")["metadata"]["resourceVersion"]
    controller.sync()
    assert get(rest, f"{CDS.format(ns='team')}/job")["metadata"]["resourceVersion"] == before


def test_status_follows_the_clique_entries_and_prunes_entries_without_a_pod(api: Any) -> None:
    rest, controller, metrics = api
    uid = domain(rest)["metadata"]["uid"]
    controller.sync()
    for i, node in enumerate(("n1", "n2")):
        daemon_pod(rest, uid, node)
        write_entry(rest, uid, node, "NotReady", index=i)
    controller.sync()
    status = get(rest, f"{CDS.format(ns='team')}/job")["status"]
    assert status["status"] == "NotReady"
    assert [n["name"] for n in status["nodes"]] == ["n1", "n2"]
    assert status["nodes"][1] == {"name": "n2", "ipAddress": "127.0.0.3", "cliqueID": CLIQUE_ID, "index": 1,
                                  "status": "NotReady"}
    assert status["conditions"][0]["reason"] == "NodesNotReady"

    write_entry(rest, uid, "n1", "Ready", index=0)
    write_entry(rest, uid, "n2", "Ready", index=1)
    controller.sync()
    status = get(rest, f"{CDS.format(ns='team')}/job")["status"]
    assert status["status"] == "Ready"
    assert status["conditions"][0]["status"] == "True"
    assert metrics.value("dra_driver_controller_compute_domains", {"status": "Ready"}) == 1
    assert metrics.value("dra_driver_controller_compute_domain_nodes", {"status": "Ready"}) == 2

    # n2's daemon pod is going (Terminating, its entry left behind): pruned from the clique, the domain is short a node.
    rest.request("DELETE", f"{PODS}/daemon-n2")
    controller.sync()
    clique = get(rest, f"{CLIQUES}/{names.clique_object_name(uid, CLIQUE_ID)}")
    assert [d["nodeName"] for d in clique["daemons"]] == ["n1"]
    status = get(rest, f"{CDS.format(ns='team')}/job")["status"]
    assert (status["status"], [n["name"] for n in status["nodes"]]) == ("NotReady", ["n1"])
    assert status["conditions"][0]["reason"] == "WaitingForNodes"


def test_a_second_domain_on_a_held_clique_is_refused(api: Any) -> None:
    """Both domains get daemons in one clique: the older (creationTimestamp, then UID: created in the same second
    here) holds it and becomes Ready; the other is NotReady with reason CliqueInUse naming the holder."""
    rest, controller, _ = api
    made = [domain(rest, name, num_nodes=1, template=f"{name}-channel") for name in ("first", "second")]
    holder, refused = sorted(made, key=lambda d: (d["metadata"]["creationTimestamp"], d["metadata"]["uid"]))
    controller.sync()
    for cd, node in ((holder, "n1"), (refused, "n2")):
        uid = cd["metadata"]["uid"]
        rest.request("POST", PODS, body={
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"daemon-{cd['metadata']['name']}", "namespace": DRIVER_NS,
                         "labels": {names.DOMAIN_LABEL: uid}},
            "spec": {"nodeName": node, "containers": [{"name": "imex-daemon", "image": "dra-driver:test"}]}})
        write_entry(rest, uid, node, "Ready")
    controller.sync()
    assert get(rest, f"{CDS.format(ns='team')}/{holder['metadata']['name']}")["status"]["status"] == "Ready"
    status = get(rest, f"{CDS.format(ns='team')}/{refused['metadata']['name']}")["status"]
    assert status["status"] == "NotReady"
    assert status["conditions"][0]["reason"] == "CliqueInUse"
    message = status["conditions"][0]["message"]
    assert f"team/{holder['metadata']['name']}" in message and "#892" in message and CLIQUE_ID in message


def test_a_foreign_template_of_that_name_is_left_alone_and_reported(api: Any) -> None:
    rest, controller, _ = api
    rest.request("POST", RCTS.format(ns="team"), body={
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "job-channel", "namespace": "team"},
        "spec": {"spec": {"devices": {"requests": [{"name": "x", "exactly": {"deviceClassName": "other"}}]}}}})
    domain(rest)
    controller.sync()
    status = get(rest, f"{CDS.format(ns='team')}/job")["status"]
    assert status["conditions"][0]["reason"] == "ClaimTemplateConflict"
    assert "spec.channel.resourceClaimTemplate.name" in status["conditions"][0]["message"]
    assert "labels" not in get(rest, f"{RCTS.format(ns='team')}/job-channel")["metadata"]


def test_deletion_removes_everything_and_then_the_finalizer(api: Any) -> None:
    rest, controller, _ = api
    uid = domain(rest)["metadata"]["uid"]
    controller.sync()
    daemon_pod(rest, uid, "n1")
    write_entry(rest, uid, "n1", "Ready")
    for node in ("n1", "n2"):
        rest.request("PATCH", f"/api/v1/nodes/{node}", body={"metadata": {"labels": {names.DOMAIN_LABEL: uid}}},
                     content_type="application/merge-patch+json")
    rest.request("PATCH", "/api/v1/nodes/n3", body={"metadata": {"labels": {names.DOMAIN_LABEL: "other"}}},
                 content_type="application/merge-patch+json")
    rest.request("DELETE", f"{CDS.format(ns='team')}/job")
    assert get(rest, f"{CDS.format(ns='team')}/job")["metadata"]["deletionTimestamp"]
    controller.sync()

    assert rest.get(f"{CDS.format(ns='team')}/job") is None  # the finalizer went last
    assert rest.get(f"{RCTS.format(ns='team')}/job-channel") is None
    assert rest.get(f"{RCTS.format(ns=DRIVER_NS)}/computedomain-daemon-{uid}") is None
    assert rest.get(f"{DAEMONSETS}/computedomain-daemon-{uid}") is None
    assert rest.get(f"{CLIQUES}/{names.clique_object_name(uid, CLIQUE_ID)}") is None
    labels = {n: get(rest, f"/api/v1/nodes/{n}")["metadata"].get("labels", {}).get(names.DOMAIN_LABEL)
              for n in ("n1", "n2", "n3")}
    assert labels == {"n1": None, "n2": None, "n3": "other"}

    # A daemon that wrote its entry after the cleanup (or a clique whose domain was deleted past a finalizer removed
    # by hand): the next pass deletes the orphan.
    write_entry(rest, uid, "n1", "Ready")
    controller.sync()
    assert rest.get(f"{CLIQUES}/{names.clique_object_name(uid, CLIQUE_ID)}") is None


def test_a_sandbox_cluster_with_compute_domains_installs_what_the_chart_does(tmp_path: Path) -> None:
    """`ClusterConfig(compute_domains=True)`: the CRDs, the two classes and the driver namespace, and the
    controller's settings pointing its daemons there (the rest of `SandboxCluster.start` is tested elsewhere)."""
    from dra_sandbox.cluster import ClusterConfig, SandboxCluster
    from dra_sandbox.computedomainplugin import COMPUTE_DOMAIN_NAMESPACE

    cluster = SandboxCluster(ClusterConfig(work_dir=tmp_path, nodes=(), controller=True, compute_domains=True))
    cluster.server.start()
    try:
        cluster.rest = cluster.server.rest()
        settings = cluster._compute_domains()
        assert settings is not None and settings.daemon.namespace == COMPUTE_DOMAIN_NAMESPACE
        rest = cluster.rest
        for crd in ("computedomains.gpu.dra.dev", "computedomaincliques.gpu.dra.dev"):
            assert rest.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}") is not None
        for cls in (names.DAEMON_CLASS, names.DEFAULT_CHANNEL_CLASS):
            assert rest.get(f"/apis/resource.k8s.io/v1/deviceclasses/{cls}") is not None
        assert rest.get(f"/api/v1/namespaces/{COMPUTE_DOMAIN_NAMESPACE}") is not None
    finally:
        cluster.server.stop()
    assert SandboxCluster(ClusterConfig(work_dir=tmp_path, nodes=()))._compute_domains() is None
