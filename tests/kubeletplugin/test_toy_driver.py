"""The kubelet-plugin layer reused by a driver that is not the GPU one (tests/kubeletplugin/toydriver.py): it
registers with the sandbox kubelet simulator, which prepares its claim for a pod, runs the pod with the CDI device
the toy handed out and unprepares the claim when the pod goes; and loading it loads nothing of the GPU driver."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from dra_driver.k8s.client import KubeRest
from dra_driver.kubeletplugin.claims import KubeClaimSource
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.kubelet import (
    CONTAINERS_ANNOTATION,
    Backoff,
    KubeletConfig,
    KubeletSimulator,
    PodSyncConfig,
    RegistrationConfig,
)
from dra_sandbox.kubelet.draclient import ClaimRef  # the kubelet's side of the wire
from dra_sandbox.runtime import CdiCheckedRuntime
from tests.kube_models import meta
from tests.kubeletplugin.toydriver import CDI_KIND, TOY_DEVICE, TOY_DRIVER, ToyDriver, toy_plugin
from tests.polling import wait_for
from tests.sandbox.test_kubelet_fakeplugin import short_tmpdir

MERGE = "application/merge-patch+json"
NAMESPACE = "default"


class ToyNode:
    """One node: the kubelet simulator, the toy driver's plugin on the layer, the API server they share."""

    def __init__(self, server: ApiServer, api: k8s.ApiClient, base: Path) -> None:
        self.node = f"toy-{uuid.uuid4().hex[:8]}"
        self.core, self.res = k8s.CoreV1Api(api), k8s.ResourceV1Api(api)
        self.registry, plugins = base / "registry", base / "plugins"
        self.plugin_dir = plugins / TOY_DRIVER
        self.cdi_dir = base / "cdi"
        boot_id = base / "boot_id"
        boot_id.write_text("boot-1\n")
        self.driver = ToyDriver(
            node_name=self.node,
            plugin_dir=self.plugin_dir,
            cdi_dir=self.cdi_dir,
            claims=KubeClaimSource(KubeRest(server.connection())),
            boot_id_path=boot_id,
        )
        self.plugin = toy_plugin(self.driver, registry_dir=self.registry, plugin_dir=self.plugin_dir)
        self.kubelet = KubeletSimulator(
            KubeletConfig(
                node_name=self.node,
                registry_dir=self.registry,
                plugins_dir=plugins,
                registration=RegistrationConfig(poll_interval_s=0.2, dial_timeout_s=2.0,
                                                backoff=Backoff(0.05, 2.0, 0.2), health_reopen_s=0.1),
                pods=PodSyncConfig(resync_interval_s=0.05, backoff=Backoff(0.1, 2.0, 0.4), wiping_delay_s=0.3,
                                   watch_timeout_s=5, request_timeout_s=10.0),
            ),
            CdiCheckedRuntime([self.cdi_dir]),
            api,
        )

    def claim_and_pod(self) -> tuple[str, str, Any]:
        claim, pod = f"slot-{uuid.uuid4().hex[:6]}", f"pod-{uuid.uuid4().hex[:6]}"
        self.res.create_namespaced_resource_claim(NAMESPACE, k8s.ResourceV1ResourceClaim.model_validate({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": claim},
            "spec": {"devices": {"requests": [{"name": "slot", "exactly": {"deviceClassName": "toy.example.com"}}]}},
        }))
        created = self.core.create_namespaced_pod(NAMESPACE, k8s.V1Pod.model_validate({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod},
            "spec": {
                "nodeName": self.node,
                "resourceClaims": [{"name": "slot", "resourceClaimName": claim}],
                "containers": [{"name": "main", "image": "probe", "resources": {"claims": [{"name": "slot"}]}}],
            },
        }))
        return claim, pod, created

    def allocate(self, claim: str, pod: Any) -> str:
        """What the scheduler would write: the toy's slot of this node, reserved for the pod."""
        body = {"status": {
            "allocation": {"devices": {"results": [{"request": "slot", "driver": TOY_DRIVER, "pool": self.node,
                                                    "device": TOY_DEVICE}]}},
            "reservedFor": [{"resource": "pods", "name": pod.metadata.name, "uid": meta(pod).uid}],
        }}
        out = self.res.patch_namespaced_resource_claim_status(claim, NAMESPACE, body, _content_type=MERGE)
        return str(meta(out).uid)

    def pod(self, name: str) -> Any:
        """The pod, None once it is gone."""
        found = self.core.list_namespaced_pod(NAMESPACE, field_selector=f"metadata.name={name}").items
        return found[0] if found else None

    def running(self, name: str) -> bool:
        pod = self.pod(name)
        return bool(pod and pod.status and pod.status.phase == "Running")

    def recorded(self) -> dict[str, Any]:
        """The toy's checkpoint as it is on disk."""
        path = self.plugin_dir / "checkpoint.json"
        return dict(json.loads(path.read_bytes())["claims"]) if path.exists() else {}


