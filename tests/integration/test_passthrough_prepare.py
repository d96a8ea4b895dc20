"""Issue 25 item 2 on the sandbox (API server, scheduler, kubelet simulator, the plugin as its own process): a VM
pod's passthrough claim binds its GPU's IOMMU group to vfio-pci in the fake node's PCI state, the claim's CDI spec
names /dev/vfio/<group>, and once the pod is gone the GPU is back on nvidia and offered for containers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.nvml.fake.state import read_fake_state
from dra_sandbox.cluster import NodeSpec, SandboxCluster
from dra_sandbox.deviceclasses import device_classes
from tests.integration.conftest import claim_object, pod_object, sandbox
from tests.polling import wait_for

NODE = "node-vfio"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SandboxCluster]:
    node = NodeSpec(NODE, "fake:dgx-h100", plugin_env={"DRA_DRIVER_PASSTHROUGH": "all"})
    with sandbox("dra-vfio-", [node], device_classes=device_classes(DRIVER_NAME), kube_version="1.37.0") as c:
        yield c


def _vm_claim(name: str) -> dict[str, Any]:
    claim = claim_object(name, f"vfio.{DRIVER_NAME}")
    parameters = {
        "apiVersion": "gpu.dra.dev/v1beta1",
        "kind": "VfioDeviceConfig",
        "iommu": {"backendPolicy": "LegacyOnly", "enableAPIDevice": True},
    }
    claim["spec"]["devices"]["config"] = [{"requests": ["gpu"], "opaque": {"driver": DRIVER_NAME, "parameters": parameters}}]
    return claim


def _phase_is(cluster: SandboxCluster, name: str, phase: str) -> bool:
    pod = cluster.api.get(f"/api/v1/namespaces/default/pods/{name}") or {}
    return bool((pod.get("status") or {}).get("phase") == phase)


def _functions(cluster: SandboxCluster) -> dict[str, tuple[str | None, int | None]]:
    pci = read_fake_state(cluster.plugins[NODE].state_file).pci
    assert pci is not None
    return {f.address: (f.driver, f.iommu_group) for f in pci.functions}


def _published(cluster: SandboxCluster) -> set[str]:
    slices = cluster.items("/apis/resource.k8s.io/v1/resourceslices")
    return {d["name"] for s in slices for d in s["spec"].get("devices", [])}


def test_a_vm_pod_gets_its_gpu_on_vfio_pci_and_gives_it_back(cluster: SandboxCluster) -> None:
    before = _functions(cluster)
    assert {driver for driver, _ in before.values()} == {"nvidia"}
    cluster.apply(_vm_claim("vm"))
    pod = cluster.apply(pod_object("vm", "vm"))
    wait_for(partial(_phase_is, cluster, "vm", "Running"), 60, "the VM pod to run")
    claim = cluster.api.get(f"{CLAIMS}/vm") or {}
    [result] = claim["status"]["allocation"]["devices"]["results"]
    device = result["device"]
    assert device.endswith("-vfio")
    # The pool's counter slice carries sharedCounters and no devices (KEP-5075): hence .get.
    gpu = next(d for s in cluster.items("/apis/resource.k8s.io/v1/resourceslices") for d in s["spec"].get("devices", [])
               if d["name"] == device)
    address = gpu["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
    driver, group = _functions(cluster)[address]
    assert driver == "vfio-pci" and group is not None
    uid = claim["metadata"]["uid"]
    [spec_file] = cluster.cdi_root.glob(f"k8s.{DRIVER_NAME}-claim_{NODE}_{uid}.json")
    raw = spec_file.read_bytes()
    assert f'"path":"/dev/vfio/{group}"'.encode() in raw.replace(b" ", b"")
    spec = json.loads(raw)
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert spec["containerEdits"]["deviceNodes"] == [{"path": "/dev/vfio/vfio", "hostPath": "/dev/null"}]
    # The GPU left NVML's list, but its devices stay published while the VM holds it (no republish race).
    assert device in _published(cluster) and device.removesuffix("-vfio") in _published(cluster)

    cluster.delete(pod)
    wait_for(lambda: cluster.api.get("/api/v1/namespaces/default/pods/vm") is None, 60, "the VM pod gone")
    wait_for(lambda: _functions(cluster)[address][0] == "nvidia", 30, "the GPU back on nvidia")
    assert _functions(cluster) == before
    # The metadata spec goes after the rebind (the device-metadata observer runs after the engine): poll for it.
    wait_for(lambda: not list(cluster.cdi_root.glob(f"*{uid}*")), 30, "the claim's CDI specs removed")
    # Offered for containers again: a container pod gets exactly that GPU.
    container = claim_object("pod", DRIVER_NAME, f"device.attributes['resource.kubernetes.io'].pciBusID == '{address}'")
    cluster.apply(container)
    cluster.apply(pod_object("pod", "pod"))
    wait_for(partial(_phase_is, cluster, "pod", "Running"), 60, "a container pod on the GPU")
    again = (cluster.api.get(f"{CLAIMS}/pod") or {})["status"]["allocation"]["devices"]["results"][0]["device"]
    assert again == device.removesuffix("-vfio")
