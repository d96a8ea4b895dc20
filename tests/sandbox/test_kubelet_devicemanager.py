"""The kubelet simulator's device manager (docs/sandbox.md "The device manager") against a small device plugin of
the test's own: registration and its refusals as upstream words them, capacity and allocatable from ListAndWatch,
allocation at admission with the plugin's CDI names, devices back when pods end, PodResources List."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from dra_driver._gen import deviceplugin_v1beta1_pb2 as dp
from dra_driver._gen import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from dra_driver._gen import podresources_v1_pb2 as pr
from dra_driver._gen import podresources_v1_pb2_grpc as pr_grpc
from dra_sandbox.kubelet.devicemanager import DeviceAllocationError, DeviceManager, container_requests
from tests.polling import wait_for

RESOURCE = "example.com/gpu"


class Plugin(dp_grpc.DevicePluginServicer):  # type: ignore[misc]
    """Two devices, d1 Healthy and d2 Unhealthy; Allocate answers one CDI name per device."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.allocated: list[list[str]] = []

    def GetDevicePluginOptions(self, request: dp.Empty, context: grpc.ServicerContext) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions()

    def ListAndWatch(self, request: dp.Empty, context: grpc.ServicerContext) -> Iterator[dp.ListAndWatchResponse]:
        yield dp.ListAndWatchResponse(devices=[dp.Device(ID="d1", health="Healthy"),
                                               dp.Device(ID="d2", health="Unhealthy")])  # fmt: skip
        while context.is_active() and not self.stop.wait(0.05):
            pass

    def Allocate(self, request: dp.AllocateRequest, context: grpc.ServicerContext) -> dp.AllocateResponse:
        self.allocated += [list(c.devices_ids) for c in request.container_requests]
        return dp.AllocateResponse(container_responses=[dp.ContainerAllocateResponse(
            cdi_devices=[dp.CDIDevice(name=f"example.com/gpu={i}") for i in c.devices_ids])
            for c in request.container_requests])  # fmt: skip


@pytest.fixture
def rig() -> Iterator[tuple[DeviceManager, Plugin, Path]]:
    work = Path(tempfile.mkdtemp(prefix="dm-", dir="/tmp"))
    changes = threading.Event()
    manager = DeviceManager(work / "dp", work / "pr" / "kubelet.sock", changes.set)
    (work / "dp").mkdir()
    (work / "dp" / "stale.sock").write_text("")  # a leftover the kubelet removes at start
    manager.start()
    plugin = Plugin()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    dp_grpc.add_DevicePluginServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix://{work / 'dp' / 'p.sock'}")
    server.start()
    try:
        yield manager, plugin, work
    finally:
        plugin.stop.set()
        server.stop(0).wait()
        manager.stop()
        shutil.rmtree(work, ignore_errors=True)


def _register(work: Path, version: str = "v1beta1", resource: str = RESOURCE) -> None:
    with grpc.insecure_channel(f"unix://{work / 'dp' / 'kubelet.sock'}") as channel:
        dp_grpc.RegistrationStub(channel).Register(dp.RegisterRequest(version=version, endpoint="p.sock",
                                                                      resource_name=resource), timeout=10)


def test_registration_capacity_allocation_and_pod_resources(rig: tuple[DeviceManager, Plugin, Path]) -> None:
    manager, plugin, work = rig
    assert not (work / "dp" / "stale.sock").exists()
    _register(work)
    assert wait_for(lambda: manager.resources() == {RESOURCE: (2, 1)}, 10, "capacity 2, allocatable 1")
    pod = {"spec": {"containers": [{"name": "c", "resources": {"limits": {RESOURCE: "1", "cpu": "1"}}}]}}
    assert container_requests(pod) == [("c", {RESOURCE: 1})]
    assert manager.allocate("uid-1", "ns", "p1", container_requests(pod)) == {"c": ["example.com/gpu=d1"]}
    assert plugin.allocated == [["d1"]]  # the healthy one
    with pytest.raises(DeviceAllocationError, match=r"^requested number of devices unavailable for example\.com/gpu"
                                                    r"\. Requested: 1, Available: 0$"):  # fmt: skip
        manager.allocate("uid-2", "ns", "p2", container_requests(pod))
    with grpc.insecure_channel(f"unix://{work / 'pr' / 'kubelet.sock'}") as channel:
        listed = pr_grpc.PodResourcesListerStub(channel).List(pr.ListPodResourcesRequest(), timeout=10)
    [entry] = listed.pod_resources
    assert (entry.name, entry.namespace, list(entry.containers[0].devices[0].device_ids)) == ("p1", "ns", ["d1"])
    manager.retain(set())  # the pod ended: its device returns
    assert manager.allocate("uid-2", "ns", "p2", container_requests(pod)) == {"c": ["example.com/gpu=d1"]}


@pytest.mark.parametrize(("version", "resource", "message"), [
    ("v1alpha", RESOURCE, 'requested API version "v1alpha" is not supported by kubelet. Supported version is '
                          '["v1beta1"]'),
    ("v1beta1", "gpu", 'the ResourceName "gpu" is invalid'),
])  # fmt: skip
def test_registration_refusals_as_upstream_words_them(rig: tuple[DeviceManager, Plugin, Path], version: str,
                                                      resource: str, message: str) -> None:  # fmt: skip
    _, _, work = rig
    with pytest.raises(grpc.RpcError) as refused:
        _register(work, version, resource)
    assert message in str(refused.value.details())
