"""The kubelet's device manager, as the simulator imitates it: the device-plugin API v1beta1 and PodResources v1 List.

Upstream behaviour imitated (k8s.io/kubernetes v1.37.2 `pkg/kubelet/cm/devicemanager`, docs/device-plugin.md and
docs/sandbox.md "The device manager"):

- `Registration` on `<dir>/kubelet.sock`; at start the dir is made (0750) and every file in it but the
  checkpoint removed (`plugin/v1beta1/server.go` Start, `CleanupPluginDirectory`). Register refuses a version not
  in `SupportedVersions` (`requested API version %q is not supported by kubelet. Supported version is %q`) and a
  name that is no extended resource (`the ResourceName %q is invalid`), then dials `<dir>/<endpoint>`, asks
  GetDevicePluginOptions and answers; the ListAndWatch stream runs on after it.
- Every list replaces the resource's devices; capacity = all devices, allocatable = the `Healthy` ones
  (`GetCapacity`). A stream that ends marks the resource's devices unhealthy (`markResourceUnhealthy`).
- Pod admission: per container and resource, the devices already allocated to it are kept (`devicesToAllocate`);
  the rest come from the healthy, unallocated ones (`requested number of devices unavailable for %s. Requested: %d,
  Available: %d` otherwise), through GetPreferredAllocation where the plugin offers it, then Allocate; its
  `cdi_devices` go to the container (the simulator's runtime reads CDI only: envs, mounts and device specs of the
  answer are not applied, and none of our plugin's answers carries any). An Allocate error rejects the pod
  (`UnexpectedAdmissionError`).
- Devices of pods no longer active return (`UpdateAllocatedDevices`), and PodResources `List` shows each active
  pod's containers' devices (`<root>/pod-resources/kubelet.sock`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from dra_driver._gen import deviceplugin_v1beta1_pb2 as dp
from dra_driver._gen import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from dra_driver._gen import podresources_v1_pb2 as pr
from dra_driver._gen import podresources_v1_pb2_grpc as pr_grpc
from dra_sandbox.kubelet.admission import is_extended_resource

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("v1beta1",)
CHECKPOINT = "kubelet_internal_checkpoint"
HEALTHY = "Healthy"


class DeviceAllocationError(Exception):
    """Allocation failed for a pod; the kubelet rejects it (UnexpectedAdmissionError)."""


@dataclass
class _Resource:
    name: str
    endpoint: Path
    options: dp.DevicePluginOptions
    channel: grpc.Channel
    devices: dict[str, str] = field(default_factory=dict)  # ID -> health


@dataclass(frozen=True)
class _PodDevices:
    namespace: str
    name: str
    containers: Mapping[str, Mapping[str, tuple[str, ...]]]  # container -> resource -> device IDs


class DeviceManager(dp_grpc.RegistrationServicer, pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, directory: Path, pod_resources_socket: Path | None, on_change: Callable[[], None]) -> None:
        self.directory = directory
        self.pod_resources_socket = pod_resources_socket
        self._on_change = on_change
        self._lock = threading.Lock()
        self._resources: dict[str, _Resource] = {}
        self._pods: dict[str, _PodDevices] = {}  # pod UID -> its devices
        self._cdi: dict[str, dict[str, list[str]]] = {}  # pod UID -> container -> CDI names Allocate gave
        self._servers: list[grpc.Server] = []
        self._stopping = threading.Event()

    # --- lifecycle --------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.directory.mkdir(mode=0o750, parents=True, exist_ok=True)
        for path in self.directory.iterdir():
            if path.name != CHECKPOINT and not path.is_dir():
                path.unlink(missing_ok=True)
        registration = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="dp-registration"))
        dp_grpc.add_RegistrationServicer_to_server(self, registration)
        registration.add_insecure_port(f"unix://{self.directory / 'kubelet.sock'}")
        self._servers.append(registration)
        if self.pod_resources_socket is not None:
            self.pod_resources_socket.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
            self.pod_resources_socket.unlink(missing_ok=True)
            listing = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="pod-resources"))
            pr_grpc.add_PodResourcesListerServicer_to_server(self, listing)
            listing.add_insecure_port(f"unix://{self.pod_resources_socket}")
            self._servers.append(listing)
        for server in self._servers:
            server.start()

    def stop(self) -> None:
        self._stopping.set()
        for server in self._servers:
            server.stop(0).wait()
        with self._lock:
            resources = list(self._resources.values())
        for resource in resources:
            resource.channel.close()

    # --- Registration -----------------------------------------------------------------------------------------

    def Register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        # Go's %q: a double-quoted string, and ["..."] for the list of versions.
        if request.version not in SUPPORTED_VERSIONS:
            supported = "[" + " ".join(json.dumps(v) for v in SUPPORTED_VERSIONS) + "]"
            context.abort(grpc.StatusCode.UNKNOWN, f"requested API version {json.dumps(request.version)} is not "
                                                   f"supported by kubelet. Supported version is {supported}")
        if not is_extended_resource(request.resource_name):
            context.abort(grpc.StatusCode.UNKNOWN, f"the ResourceName {json.dumps(request.resource_name)} is invalid")
        endpoint = self.directory / request.endpoint
        channel = grpc.insecure_channel(f"unix://{endpoint}")
        try:
            options = dp_grpc.DevicePluginStub(channel).GetDevicePluginOptions(dp.Empty(), timeout=10)
        except grpc.RpcError as exc:
            channel.close()
            context.abort(grpc.StatusCode.UNKNOWN, f"failed to dial device plugin: {exc}")
        resource = _Resource(request.resource_name, endpoint, options, channel)
        with self._lock:
            old = self._resources.get(request.resource_name)
            if old is not None:
                resource.devices = dict(old.devices)  # kept until the new plugin's first list
            self._resources[request.resource_name] = resource
        if old is not None:
            old.channel.close()  # ends its ListAndWatch
        threading.Thread(target=self._list_and_watch, args=(resource,), name=f"dp-{request.resource_name}",
                         daemon=True).start()
        log.info("device plugin registered: %s at %s", request.resource_name, endpoint)
        return dp.Empty()

    def _list_and_watch(self, resource: _Resource) -> None:
        try:
            for answer in dp_grpc.DevicePluginStub(resource.channel).ListAndWatch(dp.Empty()):
                with self._lock:
                    resource.devices = {d.ID: d.health for d in answer.devices}
                self._on_change()
        except (grpc.RpcError, ValueError) as exc:  # ValueError: the channel was closed under it
            log.info("ListAndWatch of %s ended: %s", resource.name, exc)
        with self._lock:
            current = self._resources.get(resource.name) is resource
            if current:
                resource.devices = dict.fromkeys(resource.devices, "Unhealthy")
        if current and not self._stopping.is_set():
            self._on_change()

    # --- what the Node and admission see ----------------------------------------------------------------------

    def resources(self) -> dict[str, tuple[int, int]]:
        """resource -> (capacity, allocatable)."""
        with self._lock:
            return {name: (len(r.devices), sum(1 for h in r.devices.values() if h == HEALTHY))
                    for name, r in self._resources.items()}  # fmt: skip

    def _allocated(self) -> dict[str, set[str]]:
        used: dict[str, set[str]] = {}
        for pod in self._pods.values():
            for per_resource in pod.containers.values():
                for name, ids in per_resource.items():
                    used.setdefault(name, set()).update(ids)
        return used

    def _choose(self, resource: _Resource, available: Sequence[str], needed: int) -> list[str]:
        if not resource.options.get_preferred_allocation_available:
            return list(available[:needed])
        request = dp.PreferredAllocationRequest(container_requests=[dp.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, allocation_size=needed)])  # fmt: skip
        try:
            [answer] = dp_grpc.DevicePluginStub(resource.channel).GetPreferredAllocation(request, timeout=10)\
                .container_responses  # fmt: skip
        except (grpc.RpcError, ValueError) as exc:
            log.warning("GetPreferredAllocation of %s failed, taking the first devices: %s", resource.name, exc)
            return list(available[:needed])
        chosen = [i for i in dict.fromkeys(answer.deviceIDs) if i in available]
        return chosen if len(chosen) == needed else list(available[:needed])

    def allocate(self, pod_uid: str, namespace: str, name: str,
                 containers: Sequence[tuple[str, Mapping[str, int]]]) -> dict[str, list[str]]:  # fmt: skip
        """CDI names per container for the pod's device-plugin resources (containers: name -> resource -> count).
        Raises DeviceAllocationError. Resources no plugin registered are not ours (the scheduler's business)."""
        with self._lock:
            if pod_uid in self._pods:  # admitted before (a container restart): the same devices (devicesToAllocate)
                return self._cdi.get(pod_uid, {})
        cdi: dict[str, list[str]] = {}
        allocated: dict[str, dict[str, tuple[str, ...]]] = {}
        for container, requests in containers:
            for resource_name, count in sorted(requests.items()):
                with self._lock:
                    resource = self._resources.get(resource_name)
                    if resource is None or count <= 0:
                        continue
                    used = self._allocated()
                    for other in allocated.values():
                        used.setdefault(resource_name, set()).update(other.get(resource_name, ()))
                    free = sorted(i for i, h in resource.devices.items()
                                  if h == HEALTHY and i not in used.get(resource_name, set()))  # fmt: skip
                if len(free) < count:
                    raise DeviceAllocationError(f"requested number of devices unavailable for {resource_name}. "
                                                f"Requested: {count}, Available: {len(free)}")  # fmt: skip
                ids = self._choose(resource, free, count)
                request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
                try:
                    [answer] = dp_grpc.DevicePluginStub(resource.channel).Allocate(request, timeout=30)\
                        .container_responses  # fmt: skip
                except (grpc.RpcError, ValueError) as exc:
                    raise DeviceAllocationError(f"Allocate failed due to {exc}, which is unexpected") from exc
                allocated.setdefault(container, {})[resource_name] = tuple(ids)
                cdi.setdefault(container, []).extend(d.name for d in answer.cdi_devices)
        with self._lock:
            self._pods[pod_uid] = _PodDevices(namespace, name, allocated)
            self._cdi[pod_uid] = cdi
        return cdi

    def retain(self, active: set[str]) -> None:
        """UpdateAllocatedDevices: the devices of pods that are no longer active return."""
        with self._lock:
            gone = [uid for uid in self._pods if uid not in active]
            for uid in gone:
                del self._pods[uid]
                self._cdi.pop(uid, None)
        if gone:
            log.info("device plugin devices of %d ended pods returned", len(gone))

    # --- PodResources -----------------------------------------------------------------------------------------

    def List(self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext) -> pr.ListPodResourcesResponse:
        with self._lock:
            pods = list(self._pods.values())
        return pr.ListPodResourcesResponse(pod_resources=[
            pr.PodResources(name=p.name, namespace=p.namespace, containers=[
                pr.ContainerResources(name=c, devices=[pr.ContainerDevices(resource_name=r, device_ids=list(ids))
                                                       for r, ids in per.items()])
                for c, per in p.containers.items()])
            for p in pods
        ])  # fmt: skip


def container_requests(pod: Mapping[str, object]) -> list[tuple[str, dict[str, int]]]:
    """(container name, extended resource -> count) of a pod's init containers and containers, from their limits
    (the API server copies an extended resource's limit into its request, and allows no request without it)."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    out = []
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            limits = (container.get("resources") or {}).get("limits") or {}
            wanted = {str(k): int(str(v)) for k, v in limits.items() if is_extended_resource(str(k))
                      and str(v).isdigit()}  # fmt: skip
            if wanted:
                out.append((str(container.get("name")), wanted))
    return out
