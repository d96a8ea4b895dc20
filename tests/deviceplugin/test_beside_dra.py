"""The GPU kubelet plugin with `--device-plugin` on, against a fake kubelet (fakekubelet.py) and the sandbox API
server: it registers nvidia.com/gpu, lists the GPUs with their health and NUMA node, allocates with CDI names, and
keeps every GPU in one world at a time (docs/device-plugin.md "One GPU, one world"); GPUs return when PodResources
stops listing them, and a kubelet restart is followed by a new registration."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest

from dra_driver._gen import deviceplugin_v1beta1_pb2 as dp
from dra_driver._gen import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from dra_driver.commands.explain import _explain as explain_command
from dra_driver.commands.status import SLICES_PATH, status_text
from dra_driver.defaults import DRIVER_NAME
from dra_driver.deviceplugin.published import HeldGpu, held_in_slices
from dra_driver.deviceplugin.settings import DevicePluginSettings
from dra_driver.inventory.catalog import MigOffering
from dra_driver.k8s.client import KubeRest
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.nvml.factory import open_backend
from dra_driver.plugin.app import KubeletPlugin
from dra_driver.plugin.settings import PluginSettings
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.objects import create_allocated_claim
from tests.deviceplugin.fakekubelet import RESOURCE, FakeKubelet
from tests.plugin.conftest import plugin_settings
from tests.polling import wait_for

NODE = "n1"


@dataclass
class Rig:
    plugin: KubeletPlugin
    kubelet: FakeKubelet
    server: ApiServer
    channel: grpc.Channel
    settings: PluginSettings

    def restart(self) -> None:
        """The plugin process ends and a new one starts on the same node (its dirs, its fake GPUs' state)."""
        self.plugin.stop()
        backend = open_backend("fake:dgx-h100")
        backend.init()
        self.plugin = KubeletPlugin(self.settings, nvml=backend, rest=KubeRest(self.server.connection()))
        self.plugin.start()

    @property
    def stub(self) -> dp_grpc.DevicePluginStub:
        return dp_grpc.DevicePluginStub(self.channel)

    def gpu_uuid(self, device: str) -> str:
        return self.plugin.devices()[device].gpu.uuid

    def claim(self, name: str, devices: list[str]) -> ClaimRef:
        claim = create_allocated_claim(self.server.rest(), namespace="default", name=name, driver=DRIVER_NAME,
                                       pool=NODE, devices=devices)  # fmt: skip
        return ClaimRef("default", name, claim["metadata"]["uid"])

    def sliced(self) -> set[str]:
        return {d["name"] for s in self.plugin.desired_slices(0) for d in s["spec"].get("devices") or []}

    def first_list(self) -> dict[str, dp.Device]:
        stream = self.stub.ListAndWatch(dp.Empty(), timeout=10)
        try:
            return {d.ID: d for d in next(stream).devices}
        finally:
            stream.cancel()


@pytest.fixture
def rig() -> Iterator[Rig]:
    work = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))  # short: unix socket paths stay < 108 bytes
    kubelet = FakeKubelet(work / "dp", work / "pr" / "kubelet.sock")
    kubelet.start()
    backend = open_backend("fake:dgx-h100")
    backend.init()
    settings = replace(plugin_settings(work, NODE, MigOffering.STATIC), usage_interval=0, device_plugin=(
        DevicePluginSettings(directory=kubelet.directory, pod_resources_socket=kubelet.pod_resources,
                             watch_interval=0.05, reconcile_interval=0.05, grace=0.0)))  # fmt: skip
    with ApiServer(kube_version="1.36.0") as server:
        server.rest().request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node",
                                                              "metadata": {"name": NODE}})  # fmt: skip
        plugin = KubeletPlugin(settings, nvml=backend, rest=KubeRest(server.connection()))
        plugin.start()
        channel = grpc.insecure_channel(f"unix://{kubelet.directory / 'gpu.dra.dev.sock'}")
        try:
            rig = Rig(plugin, kubelet, server, channel, settings)
            yield rig
        finally:
            channel.close()
            rig.plugin.stop()
            kubelet.stop()
            shutil.rmtree(work, ignore_errors=True)


def test_it_registers_and_lists_every_whole_gpu_healthy_with_its_numa_node(rig: Rig) -> None:
    [request] = wait_for(lambda: rig.kubelet.registered, 10, "a Register call")
    assert (request.version, request.endpoint, request.resource_name) == ("v1beta1", "gpu.dra.dev.sock", RESOURCE)
    assert request.options.get_preferred_allocation_available and not request.options.pre_start_required
    listed = rig.first_list()
    assert set(listed) == {rig.gpu_uuid(f"gpu-{m}") for m in range(8)}
    assert {d.health for d in listed.values()} == {"Healthy"}
    numa = rig.plugin.devices()["gpu-0"].gpu.topology.numa_node
    assert [n.ID for n in listed[rig.gpu_uuid("gpu-0")].topology.nodes] == [numa]
    options = rig.stub.GetDevicePluginOptions(dp.Empty(), timeout=5)
    assert options.get_preferred_allocation_available


