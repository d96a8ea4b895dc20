"""Integration: the kubelet simulator against the sandbox API server (official `kubernetes` client), the
TEST plugin over real unix sockets, and a container runtime (the CDI check; podman where usable)."""

from __future__ import annotations

import json
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dra_sandbox.kubelet import (
    CONTAINERS_ANNOTATION,
    Backoff,
    KubeletConfig,
    KubeletSimulator,
    PodSyncConfig,
    RegistrationConfig,
    run_kubelet,
)
from dra_sandbox.runtime import CdiCheckedRuntime, ContainerRuntime, PodmanRuntime
from tests.kube_models import meta, name_of
from tests.narrow import present
from tests.polling import wait_for
from tests.sandbox.test_kubelet_fakeplugin import FakePlugin, short_tmpdir

try:
    from dra_sandbox.apiserver import ApiServer
except ImportError as exc:  # pragma: no cover - only while the API server is being written
    pytest.skip(f"dra_sandbox.apiserver is not importable yet: {exc}", allow_module_level=True)

DRIVER = "gpu.test.dev"
MERGE = "application/merge-patch+json"


class Cluster:
    """One node: a kubelet simulator + a test plugin + helpers to create pods and claims."""

    def __init__(self, api: k8s.ApiClient, base: Path, runtime: ContainerRuntime | None = None,
                 cdi_kind: str = "test.dev/gpu", cdi_dir: Path | None = None) -> None:
        self.node = f"node-{uuid.uuid4().hex[:8]}"
        self.ns = "default"
        self.core = k8s.CoreV1Api(api)
        self.res = k8s.ResourceV1Api(api)
        self.base = base
        self.cdi_dir = cdi_dir or base / "cdi"
        self.plugin = FakePlugin(base / "registry", base / "plugins", driver=DRIVER, cdi_kind=cdi_kind,
                                 cdi_dir=self.cdi_dir, cdi_mount=base)
        self.runtime = runtime or CdiCheckedRuntime([self.cdi_dir])
        config = KubeletConfig(
            node_name=self.node,
            registry_dir=base / "registry",
            plugins_dir=base / "plugins",
            registration=RegistrationConfig(poll_interval_s=0.2, dial_timeout_s=2.0,
                                            backoff=Backoff(0.05, 2.0, 0.2), health_reopen_s=0.1),
            pods=PodSyncConfig(resync_interval_s=0.05, backoff=Backoff(0.1, 2.0, 0.4), wiping_delay_s=0.3,
                               watch_timeout_s=5, request_timeout_s=10.0),
        )
        self.kubelet = KubeletSimulator(config, self.runtime, api)

    def name(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:6]}"

    def claim(self, name: str) -> Any:
        return self.res.create_namespaced_resource_claim(self.ns, k8s.ResourceV1ResourceClaim.model_validate({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.test"}}]}},
        }))

    def pod(self, name: str, claims: dict[str, str], restart: str = "Always") -> Any:
        return self.core.create_namespaced_pod(self.ns, k8s.V1Pod.model_validate({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {
                "nodeName": self.node,
                "restartPolicy": restart,
                "resourceClaims": [{"name": pc, "resourceClaimName": cn} for pc, cn in claims.items()],
                "containers": [
                    {"name": "main", "image": "probe", "env": [{"name": "FROM_POD", "value": "yes"}],
                     "resources": {"claims": [{"name": pc} for pc in claims]}},
                    {"name": "sidecar", "image": "probe"},
                ],
            },
        }))

    def allocate(self, claim: str, pods: list[Any], device: str = "gpu-0") -> str:
        body = {"status": {
            "allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "node-1",
                                                    "device": device}]}},
            "reservedFor": [{"resource": "pods", "name": name_of(p), "uid": meta(p).uid} for p in pods],
        }}
        out = self.res.patch_namespaced_resource_claim_status(claim, self.ns, body, _content_type=MERGE)
        return str(meta(out).uid)

    def read_pod(self, name: str) -> Any:
        try:
            return self.core.read_namespaced_pod(name, self.ns)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def phase(self, name: str) -> str | None:
        pod = self.read_pod(name)
        return pod.status.phase if pod and pod.status else None

    def condition(self, name: str, kind: str) -> Any:
        pod = self.read_pod(name)
        return next((c for c in (pod.status.conditions or []) if c.type == kind), None) if pod else None

    def seen(self, name: str) -> dict[str, Any]:
        return dict(json.loads(self.read_pod(name).metadata.annotations[CONTAINERS_ANNOTATION]))

    def slice(self, name: str, node: str, driver: str = DRIVER) -> None:
        self.res.create_resource_slice(k8s.V1ResourceSlice.model_validate({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                  "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0"}]},
        }))

    def slices_of(self, node: str) -> list[str]:
        return [name_of(s) for s in self.res.list_resource_slice(field_selector=f"spec.nodeName={node}").items]


