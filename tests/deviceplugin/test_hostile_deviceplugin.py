"""Hostile calls to the device plugin's gRPC service, over a real unix socket: Allocate and GetPreferredAllocation
with unknown or repeated device IDs, oversized lists and empty requests each get INVALID_ARGUMENT naming the field,
and none records a GPU, writes a CDI spec or changes what ListAndWatch or the slices say. And hostile pod names in a
PodResources answer: the GPU still counts as in use (never handed to DRA on a guess), the names are not published."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from dra_driver._gen import deviceplugin_v1beta1_pb2 as dp
from dra_driver._gen import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from dra_driver._gen import podresources_v1_pb2 as pr
from dra_driver.deviceplugin.podresources import devices_in_use
from dra_driver.deviceplugin.published import decode_held, encode_held
from dra_driver.deviceplugin.servicer import MAX_CONTAINERS, MAX_IDS, DevicePluginServicer
from tests.deviceplugin.test_agent import Node

RESOURCE = "nvidia.com/gpu"


@dataclass
class Served:
    node: Node
    stub: dp_grpc.DevicePluginStub
    work: Path

    def ids(self, *minors: int) -> list[str]:
        return [self.node.uuid(f"gpu-{m}") for m in minors]

    def untouched(self) -> None:
        """Nothing of a refused call is left: no record, no CDI spec, no republish, every GPU Healthy."""
        assert not self.node.agent.ownership.path.exists()
        assert not (self.work / "cdi").exists() or not list((self.work / "cdi").iterdir())
        assert self.node.republished == 0
        assert {d.health for d in self.node.agent.devices()} == {"Healthy"}


@pytest.fixture
def served() -> Iterator[Served]:
    work = Path(tempfile.mkdtemp(prefix="dph-", dir="/tmp"))  # short: unix socket paths stay < 108 bytes
    node = Node(work)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    dp_grpc.add_DevicePluginServicer_to_server(DevicePluginServicer(node.agent, threading.Event()), server)
    server.add_insecure_port(f"unix://{work / 'dp.sock'}")
    server.start()
    channel = grpc.insecure_channel(f"unix://{work / 'dp.sock'}")
    try:
        yield Served(node, dp_grpc.DevicePluginStub(channel), work)
    finally:
        channel.close()
        server.stop(None)
        shutil.rmtree(work, ignore_errors=True)


def _allocate(served: Served, *containers: list[str]) -> grpc.RpcError:
    request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=c) for c in containers])
    with pytest.raises(grpc.RpcError) as refused:
        served.stub.Allocate(request, timeout=10)
    return refused.value


ALLOCATE_CASES: dict[str, tuple[list[list[int | str]], str]] = {
    # name: (containers as minors or raw IDs, the field the error must name)
    "no container": ([], "container_requests: empty"),
    "an empty container": ([[0], []], "container_requests[1].devices_ids: empty"),
    "a GPU twice in one container": ([[0, 1, 0]], "container_requests[0].devices_ids[2]"),
    "a GPU in two containers": ([[0], [1, 0]], "container_requests[1].devices_ids[1]"),
    "a device name, not a UUID": ([["gpu-3"]], "container_requests[0].devices_ids[0]"),
    "a lower-cased UUID": ([["lower:0"]], "container_requests[0].devices_ids[0]"),
    "a UUID with a NUL": ([["nul:0"]], "container_requests[0].devices_ids[0]"),
    "5000 bytes": ([["GPU-" + "f" * 5000]], "container_requests[0].devices_ids[0]"),
    "an empty ID": ([[0, ""]], "container_requests[0].devices_ids[1]"),
    "too many containers": ([[0]] * (MAX_CONTAINERS + 1), f"more than {MAX_CONTAINERS}"),
    "too many IDs": ([[0], [f"GPU-{i}" for i in range(MAX_IDS + 1)]], "container_requests[1].devices_ids"),
}


def _resolve(served: Served, containers: list[list[int | str]]) -> list[list[str]]:
    out = []
    for c in containers:
        ids = []
        for x in c:
            if isinstance(x, int):
                ids.append(served.node.uuid(f"gpu-{x}"))
            elif x.startswith("lower:"):
                ids.append(served.node.uuid(f"gpu-{x[6:]}").lower())
            elif x.startswith("nul:"):
                ids.append(served.node.uuid(f"gpu-{x[4:]}") + "\x00")
            else:
                ids.append(x)
        out.append(ids)
    return out


@pytest.mark.parametrize("case", list(ALLOCATE_CASES))
def test_a_hostile_allocate_is_refused_naming_the_field_and_reserves_nothing(served: Served, case: str) -> None:
    containers, field = ALLOCATE_CASES[case]
    error = _allocate(served, *_resolve(served, containers))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in str(error.details())
    assert len(str(error.details())) < 600  # a 5000-byte ID is not echoed whole
    served.untouched()
    # The same GPUs asked properly afterwards are given: the refusal left no lock or half-made state behind.
    assert served.stub.Allocate(dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(
        devices_ids=served.ids(0))]), timeout=10).container_responses  # fmt: skip
    assert served.node.agent.withheld() == {served.node.uuid("gpu-0")}


def _preferred(available: list[str], must: list[str], size: int, count: int = 1) -> dp.PreferredAllocationRequest:
    return dp.PreferredAllocationRequest(container_requests=[dp.ContainerPreferredAllocationRequest(
        available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size)] * count)  # fmt: skip


def test_hostile_preferred_allocations_are_refused_naming_the_field(served: Served) -> None:
    a = served.ids(0, 1, 2, 3)
    cases = {
        "container_requests: empty": dp.PreferredAllocationRequest(),
        f"more than {MAX_CONTAINERS}": _preferred(a, [], 1, MAX_CONTAINERS + 1),
        "container_requests[0].available_deviceIDs[2]": _preferred([a[0], a[1], a[0]], [], 1),
        "container_requests[0].must_include_deviceIDs[1]": _preferred(a, [a[1], a[1]], 2),
        "container_requests[0].available_deviceIDs: empty": _preferred([], [], 1),
        "container_requests[0].allocation_size: 0": _preferred(a, [], 0),
        "container_requests[0].allocation_size: -3": _preferred(a, [], -3),
        "container_requests[0].allocation_size: 5": _preferred(a, [], 5),
        "container_requests[0].must_include_deviceIDs: 3 IDs, more than allocation_size 2": _preferred(a, a[:3], 2),
        "container_requests[0].must_include_deviceIDs[0]": _preferred(a[:2], [a[3]], 1),
        "container_requests[0].available_deviceIDs: 257": _preferred([f"GPU-{i}" for i in range(MAX_IDS + 1)], [], 1),
        "container_requests[0].must_include_deviceIDs: 257": _preferred(a, [f"GPU-{i}" for i in range(MAX_IDS + 1)], 1),
    }
    for field, request in cases.items():
        with pytest.raises(grpc.RpcError) as refused:
            served.stub.GetPreferredAllocation(request, timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert field in str(refused.value.details()), (field, refused.value.details())
    served.untouched()


def test_a_preferred_allocation_passes_over_ids_the_node_does_not_offer(served: Served) -> None:
    """Only a preference: an ID the kubelet's older list still has is passed over, not refused (a refusal would
    fail the pod's admission); Allocate is where an unknown ID is refused."""
    a = served.ids(0, 1)
    answer = served.stub.GetPreferredAllocation(_preferred(["GPU-gone", *a, "gpu-5"], [], 2), timeout=10)
    assert sorted(answer.container_responses[0].deviceIDs) == sorted(a)
    served.untouched()


