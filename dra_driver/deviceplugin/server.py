"""The device plugin's socket, its registration with the kubelet, and the loop that returns GPUs.

Upstream's device manager (pkg/kubelet/cm/devicemanager) serves `Registration` on `<dir>/kubelet.sock`; a plugin
serves `DevicePlugin` on its own socket in the same dir and calls Register with that socket's name. When the
kubelet restarts it removes the sockets in the dir and makes kubelet.sock again, and every plugin must register
again. So the watch loop compares kubelet.sock's identity (device, inode) with the one it registered with, and
re-creates its own socket where it is gone, then registers again (docs/device-plugin.md "Registration").
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc
import structlog

from dra_driver._gen import deviceplugin_v1beta1_pb2 as pb
from dra_driver._gen import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from dra_driver.deviceplugin.agent import DevicePluginAgent
from dra_driver.deviceplugin.podresources import InUse, list_in_use
from dra_driver.deviceplugin.servicer import DevicePluginServicer
from dra_driver.deviceplugin.settings import DevicePluginSettings

log = structlog.get_logger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class DevicePluginServer:
    def __init__(self, settings: DevicePluginSettings, agent: DevicePluginAgent,
                 in_use: Callable[[], InUse | None] | None = None) -> None:  # fmt: skip
        self.settings = settings
        self.agent = agent
        self._in_use = in_use or (lambda: list_in_use(settings.pod_resources_socket, settings.resource_name))
        self.stopping = threading.Event()
        self._server: grpc.Server | None = None
        self._served: tuple[int, int] | None = None  # our socket's identity while served
        self._registered_with: tuple[int, int] | None = None  # kubelet.sock's identity at the last Register
        self.registrations = 0
        self._threads = [threading.Thread(target=self._watch, name="device-plugin-watch", daemon=True),
                         threading.Thread(target=self._reconcile, name="device-plugin-reconcile", daemon=True)]

    @property
    def socket(self) -> Path:
        return self.settings.directory / self.settings.socket_name

    def start(self) -> None:
        """Serve and register now where the kubelet is there, else as soon as it is (the watch loop); the first
        reconcile first, so GPUs that pods already hold (under an earlier plugin) are never offered to DRA."""
        self.settings.check()
        self.agent.reconcile(self._in_use())
        self._tick()
        for thread in self._threads:
            thread.start()

    def stop(self, grace: float = 1.0) -> None:
        self.stopping.set()
        self.agent.changed()  # wakes open ListAndWatch streams, which then end
        if self._server is not None:
            self._server.stop(grace).wait()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=10)
        if _identity(self.socket) == self._served:
            self.socket.unlink(missing_ok=True)

    def _serve(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait()
        self.socket.unlink(missing_ok=True)  # ours from before a crash, or a file the kubelet did not clean
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="device-plugin"))
        pb_grpc.add_DevicePluginServicer_to_server(DevicePluginServicer(self.agent, self.stopping), server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        os.chmod(self.socket, 0o600)
        self._server, self._served = server, _identity(self.socket)
        self._registered_with = None  # a new socket is registered anew
        log.info("device plugin serving", socket=str(self.socket), resource=self.settings.resource_name)

    def _register_if_needed(self) -> None:
        kubelet = _identity(self.settings.directory / KUBELET_SOCKET)
        if kubelet is None or kubelet == self._registered_with:
            return
        request = pb.RegisterRequest(
            version=API_VERSION, endpoint=self.settings.socket_name, resource_name=self.settings.resource_name,
            options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
        )  # fmt: skip
        try:
            with grpc.insecure_channel(f"unix://{self.settings.directory / KUBELET_SOCKET}") as channel:
                pb_grpc.RegistrationStub(channel).Register(request, timeout=10)
        except grpc.RpcError as exc:
            log.warning("registering with the kubelet's device manager failed; retrying", error=str(exc))
            return
        self._registered_with = kubelet
        self.registrations += 1
        log.info("device plugin registered with the kubelet", resource=self.settings.resource_name,
                 registrations=self.registrations)  # fmt: skip

    def _tick(self) -> None:
        if not self.settings.directory.is_dir():
            log.info("waiting for the kubelet's device-plugins dir", directory=str(self.settings.directory))
            return
        if self._served is None or _identity(self.socket) != self._served:
            if self._served is not None:
                log.info("the device plugin's socket is gone (a kubelet restart); serving it again")
            self._serve()
        self._register_if_needed()

    def _watch(self) -> None:
        while not self.stopping.wait(self.settings.watch_interval):
            try:
                self._tick()
            except Exception:
                log.exception("device plugin watch failed; retrying")

    def _reconcile(self) -> None:
        while not self.stopping.wait(self.settings.reconcile_interval):
            try:
                self.agent.reconcile(self._in_use())
            except Exception:
                log.exception("device plugin reconcile failed; retrying")
