"""A fake kubelet for the device plugin's tests: the device manager's Registration service on <dir>/kubelet.sock
(it records each RegisterRequest and can restart as the kubelet does, removing the dir's sockets) and the
PodResources List on its own socket, answering the device IDs the test says pods hold."""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import grpc

from dra_driver._gen import deviceplugin_v1beta1_pb2 as dp
from dra_driver._gen import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from dra_driver._gen import podresources_v1_pb2 as pr
from dra_driver._gen import podresources_v1_pb2_grpc as pr_grpc

RESOURCE = "nvidia.com/gpu"


class FakeKubelet(dp_grpc.RegistrationServicer, pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, directory: Path, pod_resources: Path) -> None:
        self.directory = directory
        self.pod_resources = pod_resources
        self.registered: list[dp.RegisterRequest] = []
        self.in_use: set[str] = set()
        self.lists = 0
        self._lock = threading.Lock()
        self._servers: list[grpc.Server] = []

    def Register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        with self._lock:
            self.registered.append(request)
        return dp.Empty()

    def List(self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext) -> pr.ListPodResourcesResponse:
        with self._lock:
            self.lists += 1
            ids = sorted(self.in_use)
        devices = [pr.ContainerDevices(resource_name=RESOURCE, device_ids=ids)] if ids else []
        return pr.ListPodResourcesResponse(pod_resources=[
            pr.PodResources(name="p", namespace="n", containers=[pr.ContainerResources(name="c", devices=devices)])])

    def start(self) -> None:
        """Start (or restart) as the kubelet's device manager does: every socket in the dir removed first."""
        self.stop()
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in self.directory.iterdir():
            if path.is_socket():
                path.unlink()
        registration = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        dp_grpc.add_RegistrationServicer_to_server(self, registration)
        registration.add_insecure_port(f"unix://{self.directory / 'kubelet.sock'}")
        listing = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pr_grpc.add_PodResourcesListerServicer_to_server(self, listing)
        self.pod_resources.parent.mkdir(parents=True, exist_ok=True)
        listing.add_insecure_port(f"unix://{self.pod_resources}")
        for server in (registration, listing):
            server.start()
        self._servers = [registration, listing]

    def stop(self) -> None:
        for server in self._servers:
            server.stop(0).wait()
        self._servers = []