def test_hostile_pod_names_in_pod_resources_keep_the_gpu_in_use_but_are_not_published(tmp_path: Path) -> None:
    node = Node(tmp_path)
    gpus = [node.uuid(f"gpu-{m}") for m in range(4)]
    names = [("Default", "p"), ("n", "a" * 300), ("n", "p\x00q"), ("../..", "etc"), ("", ""), ("team-a", "trainer-0")]
    response = pr.ListPodResourcesResponse(pod_resources=[
        pr.PodResources(namespace=ns, name=name, containers=[pr.ContainerResources(name="c", devices=[
            pr.ContainerDevices(resource_name=RESOURCE, device_ids=[gpus[i % 4]])])])
        for i, (ns, name) in enumerate(names)
    ])  # fmt: skip
    in_use = devices_in_use(response, RESOURCE)
    assert set(in_use) == set(gpus)  # every listed GPU counts, whoever the pod is
    assert in_use[gpus[0]] == frozenset()  # "Default/p" (upper case) and "../../etc": not Kubernetes names
    assert in_use[gpus[1]] == frozenset({"team-a/trainer-0"})
    node.agent.reconcile(in_use)
    assert node.agent.withheld() == set(gpus)
    held = {h.device: h.pods for h in node.agent.held()}
    assert held == {"gpu-0": (), "gpu-1": ("team-a/trainer-0",), "gpu-2": (), "gpu-3": ()}
    # What is published decodes again with the same reader status and explain use.
    assert decode_held(encode_held(node.agent.held())) == node.agent.held()
