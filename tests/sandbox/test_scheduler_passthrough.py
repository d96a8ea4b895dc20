"""One offer per GPU through the sandbox (docs/passthrough.md): the API server admits what the kubelet plugin publishes
with `--passthrough all` on every supported version, the main class never selects a VFIO device, and the scheduler
stand-in gives a GPU either to a VM claim (`vfio.<driver>`) or to container claims (whole GPU, MIG partitions,
shares), never both, in either order, saying why on the pod; `dra-driver explain` names what holds the GPU.
Each step calls `reconcile()` directly: no background thread, no waiting."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.allocation import allocate
from dra_driver.allocation.explain import explain_text
from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.passthrough import passthrough_settings
from dra_driver.inventory.sharing import EXCLUSIVE, sharing_settings
from dra_driver.k8s.client import KubeRest
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.kubelet.nodestatus import ready_node
from dra_sandbox.scheduler import SandboxScheduler
from tests.allocation.objects import claim, exact, node
from tests.integration.conftest import explained
from tests.sandbox.conftest import create_claim

NODE = "dgx-1"
RESOURCE = "/apis/resource.k8s.io/v1"
VFIO_CLASS = f"vfio.{DRIVER_NAME}"
MIG_CLASS = f"mig.{DRIVER_NAME}"
SHARE_CLASS = f"gpu-share.{DRIVER_NAME}"
GPU0 = f"device.attributes['{DRIVER_NAME}'].index == 0"
# The VFIO device has no `index` (NVIDIA's attribute set): a VM claim names its GPU by PCI address.
VFIO_GPU0 = "device.attributes['resource.kubernetes.io'].pciBusID == '{bus}'"
MIG_GPU0 = f"device.attributes['{DRIVER_NAME}'].parentUUID == '{{uuid}}'"


def published_slices(kube_version: tuple[int, int] = (1, 36), mig: MigOffering = MigOffering.DYNAMIC,
                     sharing: str = "exclusive") -> tuple[list[dict[str, Any]], Any]:
    backend = open_backend("fake:dgx-h100")
    backend.init()
    try:
        inventory = discover(backend)
    finally:
        backend.shutdown()
    passthrough = passthrough_settings("all")
    settings = sharing_settings(sharing, shared_gpus="0") if sharing != "exclusive" else EXCLUSIVE
    devices = catalog(inventory, mig, settings, passthrough)
    slice_settings = SliceSettings(DRIVER_NAME, NODE, kube_version=kube_version, sharing=settings,
                                   passthrough=passthrough)
    return build_slices(inventory.system, devices, slice_settings, generation=1), inventory


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[KubeRest, Any, Path]]:
    """The API server with the node, the classes and the published slices: its client, the node's inventory and a
    kubeconfig for `dra-driver explain`."""
    with ApiServer(kube_version="1.36.0") as server:
        rest = server.rest()
        rest.request("POST", "/api/v1/nodes", body=ready_node(NODE))
        for obj in device_classes(DRIVER_NAME):
            rest.request("POST", f"{RESOURCE}/deviceclasses", body=obj)
        slices, inventory = published_slices(sharing="shares")
        for obj in slices:
            rest.request("POST", f"{RESOURCE}/resourceslices", body=obj)  # the server validates each one
        yield rest, inventory, server.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.mark.parametrize("version", ["1.34.0", "1.35.0", "1.36.0", "1.37.0"])
def test_every_supported_api_server_admits_the_published_slices(version: str) -> None:
    minor = int(version.split(".")[1])
    with ApiServer(kube_version=version) as server:
        rest = server.rest()
        for obj in published_slices((1, minor))[0]:
            created = rest.request("POST", f"{RESOURCE}/resourceslices", body=obj)
            # Nothing dropped: counters are what keeps a GPU's two offers apart.
            assert created["spec"].get("devices", []) == obj["spec"].get("devices", [])
            assert created["spec"].get("sharedCounters", []) == obj["spec"].get("sharedCounters", [])


def results(rest: KubeRest, name: str) -> list[str] | None:
    obj = rest.request("GET", f"{RESOURCE}/namespaces/default/resourceclaims/{name}")
    allocation = (obj.get("status") or {}).get("allocation")
    return None if allocation is None else [r["device"] for r in allocation["devices"]["results"]]


def scheduling_message(rest: KubeRest, name: str) -> str:
    pod = rest.request("GET", f"/api/v1/namespaces/default/pods/pod-{name}")
    conditions = (pod.get("status") or {}).get("conditions") or []
    return " ".join(str(c.get("message", "")) for c in conditions if c.get("type") == "PodScheduled")


def vm_claim(rest: KubeRest, name: str, bus: str) -> None:
    create_claim(rest, name, {"deviceClassName": VFIO_CLASS,
                              "selectors": [{"cel": {"expression": VFIO_GPU0.format(bus=bus)}}]})


def test_the_gpu_class_never_selects_a_vfio_device_and_the_vfio_class_only_those() -> None:
    slices, _ = published_slices()
    classes = device_classes(DRIVER_NAME)
    everything = claim([exact("gpu", DRIVER_NAME, mode="All")], name="all-gpus")
    outcome = allocate(everything, node=node(NODE), classes=classes, slices=slices, allocated_claims=[])
    assert outcome.allocation is not None, outcome.explanation
    got = [r["device"] for r in outcome.allocation["devices"]["results"]]
    assert got == [f"gpu-{i}" for i in range(8)]
    vms = claim([exact("vm", VFIO_CLASS, mode="All")], name="all-vms")
    outcome = allocate(vms, node=node(NODE), classes=classes, slices=slices, allocated_claims=[])
    assert outcome.allocation is not None, outcome.explanation
    assert [r["device"] for r in outcome.allocation["devices"]["results"]] == [f"gpu-{i}-vfio" for i in range(8)]


def test_a_container_claim_on_the_gpu_keeps_the_vm_claim_out_and_the_other_way_round(
    cluster: tuple[KubeRest, Any, Path],
) -> None:
    rest, inventory, kubeconfig = cluster
    bus = inventory.gpus[0].info.pci_bus_id
    scheduler = SandboxScheduler(rest)
    create_claim(rest, "whole", {"deviceClassName": DRIVER_NAME, "selectors": [{"cel": {"expression": GPU0}}]})
    scheduler.reconcile()
    assert results(rest, "whole") == ["gpu-0"]
    vm_claim(rest, "vm", bus)
    scheduler.reconcile()
    assert results(rest, "vm") is None
    assert "cannot allocate all claims" in scheduling_message(rest, "vm")
    message = explained(kubeconfig, "vm")
    assert "the GPU is in use for containers" in message and "gpu-0 (claim default/whole)" in message

    # The container pod goes: its claim is released, the VM claim gets the GPU; now containers wait.
    rest.request("DELETE", "/api/v1/namespaces/default/pods/pod-whole?gracePeriodSeconds=0")
    scheduler.reconcile()
    scheduler.reconcile()
    assert results(rest, "vm") == ["gpu-0-vfio"]
    create_claim(rest, "again", {"deviceClassName": DRIVER_NAME, "selectors": [{"cel": {"expression": GPU0}}]})
    create_claim(rest, "mig", {"deviceClassName": MIG_CLASS, "selectors": [{"cel": {
        "expression": MIG_GPU0.format(uuid=inventory.gpus[0].uuid)}}]})
    create_claim(rest, "share", {"deviceClassName": SHARE_CLASS})
    scheduler.reconcile()
    assert results(rest, "again") is None and results(rest, "mig") is None
    assert "cannot allocate all claims" in scheduling_message(rest, "again")
    assert "held by gpu-0-vfio (claim default/vm)" in explained(kubeconfig, "again")
    # A share without a selector goes elsewhere? No: only GPU 0 is shared (`--shared-gpus 0`), and it is the VM's.
    assert results(rest, "share") is None
    assert "cannot allocate all claims" in scheduling_message(rest, "share")
    assert "held by gpu-0-vfio (claim default/vm)" in explained(kubeconfig, "share")


def test_explain_names_the_mig_devices_and_claims_that_hold_the_gpu() -> None:
    slices, inventory = published_slices()
    classes = device_classes(DRIVER_NAME)
    gpu0 = inventory.gpus[0]
    mig = claim([exact("gpu", MIG_CLASS, selectors=[MIG_GPU0.format(uuid=gpu0.uuid)])], name="training")
    outcome = allocate(mig, node=node(NODE), classes=classes, slices=slices, allocated_claims=[])
    assert outcome.allocation is not None, outcome.explanation
    held = [{**mig, "status": {"allocation": outcome.allocation}}]
    mig_device = outcome.allocation["devices"]["results"][0]["device"]
    vm = claim([exact("gpu", VFIO_CLASS, selectors=[VFIO_GPU0.format(bus=gpu0.info.pci_bus_id)])], name="vm")
    outcome = allocate(vm, node=node(NODE), classes=classes, slices=slices, allocated_claims=held)
    assert outcome.allocation is None
    text = explain_text(outcome)
    assert "the GPU is in use for containers: a passthrough device needs the GPU's whole counter set" in text
    assert f"gpu-0-vfio (held by {mig_device} (claim default/training))" in text
    # Another GPU is free for the VM.
    other = claim([exact("gpu", VFIO_CLASS)], name="vm2")
    outcome = allocate(other, node=node(NODE), classes=classes, slices=slices, allocated_claims=held)
    assert outcome.allocation is not None
    assert outcome.allocation["devices"]["results"][0]["device"] == "gpu-1-vfio"
