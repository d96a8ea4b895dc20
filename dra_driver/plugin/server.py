"""The two gRPC endpoints the kubelet talks to, and a probe that checks both really answer."""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import grpc
import structlog

from dra_driver._gen import dra_health_v1alpha1_pb2_grpc as health_grpc
from dra_driver._gen import dra_v1_pb2 as v1_pb
from dra_driver._gen import dra_v1_pb2_grpc as v1_grpc
from dra_driver._gen import dra_v1beta1_pb2_grpc as v1beta1_grpc
from dra_driver._gen import pluginregistration_v1_pb2 as reg_pb
from dra_driver._gen import pluginregistration_v1_pb2_grpc as reg_grpc
from dra_driver.plugin.services import (
    DraV1beta1Servicer,
    DraV1Servicer,
    HealthServicer,
    RegistrationServicer,
)
from dra_driver.plugin.sockets import claim_socket_path, ensure_private_dir, remove_socket, restrict_socket
from dra_driver.plugin.types import ClaimEngine, HealthSource

log = structlog.get_logger(__name__)

DRA_SOCKET_NAME = "dra.sock"


def registration_socket_path(registry_dir: Path, driver_name: str) -> Path:
    return registry_dir / f"{driver_name}-reg.sock"


class PluginServer:
    """Serves DRAPlugin v1 + v1beta1 and DRAResourceHealth on `<plugin-dir>/dra.sock`, and the registration
    service on `<registry-dir>/<driver>-reg.sock`. The DRA socket starts first so the endpoint named in
    GetInfo already answers when the kubelet discovers the registration socket."""

    def __init__(
        self,
        *,
        driver_name: str,
        plugin_dir: Path,
        registry_dir: Path,
        engine: ClaimEngine,
        health: HealthSource,
        max_workers: int = 32,
    ) -> None:
        self.driver_name = driver_name
        self.plugin_dir = plugin_dir.absolute()
        self.registry_dir = registry_dir.absolute()
        self.dra_socket = self.plugin_dir / DRA_SOCKET_NAME
        self.registration_socket = registration_socket_path(self.registry_dir, driver_name)
        self.stopping = threading.Event()
        self.registration = RegistrationServicer(driver_name, str(self.dra_socket))
        self._engine = engine
        self._health = health
        self._max_workers = max_workers
        self._dra_server: grpc.Server | None = None
        self._reg_server: grpc.Server | None = None

    def start(self) -> None:
        ensure_private_dir(self.plugin_dir)
        ensure_private_dir(self.registry_dir, mode=0o755)
        claim_socket_path(self.dra_socket)
        claim_socket_path(self.registration_socket)

        dra = grpc.server(futures.ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="dra"))
        v1_grpc.add_DRAPluginServicer_to_server(DraV1Servicer(self._engine), dra)
        v1beta1_grpc.add_DRAPluginServicer_to_server(DraV1beta1Servicer(self._engine), dra)
        health_grpc.add_DRAResourceHealthServicer_to_server(HealthServicer(self._health, self.stopping), dra)
        dra.add_insecure_port(f"unix://{self.dra_socket}")
        dra.start()
        restrict_socket(self.dra_socket)
        self._dra_server = dra

        reg = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="registration"))
        reg_grpc.add_RegistrationServicer_to_server(self.registration, reg)
        reg.add_insecure_port(f"unix://{self.registration_socket}")
        reg.start()
        restrict_socket(self.registration_socket)
        self._reg_server = reg
        log.info(
            "serving kubelet plugin sockets",
            driver=self.driver_name,
            dra_socket=str(self.dra_socket),
            registration_socket=str(self.registration_socket),
        )

    def stop(self, grace: float = 10.0) -> None:
        """Stop taking calls, let in-flight ones finish (up to `grace`), remove the sockets."""
        self.stopping.set()
        # Registration goes first: the kubelet's watcher sees the socket vanish and stops sending calls.
        if self._reg_server is not None:
            self._reg_server.stop(grace=None)
            remove_socket(self.registration_socket)
        if self._dra_server is not None:
            self._dra_server.stop(grace=grace).wait(grace + 1.0)
            remove_socket(self.dra_socket)
        log.info("kubelet plugin sockets closed", driver=self.driver_name)

    def probe(self, timeout: float = 2.0) -> tuple[bool, str]:
        """True only if GetInfo answers on the registration socket and the DRA socket answers an empty
        NodePrepareResources (what the kubelet would do)."""
        try:
            with grpc.insecure_channel(f"unix://{self.registration_socket}") as channel:
                info = reg_grpc.RegistrationStub(channel).GetInfo(reg_pb.InfoRequest(), timeout=timeout)
            if info.name != self.driver_name:
                return False, f"registration socket answers for {info.name!r}"
            with grpc.insecure_channel(f"unix://{self.dra_socket}") as channel:
                v1_grpc.DRAPluginStub(channel).NodePrepareResources(
                    v1_pb.NodePrepareResourcesRequest(), timeout=timeout
                )
        except grpc.RpcError as exc:
            return False, f"gRPC probe failed: {exc.code().name}"
        return True, "ok"