@pytest.fixture
def cluster(api: k8s.ApiClient) -> Iterator[Cluster]:
    base = short_tmpdir()
    c = Cluster(api, base)
    yield c
    c.kubelet.stop()
    c.plugin.stop()
    shutil.rmtree(base, ignore_errors=True)


def test_pod_lifecycle_prepare_run_delete(cluster: Cluster) -> None:
    c = cluster
    other = f"other-{c.node}"
    c.slice(c.name("mine"), c.node)
    c.slice(c.name("theirs"), other)
    c.kubelet.start()
    # At start the kubelet deletes its own node's slices, never another node's.
    assert c.slices_of(c.node) == [] and len(c.slices_of(other)) == 1

    claim_name, pod_name = c.name("claim"), c.name("pod")
    c.claim(claim_name)
    pod = c.pod(pod_name, {"gpu": claim_name})
    # Not allocated yet: the pod waits and says why.
    wait_for(lambda: c.condition(pod_name, "PodReadyToStartContainers"), what="waiting condition")
    cond = c.condition(pod_name, "PodReadyToStartContainers")
    assert cond.status == "False" and cond.reason == "WaitingForResourceClaims"
    assert "not allocated" in cond.message

    c.plugin.start()  # registers through the watcher
    uid = c.allocate(claim_name, [pod])
    wait_for(lambda: c.phase(pod_name) == "Running", what="pod Running")
    assert c.plugin.calls.prepare == [("v1", [uid])]
    seen = c.seen(pod_name)
    main, sidecar = seen["main"], seen["sidecar"]
    assert main["cdiDevices"] == [c.plugin.cdi_id(uid)]
    assert main["env"]["DRA_CLAIM_UID"] == uid and main["env"]["DRA_DEVICE_0"] == "gpu-0"
    assert main["env"]["FROM_POD"] == "yes"
    assert "/usr/local/dra" in [m["target"] for m in main["mounts"]]
    assert main["executed"] is False and "not executed" in main["note"]  # the CDI-check runtime says so
    assert sidecar["cdiDevices"] == [] and "DRA_CLAIM_UID" not in sidecar["env"]
    status = c.read_pod(pod_name).status
    assert [s.state.running is not None for s in status.container_statuses] == [True, True]
    assert c.condition(pod_name, "Ready").status == "True"

    # Graceful deletion: the kubelet unprepares, then confirms, then the pod is gone.
    c.core.delete_namespaced_pod(pod_name, c.ns)
    wait_for(lambda: c.read_pod(pod_name) is None, what="pod removed after confirmation")
    assert c.plugin.calls.unprepare == [("v1", [uid])]
    assert not (c.cdi_dir / c.plugin.spec_file(uid)).exists()
    assert c.kubelet.pods is not None and c.kubelet.pods.prepared_claims() == {}


def test_failed_prepare_sets_condition_event_and_retries(cluster: Cluster) -> None:
    c = cluster
    c.kubelet.start()
    c.plugin.start()
    claim_name, pod_name = c.name("claim"), c.name("pod")
    c.claim(claim_name)
    pod = c.pod(pod_name, {"gpu": claim_name})
    uid = str(meta(c.res.read_namespaced_resource_claim(claim_name, c.ns)).uid)
    c.plugin.prepare_errors[uid] = ["GPU 0 is busy", "GPU 0 is busy", "GPU 0 is busy"]
    c.allocate(claim_name, [pod])
    wait_for(lambda: (cond := c.condition(pod_name, "PodReadyToStartContainers")) is not None
             and cond.reason == "FailedPrepareDynamicResources", what="failure condition")
    cond = c.condition(pod_name, "PodReadyToStartContainers")
    assert "GPU 0 is busy" in cond.message and c.phase(pod_name) == "Pending"
    # The status is written before the Event (as kubelet's recorder sends events asynchronously): poll for it.
    def mine_events() -> list[Any]:
        return [e for e in c.core.list_namespaced_event(c.ns).items if e.involved_object.name == pod_name]
    wait_for(lambda: bool(mine_events()), what="failure event")
    mine = mine_events()
    assert mine[0].reason == "FailedPrepareDynamicResources" and "GPU 0 is busy" in present(mine[0].message)
    # Retried with backoff until the plugin succeeds.
    wait_for(lambda: c.phase(pod_name) == "Running", what="pod Running after retries")
    assert [uids for _, uids in c.plugin.calls.prepare] == [[uid]] * 4
    assert c.condition(pod_name, "PodReadyToStartContainers").status == "True"


