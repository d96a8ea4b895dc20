"""Which device IDs of a resource the kubelet's pods hold, from its PodResources API v1 `List`.

PodResources is the kubelet's supported interface for this (GA since Kubernetes 1.28; docs/device-plugin.md
"When GPUs return"); the kubelet's device-manager checkpoint file is its private state and changes format. The
answer is untrusted: only `resource_name` and `device_ids` are read, and only IDs of the resource asked for.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import structlog

from dra_driver._gen import podresources_v1_pb2 as pb
from dra_driver._gen import podresources_v1_pb2_grpc as pb_grpc
from dra_driver.deviceplugin.published import pod_ref

log = structlog.get_logger(__name__)

MAX_ANSWER_BYTES = 16 << 20  # a node of 110 pods answers in kilobytes; more is not the kubelet


# Device ID -> the pods ("namespace/name") the kubelet lists it for; a pod whose names are not Kubernetes names
# counts (its device is in use all the same) but is not named.
InUse = dict[str, frozenset[str]]


def devices_in_use(response: pb.ListPodResourcesResponse, resource_name: str) -> InUse:
    found: dict[str, set[str]] = {}
    for pod in response.pod_resources:
        ref = pod_ref(pod.namespace, pod.name)
        for container in pod.containers:
            for devices in container.devices:
                if devices.resource_name != resource_name:
                    continue
                for device_id in devices.device_ids:
                    pods = found.setdefault(device_id, set())
                    if ref is not None:
                        pods.add(ref)
    return {device_id: frozenset(pods) for device_id, pods in found.items()}


def list_in_use(socket: Path, resource_name: str, timeout: float = 5.0) -> InUse | None:
    """The IDs of `resource_name` allocated to the kubelet's active pods, with their pods; None when the kubelet
    did not answer (the caller then releases nothing)."""
    if not socket.exists():
        log.debug("no PodResources socket yet", socket=str(socket))
        return None
    options = [("grpc.max_receive_message_length", MAX_ANSWER_BYTES)]
    try:
        with grpc.insecure_channel(f"unix://{socket}", options=options) as channel:
            response = pb_grpc.PodResourcesListerStub(channel).List(pb.ListPodResourcesRequest(), timeout=timeout)
    except grpc.RpcError as exc:
        log.warning("the kubelet's PodResources List failed; no GPU is released until it answers",
                    socket=str(socket), error=str(exc))  # fmt: skip
        return None
    return devices_in_use(response, resource_name)
