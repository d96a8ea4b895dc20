"""The gRPC `v1beta1.DevicePlugin` service the kubelet calls on the plugin's socket (docs/device-plugin.md "The
API"); what it answers comes from the agent (agent.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

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
            raise AllocateRefused(f"{field}[{i}].devices_ids: {len(ids)} device IDs, more than {MAX_IDS}", invalid=True)


def check_preferred(asked: Sequence[tuple[Sequence[str], Sequence[str], int]]) -> None:
    """Refuses (AllocateRefused, invalid) a GetPreferredAllocation the kubelet cannot have sent, naming the field.

    Upstream's device manager asks with `available` = the aligned free devices and those it must reuse, `must_include`
    = those it must reuse, `allocation_size` = how many the container needs (pkg/kubelet/cm/devicemanager
    `devicesToAllocate`): sets, so no ID twice, `must_include` within `available`, and the size within both bounds.
    An ID the node does not offer (any more) is passed over, not refused: the answer is only a preference, the kubelet
    may hold a list older than a GPU's change of mode, and a refusal would fail the pod's admission; Allocate refuses
    such an ID."""
    if not asked:
        raise AllocateRefused("container_requests: empty; the kubelet asks for at least one container", invalid=True)
    if len(asked) > MAX_CONTAINERS:
        raise AllocateRefused(f"container_requests: {len(asked)} entries, more than {MAX_CONTAINERS}", invalid=True)
    for i, (available, must_include, size) in enumerate(asked):
        where = f"container_requests[{i}]"
        for name, ids in (("available_deviceIDs", available), ("must_include_deviceIDs", must_include)):
            if len(ids) > MAX_IDS:
                raise AllocateRefused(f"{where}.{name}: {len(ids)} device IDs, more than {MAX_IDS}", invalid=True)
            seen: dict[str, int] = {}
            for j, device_id in enumerate(ids):
                if device_id in seen:
                    raise AllocateRefused(f"{where}.{name}[{j}]: {device_id[:80]!r} is named again (first at "
                                          f"[{seen[device_id]}])", invalid=True)  # fmt: skip
                seen[device_id] = j
        if not available:
            raise AllocateRefused(f"{where}.available_deviceIDs: empty; nothing to choose from", invalid=True)
        if not 1 <= size <= len(available):
            raise AllocateRefused(f"{where}.allocation_size: {size}, not within 1..{len(available)} (the number of "
                                  "available_deviceIDs)", invalid=True)  # fmt: skip
        if len(must_include) > size:
            raise AllocateRefused(f"{where}.must_include_deviceIDs: {len(must_include)} IDs, more than "
                                  f"allocation_size {size}", invalid=True)  # fmt: skip
        offered = set(available)
        for j, device_id in enumerate(must_include):
            if device_id not in offered:
                raise AllocateRefused(f"{where}.must_include_deviceIDs[{j}]: {device_id[:80]!r} is not among "
                                      "available_deviceIDs", invalid=True)  # fmt: skip


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
        asked = [(list(r.available_deviceIDs), list(r.must_include_deviceIDs), r.allocation_size)
                 for r in request.container_requests]  # fmt: skip
        try:
            check_preferred(asked)
        except AllocateRefused as exc:
            log.warning("GetPreferredAllocation refused", error=str(exc))
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        responses = [pb.ContainerPreferredAllocationResponse(deviceIDs=self._agent.preferred(available, must, size))
                     for available, must, size in asked]  # fmt: skip
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