def test_shared_claim_is_unprepared_only_when_its_last_pod_goes(cluster: Cluster) -> None:
    c = cluster
    c.kubelet.start()
    c.plugin.start()
    claim_name, first, second = c.name("claim"), c.name("a"), c.name("b")
    c.claim(claim_name)
    pods = [c.pod(first, {"gpu": claim_name}), c.pod(second, {"shared-gpu": claim_name})]
    uid = c.allocate(claim_name, pods)
    wait_for(lambda: c.phase(first) == "Running" and c.phase(second) == "Running", what="both Running")
    assert c.plugin.calls.prepare == [("v1", [uid])]  # prepared once for both pods
    assert c.seen(second)["main"]["cdiDevices"] == [c.plugin.cdi_id(uid)]
    c.core.delete_namespaced_pod(first, c.ns)
    wait_for(lambda: c.read_pod(first) is None, what="first pod gone")
    assert c.plugin.calls.unprepare == []  # still used by the second pod
    c.core.delete_namespaced_pod(second, c.ns)
    wait_for(lambda: c.read_pod(second) is None, what="second pod gone")
    assert c.plugin.calls.unprepare == [("v1", [uid])]


def test_finished_pod_releases_its_claim(cluster: Cluster) -> None:
    c = cluster
    c.kubelet.start()
    c.plugin.start()
    claim_name, pod_name = c.name("claim"), c.name("job")
    c.claim(claim_name)
    uid = c.allocate(claim_name, [c.pod(pod_name, {"gpu": claim_name}, restart="Never")])
    wait_for(lambda: c.phase(pod_name) == "Succeeded", what="pod Succeeded")
    wait_for(lambda: c.plugin.calls.unprepare == [("v1", [uid])], what="unprepare after the pod finished")
    terminated = c.read_pod(pod_name).status.container_statuses[0].state.terminated
    assert terminated.exit_code == 0 and terminated.reason == "Completed"


def test_unprepare_failure_is_retried(cluster: Cluster) -> None:
    c = cluster
    c.kubelet.start()
    c.plugin.start()
    claim_name, pod_name = c.name("claim"), c.name("pod")
    c.claim(claim_name)
    uid = c.allocate(claim_name, [c.pod(pod_name, {"gpu": claim_name})])
    wait_for(lambda: c.phase(pod_name) == "Running", what="pod Running")
    c.plugin.prepare_errors[uid] = ["device busy"]  # the fake uses this list for unprepare too
    c.core.delete_namespaced_pod(pod_name, c.ns)
    wait_for(lambda: c.read_pod(pod_name) is None, what="pod gone after the unprepare retry")
    assert [uids for _, uids in c.plugin.calls.unprepare] == [[uid], [uid]]


def test_driver_slices_wiped_after_its_plugin_is_gone(cluster: Cluster) -> None:
    c = cluster
    c.kubelet.start()
    c.plugin.start()
    wait_for(lambda: c.kubelet.plugins.get(DRIVER), what="registration")
    c.slice(c.name("mine"), c.node)
    c.slice(c.name("other-driver"), c.node, driver="nic.test.dev")
    c.plugin.stop_registration()
    wait_for(lambda: len(c.slices_of(c.node)) == 1, what="the gone driver's slices wiped")
    remaining = c.res.list_resource_slice(field_selector=f"spec.nodeName={c.node}").items
    assert [s.spec.driver for s in remaining] == ["nic.test.dev"]


