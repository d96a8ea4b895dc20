"""The gRPC `v1beta1.DevicePlugin` service the kubelet calls on the plugin's socket (docs/device-plugin.md "The
API"); what it answers comes from the agent (agent.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import structlog

from dra_driver._gen import deviceplugin_v1beta1_pb2 as pb
from dra_driver._gen import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from dra_driver.cdi.errors import CdiSpecError
from dra_driver.deviceplugin.agent import AllocateRefused, DevicePluginAgent, ListedDevice
from dra_driver.deviceplugin.ownership import OwnershipError

log = structlog.get_logger(__name__)

# How often an open ListAndWatch looks at the health board even when nothing woke it (the board has its own wait,
# the stream waits on the agent's changes; health changes reach the kubelet within this).
HEALTH_POLL_S = 1.0
MAX_CONTAINERS = 64  # more container requests in one call than any pod has: refused, not served
MAX_IDS = 256


def _device(d: ListedDevice) -> pb.Device:
    topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=d.numa_node)]) if d.numa_node is not None else None
    return pb.Device(ID=d.id, health=d.health, topology=topology)


def _check_sizes(field: str, lists: list[list[str]]) -> None:
    if len(lists) > MAX_CONTAINERS:
        raise AllocateRefused(f"{field}: {len(lists)} entries, more than {MAX_CONTAINERS}", invalid=True)
    for i, ids in enumerate(lists):
        if len(ids) > MAX_IDS:
            raise AllocateRefused(f"{field}[{i}]: {len(ids)} device IDs, more than {MAX_IDS}", invalid=True)


class DevicePluginServicer(pb_grpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, agent: DevicePluginAgent, stopping: threading.Event) -> None:
        self._agent = agent
        self._stopping = stopping

    def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        sent: list[ListedDevice] | None = None
        version = self._agent.version
        while context.is_active() and not self._stopping.is_set():
            try:
                devices = self._agent.devices()
            except OwnershipError as exc:
                log.error("ListAndWatch: the ownership record is unreadable; the last list stands", error=str(exc))
                devices = sent or []
            if devices != sent:
                yield pb.ListAndWatchResponse(devices=[_device(d) for d in devices])
                sent = devices
            version = self._agent.wait(version, HEALTH_POLL_S)

    def GetPreferredAllocation(self, request: pb.PreferredAllocationRequest,
                               context: grpc.ServicerContext) -> pb.PreferredAllocationResponse:  # fmt: skip
        requests = list(request.container_requests)
        if len(requests) > MAX_CONTAINERS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"container_requests: more than {MAX_CONTAINERS} entries")
        responses = []
        for i, r in enumerate(requests):
            if not 0 <= r.allocation_size <= MAX_IDS or len(r.available_deviceIDs) > MAX_IDS:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"container_requests[{i}]: allocation_size {r.allocation_size} or "
                              f"{len(r.available_deviceIDs)} available IDs out of range (0..{MAX_IDS})")  # fmt: skip
            chosen = self._agent.preferred(list(r.available_deviceIDs), list(r.must_include_deviceIDs),
                                           r.allocation_size)  # fmt: skip
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return pb.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        containers = [list(c.devices_ids) for c in request.container_requests]
        try:
            _check_sizes("container_requests", containers)
            names = self._agent.allocate(containers)
        except AllocateRefused as exc:
            code = grpc.StatusCode.INVALID_ARGUMENT if exc.invalid else grpc.StatusCode.FAILED_PRECONDITION
            log.warning("Allocate refused", error=str(exc))
            context.abort(code, str(exc))
        except (OwnershipError, CdiSpecError) as exc:
            log.error("Allocate failed", error=str(exc))
            context.abort(grpc.StatusCode.INTERNAL, str(exc))
        return pb.AllocateResponse(container_responses=[
            pb.ContainerAllocateResponse(cdi_devices=[pb.CDIDevice(name=n) for n in cdi]) for cdi in names
        ])  # fmt: skip

    def PreStartContainer(self, request: pb.PreStartContainerRequest,
                          context: grpc.ServicerContext) -> pb.PreStartContainerResponse:  # fmt: skip
        return pb.PreStartContainerResponse()  # not asked for (pre_start_required is false); answered all the same