def test_an_allocated_gpu_leaves_the_slices_and_a_claim_on_it_is_refused_until_it_returns(rig: Rig) -> None:
    gpu = rig.gpu_uuid("gpu-3")
    rig.kubelet.in_use = {gpu}  # the kubelet lists it for the pod from here on (grace is 0 in this rig)
    answer = rig.stub.Allocate(dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=[gpu])]),
                               timeout=10)  # fmt: skip
    [container] = answer.container_responses
    [cdi] = [d.name for d in container.cdi_devices]
    assert cdi.startswith(f"k8s.{DRIVER_NAME}/deviceplugin=") and cdi.endswith("-gpu-3")
    assert not container.envs and not container.devices and not container.mounts  # CDI only
    [spec] = [p for p in rig.plugin.settings.cdi_root.iterdir() if "deviceplugin" in p.name]
    assert f"NVIDIA_VISIBLE_DEVICES={gpu}" in spec.read_text()
    assert "gpu-3" not in rig.sliced() and "gpu-2" in rig.sliced()
    # A claim allocated from an older slice (the race the slices cannot close) is refused at prepare.
    ref = rig.claim("late", ["gpu-3"])
    error = rig.plugin.claim_engine.prepare([ref])[ref.uid].error
    assert "allocated to a pod through the device plugin" in error and gpu in error
    # The pod ends: PodResources no longer lists the GPU, the record lets it go, its spec is removed, DRA has it again.
    rig.kubelet.in_use = set()
    wait_for(lambda: "gpu-3" in rig.sliced(), 10, "gpu-3 back in the slices")
    wait_for(lambda: not spec.exists(), 10, "the allocation's CDI spec removed")
    assert rig.plugin.claim_engine.prepare([ref])[ref.uid].error == ""


def test_a_gpu_prepared_by_dra_is_unhealthy_to_the_kubelet_and_refused_by_allocate(rig: Rig) -> None:
    ref = rig.claim("dra", ["gpu-5"])
    assert rig.plugin.claim_engine.prepare([ref])[ref.uid].error == ""
    gpu = rig.gpu_uuid("gpu-5")
    assert rig.first_list()[gpu].health == "Unhealthy"
    assert rig.first_list()[rig.gpu_uuid("gpu-4")].health == "Healthy"
    with pytest.raises(grpc.RpcError) as refused:
        rig.stub.Allocate(dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=[gpu])]),
                          timeout=10)  # fmt: skip
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "gpu-5" in str(refused.value.details()) and "DRA" in str(refused.value.details())
    assert rig.plugin.claim_engine.unprepare([ref])[ref.uid] == ""
    wait_for(lambda: rig.first_list()[gpu].health == "Healthy", 10, "gpu-5 healthy again after the unprepare")


def test_list_and_watch_sends_a_new_list_when_the_health_board_changes(rig: Rig) -> None:
    stream = rig.stub.ListAndWatch(dp.Empty(), timeout=20)
    try:
        first = next(stream)
        assert {d.health for d in first.devices} == {"Healthy"}
        rig.plugin.health.update(rig.plugin.devices(), unhealthy={"gpu-2": "XID 79: fallen off the bus"})
        second = next(stream)
        bad = {d.ID for d in second.devices if d.health == "Unhealthy"}
        assert bad == {rig.gpu_uuid("gpu-2")}
    finally:
        stream.cancel()


def test_bad_requests_are_refused_naming_the_field(rig: Rig) -> None:
    with pytest.raises(grpc.RpcError) as unknown:
        rig.stub.Allocate(dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(
            devices_ids=["GPU-not-here"])]), timeout=10)  # fmt: skip
    assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "container_requests[0].devices_ids[0]" in str(unknown.value.details())
    with pytest.raises(grpc.RpcError) as empty:
        rig.stub.Allocate(dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest()]), timeout=10)
    assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not rig.plugin.device_plugin or not rig.plugin.device_plugin.agent.ownership.load().allocated