@pytest.fixture
def podman_work_dir() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_real_container_through_podman(api: k8s.ApiClient, podman_work_dir: Path) -> None:
    podman = PodmanRuntime(work_dir=podman_work_dir)
    availability = podman.availability()
    if not availability.usable:
        pytest.skip(f"podman not usable: {availability.reason}")
    run_cdi = Path("/var/run/cdi")
    try:
        run_cdi.mkdir(parents=True, exist_ok=True)
        probe = run_cdi / f".write-test-{uuid.uuid4().hex}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        pytest.skip(f"{run_cdi} not writable (podman reads CDI specs only there): {exc}")
    base = short_tmpdir()
    (base / "marker").write_text("host-side\n")
    kind = f"k-{uuid.uuid4().hex[:8]}.test.dev/gpu"
    c = Cluster(api, base, runtime=podman, cdi_kind=kind, cdi_dir=run_cdi)
    try:
        c.kubelet.start()
        c.plugin.start()
        claim_name, pod_name = c.name("claim"), c.name("pod")
        c.claim(claim_name)
        uid = c.allocate(claim_name, [c.pod(pod_name, {"gpu": claim_name})])
        wait_for(lambda: c.phase(pod_name) == "Running", timeout=30, what="pod Running with podman")
        main = c.seen(pod_name)["main"]
        assert main["executed"] is True and main["runtime"] == "podman"
        assert main["env"]["DRA_CLAIM_UID"] == uid and main["env"]["FROM_POD"] == "yes"
        assert "/usr/local/dra" in [m["target"] for m in main["mounts"]]
        c.core.delete_namespaced_pod(pod_name, c.ns)
        wait_for(lambda: c.read_pod(pod_name) is None, what="pod gone")
        assert not (run_cdi / c.plugin.spec_file(uid)).exists()
    finally:
        c.kubelet.stop()
        c.plugin.stop()
        for leftover in run_cdi.glob(f"{kind.split('/')[0]}-*"):
            leftover.unlink()
        shutil.rmtree(base, ignore_errors=True)


def test_run_kubelet_entry_point(tmp_path: Path) -> None:
    base = short_tmpdir()
    plugin = FakePlugin(base / "registry", base / "plugins", driver=DRIVER)
    node = f"node-{uuid.uuid4().hex[:8]}"
    stop = threading.Event()
    with ApiServer() as server:
        kubeconfig = tmp_path / "kubeconfig"
        server.write_kubeconfig(kubeconfig)
        api = server.api_client()
        res = k8s.ResourceV1Api(api)
        res.create_resource_slice(k8s.V1ResourceSlice.model_validate({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "stale"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                 "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0"}]},
        }))
        thread = threading.Thread(
            target=run_kubelet, args=(node, kubeconfig, base / "registry", base / "plugins", "cdi-check", stop),
            daemon=True,
        )
        thread.start()
        try:
            plugin.start()
            wait_for(lambda: plugin.calls.notifications == [(True, "")], what="registration via run_kubelet")
            assert res.list_resource_slice(field_selector=f"spec.nodeName={node}").items == []
        finally:
            stop.set()
            thread.join(timeout=15)
            plugin.stop()
            api.close()  # type: ignore[no-untyped-call]  # ApiClient.close is unannotated
            shutil.rmtree(base, ignore_errors=True)
        assert not thread.is_alive()


def test_init_containers_run_in_order_before_the_main_containers(cluster: Cluster) -> None:
    c = cluster
    c.kubelet.start()
    c.plugin.start()
    claim_name, pod_name = c.name("claim"), c.name("init-pod")
    c.claim(claim_name)
    pod = c.core.create_namespaced_pod(c.ns, k8s.V1Pod.model_validate({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod_name},
        "spec": {
            "nodeName": c.node,
            "restartPolicy": "Always",
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "initContainers": [
                {"name": "init-a", "image": "probe", "resources": {"claims": [{"name": "gpu"}]}},
                {"name": "init-b", "image": "probe"},
            ],
            "containers": [{"name": "main", "image": "probe", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }))
    uid = c.allocate(claim_name, [pod])
    wait_for(lambda: c.phase(pod_name) == "Running", what="pod Running after its init containers")
    status = c.read_pod(pod_name).status
    inits = status.init_container_statuses
    assert [s.name for s in inits] == ["init-a", "init-b"]
    assert all(s.state.terminated is not None and s.state.terminated.exit_code == 0 for s in inits)
    assert c.condition(pod_name, "Initialized").status == "True"
    seen = c.seen(pod_name)
    assert seen["init-a"]["cdiDevices"] == [c.plugin.cdi_id(uid)]  # an init container gets its claim's devices
    assert seen["init-b"]["cdiDevices"] == []
    assert seen["main"]["cdiDevices"] == [c.plugin.cdi_id(uid)]
