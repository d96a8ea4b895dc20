"""Upstream's control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, built from their Go
modules: docs/upstream.md) with what the chart installs, and the driver against it.

The binaries come from the cache `make upstream` fills (make test builds them first, with a visible message). Where
this machine cannot build them (no Go, no module proxy) or they are not built yet, every test here SKIPs with a
reason starting UPSTREAM_SKIP_PREFIX, which the suite's summary repeats in a banner (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.k8s.client import ApiError, JsonObject, KubeRest, connect
from dra_sandbox.polling import wait_for
from dra_sandbox.upstream.build import RELEASES
from dra_sandbox.upstream.controlplane import FEATURE_GATES, ControlPlane, ControlPlaneConfig
from dra_sandbox.upstream.install import NAMESPACE, Installed, install_chart, render
from tests.upstream.conftest import DRIVER, MINOR, release_binaries, start_plugin

TIMEOUT = 60.0

pytestmark = pytest.mark.xdist_group("upstream")  # one control plane at a time on the 2-core machines


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra-up-u-"))  # short: the nodes' AF_UNIX paths live in it
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"  # a zombie has exited (PID 1 here may not reap it)


@pytest.mark.timeout(360)  # up starts the control plane, the chart and a real node: 40-120 s each way on 2 busy cores
@pytest.mark.parametrize("how", ["down", "owner killed, then down"])
def test_up_and_down_on_the_command_line(state_dir: Path, how: str) -> None:
    """`dra-sandbox up --kubernetes upstream --detach` then `down` (also after the owner was SIGKILLed, leaving
    its processes behind): every process it started is gone."""
    binaries = release_binaries()
    state = state_dir
    cli = [sys.executable, "-m", "dra_sandbox.cli"]
    up = subprocess.run([*cli, "up", "--kubernetes", "upstream", "--kubernetes-version", MINOR, "--detach",
                         "--state-dir", str(state)], capture_output=True, text=True, timeout=300, check=False)
    children: dict[str, int] = {}
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"dra-sandbox: up with upstream Kubernetes {binaries.release.kubernetes}" in up.stdout
        children = json.loads((state / "children.json").read_text())
        assert set(children) >= {"upstream/etcd", "upstream/kube-apiserver", "upstream/kube-controller-manager",
                                 "upstream/kube-scheduler", "upstream/dra-driver-controller"}  # and the node's
        with connect(str(state / "kubeconfig")) as client:  # where `up` writes it for the sandbox too
            assert client.request("GET", "/version")["gitVersion"] == binaries.release.kubernetes
            assert client.get(f"/apis/resource.k8s.io/v1/deviceclasses/{DRIVER}") is not None
        if how != "down":
            owner = int((state / "up.pid").read_text())
            os.kill(owner, signal.SIGKILL)
            wait_for(lambda: not _running(owner), TIMEOUT, "the owner to die")
            assert all(_running(children[f"upstream/{name}"]) for name in ("etcd", "kube-apiserver"))
    finally:
        down = subprocess.run([*cli, "down", "--state-dir", str(state)], capture_output=True, text=True,
                              timeout=120, check=False)
    assert down.returncode == 0, down.stdout + down.stderr
    if how != "down":
        assert "upstream process(es) (etcd, kube-*) a previous run left behind" in down.stdout
    assert children and not [name for name, pid in children.items() if _running(pid)]
    assert not (state / "kubeconfig").exists()


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    binaries = release_binaries()
    work = tmp_path_factory.mktemp("upstream")
    with ControlPlane(ControlPlaneConfig(work / "controlplane", binaries)) as started:
        yield started


@pytest.fixture(scope="module")
def installed(plane: ControlPlane) -> Installed:
    return install_chart(plane)


@pytest.fixture(scope="module")
def admin(plane: ControlPlane) -> KubeRest:
    return plane.admin()


def test_the_api_server_is_upstreams_at_the_pinned_version(plane: ControlPlane, admin: KubeRest) -> None:
    release = RELEASES[MINOR]
    version = admin.request("GET", "/version")
    assert version["gitVersion"] == release.kubernetes
    assert (version["major"], version["minor"]) == release.major_minor
    assert version["gitTreeState"] == "clean" and version["buildDate"] == release.released
    # The controllers run and lead (start() waited for their Leases; they are still held).
    for name in ("kube-controller-manager", "kube-scheduler"):
        lease = admin.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{name}")
        assert lease is not None and lease["spec"]["holderIdentity"], name


def test_resource_v1_is_served_with_the_dra_kinds(admin: KubeRest) -> None:
    group = admin.request("GET", "/apis/resource.k8s.io/v1")
    kinds = {r["kind"] for r in group["resources"] if "/" not in r["name"]}
    assert {"DeviceClass", "ResourceClaim", "ResourceClaimTemplate", "ResourceSlice"} <= kinds
    if MINOR == "1.37":
        assert "DeviceTaintRule" in kinds  # GA in 1.37


def test_the_feature_gates_reach_the_api_server(admin: KubeRest) -> None:
    """The API server's own view (its kubernetes_feature_enabled metric): each gate we turn on is on, and the
    release's DRA defaults stay as they are."""
    metrics = admin.request_bytes("GET", "/metrics").decode()
    enabled = dict(re.findall(r'^kubernetes_feature_enabled\{name="(\w+)",stage="\w*"\} ([01])$', metrics, re.M))
    for gate in FEATURE_GATES[MINOR]:
        assert enabled.get(gate) == "1", gate
    assert enabled.get("DynamicResourceAllocation") == "1"