@pytest.fixture
def toy() -> Iterator[ToyNode]:
    base = short_tmpdir()
    with ApiServer() as server, server.api_client() as api:
        node = ToyNode(server, api, base)
        node.kubelet.start()
        try:
            yield node
        finally:
            node.kubelet.stop()
            node.plugin.stop(grace=1.0)
            node.driver.close()
    shutil.rmtree(base, ignore_errors=True)


def test_the_kubelet_registers_the_toy_driver_and_prepares_its_claim_for_a_pod(toy: ToyNode) -> None:
    toy.plugin.start()
    registered = wait_for(lambda: toy.kubelet.plugins.get(TOY_DRIVER), what="the toy driver registered")
    assert registered.service == "v1.DRAPlugin"
    assert registered.health_service == ""  # no health source: the layer does not advertise the health service
    assert registered.endpoint == str(toy.plugin.dra_socket)
    assert toy.plugin.registration.registered.is_set()  # the kubelet's NotifyRegistrationStatus reached the layer

    claim, pod_name, pod = toy.claim_and_pod()
    uid = toy.allocate(claim, pod)
    wait_for(lambda: toy.running(pod_name), what="the pod Running on the toy's device")
    cdi_id = f"{CDI_KIND}={uid}-{TOY_DEVICE}"
    seen = json.loads(toy.pod(pod_name).metadata.annotations[CONTAINERS_ANNOTATION])["main"]
    assert seen["cdiDevices"] == [cdi_id] and seen["env"]["TOY_CLAIM_UID"] == uid  # the toy's CDI spec applied
    assert toy.recorded() == {uid: [cdi_id]}  # in the toy's own checkpoint format, through the layer's store

    # The kubelet asks again (a restart of the kubelet does): the same answer, from the checkpoint.
    again = registered.client.prepare([ClaimRef(NAMESPACE, claim, uid)])
    assert again[uid].devices[0].cdi_device_ids == (cdi_id,)

    toy.core.delete_namespaced_pod(pod_name, NAMESPACE)
    wait_for(lambda: toy.pod(pod_name) is None, what="the pod gone after the kubelet unprepared its claim")
    assert toy.recorded() == {} and not toy.driver.spec_path(uid).exists()


def test_the_layer_refuses_for_the_toy_what_kubernetes_could_not_have_sent(toy: ToyNode) -> None:
    """The claim-identity check is the layer's: a malformed claim never reaches the toy driver's code."""
    toy.plugin.start()
    registered = wait_for(lambda: toy.kubelet.plugins.get(TOY_DRIVER), what="the toy driver registered")
    result = registered.client.prepare([ClaimRef("Not_A_Namespace", "c", "uid-1")])
    assert result["uid-1"].error is not None and "claims[0].namespace" in result["uid-1"].error
    assert toy.recorded() == {}


def test_loading_the_toy_driver_loads_nothing_of_the_gpu_driver() -> None:
    """In a fresh interpreter: the layer and the toy load no module of the GPU driver (the static rule is
    `python -m dra_sandbox.layers`; this checks what really runs)."""
    code = (
        "import json, sys\n"
        "import tests.kubeletplugin.toydriver\n"
        "import dra_driver.kubeletplugin.server, dra_driver.kubeletplugin.publishlease\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root).stdout
    loaded = set(json.loads(out))
    assert "dra_driver.kubeletplugin.server" in loaded and "grpc" in loaded  # the probe really ran
    gpu = ("dra_driver.plugin", "dra_driver.nvml", "dra_driver.inventory", "dra_driver.slices", "dra_driver.cdi",
           "dra_driver.claimconfig", "pynvml")
    assert sorted(m for m in loaded if m.split(".")[0] == "pynvml" or m.startswith(tuple(p + "." for p in gpu))
                  or m in gpu) == []