def test_preferred_allocation_answers_from_the_inventory(rig: Rig) -> None:
    ids = [rig.gpu_uuid(f"gpu-{m}") for m in range(8)]
    answer = rig.stub.GetPreferredAllocation(dp.PreferredAllocationRequest(container_requests=[
        dp.ContainerPreferredAllocationRequest(available_deviceIDs=ids, must_include_deviceIDs=[ids[5]],
                                               allocation_size=2)]), timeout=10)  # fmt: skip
    [chosen] = answer.container_responses
    assert len(chosen.deviceIDs) == 2 and chosen.deviceIDs[0] == ids[5]
    assert rig.stub.PreStartContainer(dp.PreStartContainerRequest(), timeout=5) == dp.PreStartContainerResponse()


def test_a_kubelet_restart_is_followed_by_a_new_registration(rig: Rig) -> None:
    wait_for(lambda: rig.kubelet.registered, 10, "the first Register call")
    rig.kubelet.start()  # removes the plugin's socket and makes kubelet.sock again, as upstream's device manager
    wait_for(lambda: len(rig.kubelet.registered) >= 2, 10, "a second Register call")
    wait_for(lambda: (rig.kubelet.directory / "gpu.dra.dev.sock").is_socket(), 10, "the plugin's socket again")
    assert len(rig.first_list()) == 8  # served on the new socket


def _allocate(rig: Rig, device: str) -> str:
    gpu = rig.gpu_uuid(device)
    rig.stub.Allocate(dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=[gpu])]),
                      timeout=10)  # fmt: skip
    return gpu


def test_a_restarted_plugin_still_withholds_what_the_device_plugin_allocated(rig: Rig) -> None:
    rig.kubelet.in_use = {rig.gpu_uuid("gpu-6")}
    _allocate(rig, "gpu-6")
    rig.restart()
    assert "gpu-6" not in rig.sliced()  # the ownership record outlived the process
    ref = rig.claim("after-restart", ["gpu-6"])
    assert "device plugin" in rig.plugin.claim_engine.prepare([ref])[ref.uid].error


def test_a_lost_ownership_record_is_rebuilt_from_pod_resources(rig: Rig) -> None:
    """A record gone (or set aside as unreadable) is rebuilt from what pods hold: the same path adopts the GPUs of
    pods started under NVIDIA's device plugin when a node migrates (docs/device-plugin.md)."""
    gpu = rig.gpu_uuid("gpu-1")
    rig.kubelet.in_use = {gpu}  # e.g. a pod admitted under another device plugin: no Allocate of ours
    rig.plugin.stop()
    record = rig.settings.plugin_dir / "device-plugin-ownership.json"
    record.unlink(missing_ok=True)
    rig.restart()
    assert "gpu-1" not in rig.sliced()  # adopted before the plugin served
    assert rig.plugin.device_plugin is not None
    assert set(rig.plugin.device_plugin.agent.ownership.load().allocated) == {gpu}


def test_status_and_explain_read_from_the_api_what_the_device_plugin_holds(
        rig: Rig, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """From the API server alone: the node's slices leave the GPU out and say in their annotation that the device
    plugin holds it for the pod PodResources names; status shows it, explain of a claim for all eight names it."""
    gpu = _allocate(rig, "gpu-3")
    rig.kubelet.in_use = {gpu}  # the fake kubelet lists it for pod n/p
    rest = rig.server.rest()

    def published() -> tuple[HeldGpu, ...]:
        listing = rest.get(SLICES_PATH)
        assert listing is not None
        return held_in_slices(listing["items"], DRIVER_NAME).gpus.get(NODE, ())

    wait_for(lambda: published() and published()[0].pods, 10, "the slices' annotation naming the pod")
    assert [(h.device, h.uuid, h.pods) for h in published()] == [("gpu-3", gpu, ("n/p",))]
    table = status_text(rest, driver=DRIVER_NAME, nodes=[NODE], output="")
    row = next(line for line in table.splitlines() if " gpu-3 " in f" {line} ")
    assert "device-plugin: n/p" in row, table
    rest.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", body={
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu"},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER_NAME}' && "
                                                      f"device.attributes['{DRIVER_NAME}'].type == 'gpu'"}}]}})
    rest.request("POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", body={
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "all-eight"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu", "count": 8}}]}}})
    for nodes in ([NODE], []):  # the node-scoped fetch and the whole list
        args = argparse.Namespace(node=nodes, all_devices=False, watch_list=False, feature_gates=None,
                                  no_protobuf=False)
        assert explain_command(rest, args, "default", "all-eight") == 2
        out = capsys.readouterr().out
        assert f"gpu-3 ({gpu}): held by the device plugin (pod n/p)" in out, out
    rig.kubelet.in_use = set()  # the pod ended: the GPU returns and the annotation goes with it
    wait_for(lambda: not published(), 10, "the annotation gone")
    assert "device-plugin" not in status_text(rest, driver=DRIVER_NAME, nodes=[NODE], output="")