def test_a_request_without_credentials_is_refused(plane: ControlPlane) -> None:
    context = ssl.create_default_context(cafile=str(plane.pki.ca.cert))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{plane.server_url}/api/v1/namespaces/kube-system/secrets", context=context,
                               timeout=TIMEOUT)
    assert refused.value.code == 403  # anonymous (system:anonymous) is authenticated but RBAC allows it nothing here


def test_the_charts_objects_are_applied(installed: Installed, admin: KubeRest, plane: ControlPlane) -> None:
    rendered = render(plane.config.binaries.release.kubernetes, plane.pki.ca.cert.read_bytes())
    classes = {o["metadata"]["name"] for o in rendered if o["kind"] == "DeviceClass"}
    assert {DRIVER, f"mig.{DRIVER}", f"gpu-share.{DRIVER}"} <= classes
    served = {c["metadata"]["name"] for c in admin.request("GET", "/apis/resource.k8s.io/v1/deviceclasses")["items"]}
    assert classes <= served
    policies = admin.request("GET", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies")["items"]
    assert {p["metadata"]["name"] for p in policies} >= {
        o["metadata"]["name"] for o in rendered if o["kind"] == "ValidatingAdmissionPolicy"}
    crds = admin.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")["items"]
    assert "gpusharingpolicies.gpu.dra.dev" in {c["metadata"]["name"] for c in crds}
    # The controller runs under the chart's ServiceAccount and leads.
    assert installed.controller is not None and installed.controller.process is not None
    assert installed.controller.process.poll() is None
    lease = admin.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/dra-driver-controller")
    assert lease is not None and lease["spec"]["holderIdentity"]


def test_the_webhook_refuses_a_bad_config_through_the_real_api_server(installed: Installed, admin: KubeRest) -> None:
    def claim(percent: int, name: str) -> dict[str, object]:
        params = {"apiVersion": "gpu.dra.dev/v1beta1", "kind": "GpuConfig",
                  "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": percent}}}
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}],
                                     "config": [{"requests": ["gpu"],
                                                 "opaque": {"driver": DRIVER, "parameters": params}}]}}}

    path = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
    with pytest.raises(ApiError) as refused:
        admin.request("POST", path, body=claim(101, "bad"))
    assert refused.value.status == 422
    assert "defaultActiveThreadPercentage: must be a whole number between 1 and 100, got 101" in str(
        refused.value.body)
    created = admin.request("POST", path, body=claim(50, "good"))
    assert created["metadata"]["name"] == "good"


def test_the_fake_plugins_resource_slices_are_accepted_and_another_nodes_refused(
        installed: Installed, plane: ControlPlane, admin: KubeRest, tmp_path: Path) -> None:
    node = "upstream-node-a"
    admin.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    plugin = start_plugin(plane, node, tmp_path, "l4x2")
    try:
        def published() -> list[JsonObject]:
            assert plugin.poll() is None, (tmp_path / "plugin.log").read_text()[-3000:]
            items = admin.request("GET", "/apis/resource.k8s.io/v1/resourceslices",
                                  query={"fieldSelector": f"spec.nodeName={node}"})["items"]
            return [s for s in items if s["spec"]["driver"] == DRIVER]

        slices = wait_for(published, TIMEOUT, f"the plugin's ResourceSlices for {node}", interval=0.2)
        devices = [d["name"] for s in slices for d in s["spec"].get("devices") or []]
        assert {"gpu-0", "gpu-1"} <= set(devices), devices
        assert all(s["spec"]["pool"]["name"] == node for s in slices)

        # The same identity may not write another node's slice: the chart's ValidatingAdmissionPolicy, enforced by
        # the real API server, refuses it with the policy's message.
        as_plugin = connect(str(tmp_path / "plugin.kubeconfig"))
        other = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "stolen"},
                 "spec": {"driver": DRIVER, "nodeName": "someone-else",
                          "pool": {"name": "someone-else", "generation": 1, "resourceSliceCount": 1},
                          "devices": [{"name": "gpu-0"}]}}
        with pytest.raises(ApiError) as refused:
            as_plugin.request("POST", "/apis/resource.k8s.io/v1/resourceslices", body=other)
        assert refused.value.status in (403, 422), refused.value
        assert "may only write ResourceSlices whose spec.nodeName is upstream-node-a" in json.dumps(
            refused.value.body)
    finally:
        plugin.terminate()
        plugin.wait(30)
