"""A small TEST DRA plugin (real gRPC servers on real unix sockets) for the kubelet simulator tests.

It serves the Registration service on ``<registry>/<driver>-reg.sock`` and DRAPlugin v1 + v1beta1 +
DRAResourceHealth v1alpha1 on ``<plugins>/<driver>/dra.sock``, records every call, and can be told to
fail: per-claim errors, claims left out of the response, whole-call gRPC errors, GetInfo failures,
and a health stream that breaks.
"""

from __future__ import annotations

import os
import queue
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dra_driver import cdi
from dra_driver._gen import (
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from dra_driver.cdi import writer as cdi_writer

ALL_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth")
BREAK_STREAM = "break-stream"


def short_tmpdir() -> Path:
    """AF_UNIX paths must stay under 108 bytes: pytest's tmp_path is too long."""
    return Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))


@dataclass
class Calls:
    notifications: list[tuple[bool, str]] = field(default_factory=list)
    get_info: int = 0
    prepare: list[tuple[str, list[str]]] = field(default_factory=list)  # (service version, claim uids)
    unprepare: list[tuple[str, list[str]]] = field(default_factory=list)


class FakePlugin:
    def __init__(
        self,
        registry_dir: Path,
        plugins_dir: Path,
        driver: str = "gpu.test.dev",
        versions: tuple[str, ...] = ALL_VERSIONS,
        plugin_type: str = "DRAPlugin",
        endpoint: str | None = None,
        cdi_kind: str = "test.dev/gpu",
        cdi_dir: Path | None = None,
        cdi_mount: Path | None = None,
    ) -> None:
        self.driver = driver
        self.versions = versions
        self.plugin_type = plugin_type
        self.cdi_kind = cdi_kind
        # Like a real driver: write one CDI spec per prepared claim into cdi_dir, delete it on unprepare.
        self.cdi_dir = cdi_dir
        self.cdi_mount = cdi_mount
        self.registry_dir = registry_dir
        self.reg_socket = registry_dir / f"{driver}-reg.sock"
        self.dra_socket = plugins_dir / driver / "dra.sock"
        self.endpoint = endpoint if endpoint is not None else str(self.dra_socket)
        self.calls = Calls()
        self.lock = threading.Lock()
        # Behaviour knobs (set by tests).
        self.get_info_fails = False
        self.prepare_errors: dict[str, list[str]] = {}  # uid -> errors to return on the next calls, in order
        self.omit_claims: set[str] = set()  # uids left out of responses
        self.fail_whole_call = False
        self.devices_per_claim: dict[str, list[tuple[str, list[str]]]] = {}  # uid -> [(device, request_names)]
        self.health_updates: queue.Queue[Any] = queue.Queue()
        self.health_streams_opened = 0
        self._reg_server: grpc.Server | None = None
        self._dra_server: grpc.Server | None = None

    # ---- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> FakePlugin:
        self.start_dra()
        self.start_registration()
        return self

    def start_dra(self) -> None:
        self.dra_socket.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(_DraServicer(self, "v1", dra_v1_pb2), server)
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(_DraServicer(self, "v1beta1", dra_v1beta1_pb2), server)
        dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(_HealthServicer(self), server)
        server.add_insecure_port(f"unix:{self.dra_socket}")
        server.start()
        self._dra_server = server

    def start_registration(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(_RegistrationServicer(self), server)
        server.add_insecure_port(f"unix:{self.reg_socket}")
        server.start()
        self._reg_server = server

    def stop_registration(self) -> None:
        if self._reg_server is not None:
            self._reg_server.stop(grace=None).wait()  # grpc removes the socket file
            self._reg_server = None
        if self.reg_socket.exists():
            os.unlink(self.reg_socket)

    def stop(self) -> None:
        self.stop_registration()
        if self._dra_server is not None:
            self._dra_server.stop(grace=None).wait()
            self._dra_server = None

    def push_health(self, *devices: tuple[str, str, dra_health_v1alpha1_pb2.HealthStatus], message: str = "") -> None:
        """devices: (pool, device, health)."""
        self.health_updates.put(
            dra_health_v1alpha1_pb2.NodeWatchResourcesResponse(
                devices=[
                    dra_health_v1alpha1_pb2.DeviceHealth(
                        device=dra_health_v1alpha1_pb2.DeviceIdentifier(pool_name=pool, device_name=device),
                        health=health,
                        last_updated_time=int(time.time()),
                        message=message,
                    )
                    for pool, device, health in devices
                ]
            )
        )

    def cdi_id(self, uid: str, device: str = "gpu-0") -> str:
        return f"{self.cdi_kind}=claim-{uid}-{device}"

    def spec_file(self, uid: str) -> str:
        vendor, device_class = self.cdi_kind.split("/")
        return cdi_writer.spec_file_name(vendor, device_class, uid)

    def write_cdi(self, uid: str, devices: list[str]) -> None:
        if self.cdi_dir is None:
            return
        mounts = (cdi.Mount(str(self.cdi_mount), "/usr/local/dra", ("ro", "bind")),) if self.cdi_mount else ()
        spec = cdi.Spec(
            cdi_version="0.5.0",
            kind=self.cdi_kind,
            container_edits=cdi.ContainerEdits(env=(f"DRA_CLAIM_UID={uid}",), mounts=mounts),
            devices=tuple(cdi.Device(f"claim-{uid}-{d}", cdi.ContainerEdits(env=(f"DRA_DEVICE_{i}={d}",)))
                          for i, d in enumerate(devices)),
        )
        cdi_writer.write_spec(self.cdi_dir, self.spec_file(uid), spec)

    def remove_cdi(self, uid: str) -> None:
        if self.cdi_dir is not None:
            cdi_writer.remove_spec(self.cdi_dir, self.spec_file(uid))


class _RegistrationServicer(pluginregistration_v1_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, plugin: FakePlugin) -> None:
        self.p = plugin

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.p.lock:
            self.p.calls.get_info += 1
        if self.p.get_info_fails:
            context.abort(grpc.StatusCode.UNAVAILABLE, "plugin is restarting")
        return pluginregistration_v1_pb2.PluginInfo(
            type=self.p.plugin_type, name=self.p.driver, endpoint=self.p.endpoint,
            supported_versions=list(self.p.versions),
        )

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.p.lock:
            self.p.calls.notifications.append((request.plugin_registered, request.error))
        if not request.plugin_registered:
            # What the Go helper does: an error back to the kubelet.
            context.abort(grpc.StatusCode.UNKNOWN, f"registration failed: {request.error}")
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


class _DraServicer:
    def __init__(self, plugin: FakePlugin, version: str, pb2: Any) -> None:
        self.p = plugin
        self.version = version
        self.pb2 = pb2

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        uids = [c.uid for c in request.claims]
        with self.p.lock:
            self.p.calls.prepare.append((self.version, uids))
        if self.p.fail_whole_call:
            context.abort(grpc.StatusCode.INTERNAL, "plugin exploded")
        response = self.pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            if claim.uid in self.p.omit_claims:
                continue
            errors = self.p.prepare_errors.get(claim.uid)
            if errors:
                response.claims[claim.uid].error = errors.pop(0)
                continue
            entry = response.claims[claim.uid]
            devices = self.p.devices_per_claim.get(claim.uid, [("gpu-0", ["gpu"])])
            self.p.write_cdi(claim.uid, [d for d, _ in devices])
            for device, requests in devices:
                entry.devices.add(request_names=requests, pool_name="node-1", device_name=device,
                                  cdi_device_ids=[self.p.cdi_id(claim.uid, device)])
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        uids = [c.uid for c in request.claims]
        with self.p.lock:
            self.p.calls.unprepare.append((self.version, uids))
        if self.p.fail_whole_call:
            context.abort(grpc.StatusCode.INTERNAL, "plugin exploded")
        response = self.pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            if claim.uid in self.p.omit_claims:
                continue
            errors = self.p.prepare_errors.get(claim.uid)
            response.claims[claim.uid].error = errors.pop(0) if errors else ""
            if not response.claims[claim.uid].error:
                self.p.remove_cdi(claim.uid)
        return response


class _HealthServicer(dra_health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):  # type: ignore[misc]
    def __init__(self, plugin: FakePlugin) -> None:
        self.p = plugin

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        with self.p.lock:
            self.p.health_streams_opened += 1
        while context.is_active():
            try:
                item = self.p.health_updates.get(timeout=0.05)
            except queue.Empty:
                continue
            if item == BREAK_STREAM:
                context.abort(grpc.StatusCode.UNAVAILABLE, "health monitor restarting")
            yield item
