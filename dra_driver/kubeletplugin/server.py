"""The two gRPC endpoints the kubelet talks to, and a probe that checks both really answer."""

from __future__ import annotations

import base64
import hashlib
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog

from dra_driver._gen import dra_health_v1_pb2_grpc as health_v1_grpc
from dra_driver._gen import dra_health_v1alpha1_pb2_grpc as health_grpc
from dra_driver._gen import dra_v1_pb2 as v1_pb
from dra_driver._gen import dra_v1_pb2_grpc as v1_grpc
from dra_driver._gen import dra_v1beta1_pb2_grpc as v1beta1_grpc
from dra_driver._gen import pluginregistration_v1_pb2 as reg_pb
from dra_driver._gen import pluginregistration_v1_pb2_grpc as reg_grpc
from dra_driver.kubeletplugin.driver import Driver, HealthSource
from dra_driver.kubeletplugin.services import (
    DraV1beta1Servicer,
    DraV1Servicer,
    HealthServicer,
    HealthV1Servicer,
    RegistrationServicer,
)
from dra_driver.kubeletplugin.sockets import (
    UNIX_PATH_MAX,
    SocketPathError,
    check_socket_path,
    claim_socket_path,
    ensure_private_dir,
    remove_socket,
    restrict_socket,
    socket_path_problem,
)

log = structlog.get_logger(__name__)

DRA_SOCKET_NAME = "dra.sock"


@dataclass(frozen=True)
class SocketPaths:
    """Where one plugin instance listens.

    Without a pod UID: `<registry>/<driver>-reg.sock` and `<plugin-dir>/dra.sock`, one instance per node.
    With one (seamless upgrades, kubelet >= 1.33): `<registry>/<driver>-<uid>-reg.sock` and
    `<plugin-dir>/dra-<uid>.sock`, so the old and the new pod of a rolling update serve side by side and
    each removes only its own sockets. The kubelet keeps every registered instance of a driver and sends
    calls to the newest one that is connected. A registration path longer than the kernel's limit falls
    back to a name derived from a hash of the UID, as the upstream kubelet-plugin helper does; so does the DRA
    socket (`dra-<hash>.sock`).
    """

    registration: Path
    dra: Path

    @classmethod
    def for_instance(cls, registry_dir: Path, plugin_dir: Path, driver_name: str, pod_uid: str | None) -> SocketPaths:
        if not pod_uid:
            return cls(
                check_socket_path("--registry-dir", registry_dir, registry_dir / f"{driver_name}-reg.sock"),
                check_socket_path("--plugin-dir", plugin_dir, plugin_dir / DRA_SOCKET_NAME),
            )
        instance_key = driver_name.encode() + b"\0" + pod_uid.encode()
        candidates = (
            f"{driver_name}-{pod_uid}-reg.sock",
            f"{driver_name}-{_short_hash(pod_uid.encode(), 8)}-reg.sock",
            f"dra-{_short_hash(instance_key, 16)}-reg.sock",
        )
        fitting = [registry_dir / c for c in candidates if len(str(registry_dir / c).encode()) <= UNIX_PATH_MAX]
        if not fitting:
            size = len(str(registry_dir / candidates[-1]).encode())
            raise SocketPathError(
                f"--registry-dir {registry_dir}: even the shortest registration socket name would make a {size}-byte "
                f"path, over the unix socket limit of {UNIX_PATH_MAX} bytes; choose a shorter directory"
            )
        # The DRA socket likewise (the kubelet dials the endpoint GetInfo names, so any name serves): the usual
        # --plugin-dir holds the driver name (up to 63), which with a UID passes the limit; 32 bits of hash tell
        # the two pods of one rolling update apart and fit beside the longest driver name.
        dra_names = (plugin_dir / f"dra-{pod_uid}.sock", plugin_dir / f"dra-{_short_hash(pod_uid.encode(), 4)}.sock")
        dra = next((p for p in dra_names if socket_path_problem(p) is None), min(dra_names, key=lambda p: len(p.name)))
        return cls(fitting[0], check_socket_path("--plugin-dir", plugin_dir, dra))


def _short_hash(data: bytes, size: int) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()[:size]).decode().rstrip("=")


class PluginServer:
    """Serves DRAPlugin v1 + v1beta1 (and DRAResourceHealth, given a health source) on the DRA socket, and the
    registration service on the registration socket (names: `SocketPaths`), for one `Driver`. The DRA socket starts
    first so the endpoint named in GetInfo already answers when the kubelet discovers the registration socket."""

    def __init__(
        self,
        *,
        driver_name: str,
        plugin_dir: Path,
        registry_dir: Path,
        driver: Driver,
        health: HealthSource | None = None,
        pod_uid: str | None = None,
        max_workers: int = 64,
    ) -> None:
        self.driver_name = driver_name
        self.plugin_dir = plugin_dir.absolute()
        self.registry_dir = registry_dir.absolute()
        paths = SocketPaths.for_instance(self.registry_dir, self.plugin_dir, driver_name, pod_uid)
        self.dra_socket = paths.dra
        self.registration_socket = paths.registration
        self.stopping = threading.Event()
        self.registration = RegistrationServicer(driver_name, str(self.dra_socket), health=health is not None)
        self._driver = driver
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
        v1_grpc.add_DRAPluginServicer_to_server(DraV1Servicer(self._driver), dra)
        v1beta1_grpc.add_DRAPluginServicer_to_server(DraV1beta1Servicer(self._driver), dra)
        if self._health is not None:
            health_grpc.add_DRAResourceHealthServicer_to_server(HealthServicer(self._health, self.stopping), dra)
            health_v1_grpc.add_DRAResourceHealthServicer_to_server(HealthV1Servicer(self._health, self.stopping), dra)
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
