"""Hostile PodResources answers (dra_driver/deviceplugin/podresources.py reads them as untrusted input), over a real
unix-socket gRPC server: unknown resources and their IDs ignored, duplicate IDs counted once, an answer over
MAX_ANSWER_BYTES refused whole (None: nothing released on a guess), a long list within it read; and the agent adopts
none of the IDs it does not offer."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from dra_driver._gen import podresources_v1_pb2 as pr
from dra_driver._gen import podresources_v1_pb2_grpc as pr_grpc
from dra_driver.deviceplugin.podresources import MAX_ANSWER_BYTES, list_in_use
from tests.deviceplugin.fakekubelet import RESOURCE
from tests.deviceplugin.test_agent import Node


class Answering(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.response = pr.ListPodResourcesResponse()

    def List(self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext) -> pr.ListPodResourcesResponse:
        return self.response


@pytest.fixture
def kubelet() -> Iterator[tuple[Answering, Path]]:
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="dra-pr-") as tmp:
        socket = Path(tmp) / "kubelet.sock"
        servicer = Answering()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=1),
                             options=[("grpc.max_send_message_length", 4 * MAX_ANSWER_BYTES)])  # fmt: skip
        pr_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
        server.add_insecure_port(f"unix://{socket}")
        server.start()
        try:
            yield servicer, socket
        finally:
            server.stop(0).wait()


def _pod(name: str, *devices: tuple[str, list[str]]) -> pr.PodResources:
    container = pr.ContainerResources(
        name="c", devices=[pr.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devices]
    )
    return pr.PodResources(name=name, namespace="n", containers=[container])


def test_unknown_resources_are_ignored_and_duplicates_count_once(kubelet: tuple[Answering, Path]) -> None:
    servicer, socket = kubelet
    servicer.response = pr.ListPodResourcesResponse(pod_resources=[
        _pod("a", (RESOURCE, ["GPU-1", "GPU-1"]), ("nvidia.com/gpu.shared", ["GPU-2"]), ("", ["GPU-3"])),
        _pod("b", (RESOURCE, ["GPU-1"]), ("example.com/" + "x" * 300, ["GPU-4"])),
        _pod("c"),
    ])  # fmt: skip
    assert list_in_use(socket, RESOURCE) == {"GPU-1": frozenset({"n/a", "n/b"})}


def test_an_answer_over_the_limit_is_refused_whole(kubelet: tuple[Answering, Path]) -> None:
    servicer, socket = kubelet
    ids = [f"GPU-{n:08d}" + "x" * 500 for n in range(MAX_ANSWER_BYTES // 500 + 10)]
    servicer.response = pr.ListPodResourcesResponse(pod_resources=[_pod("huge", (RESOURCE, ids))])
    assert servicer.response.ByteSize() > MAX_ANSWER_BYTES
    assert list_in_use(socket, RESOURCE) is None  # not read: the caller releases nothing


def test_a_long_list_within_the_limit_is_read(kubelet: tuple[Answering, Path]) -> None:
    servicer, socket = kubelet
    pods = [_pod(f"p{n}", (RESOURCE, [f"GPU-{n}"]), ("example.com/nic", [f"nic-{n}"])) for n in range(20000)]
    servicer.response = pr.ListPodResourcesResponse(pod_resources=pods)
    found = list_in_use(socket, RESOURCE)
    assert found is not None and len(found) == 20000


def test_the_agent_adopts_only_offered_gpus_from_a_hostile_list(tmp_path: Path) -> None:
    node = Node(tmp_path)
    held = node.uuid("gpu-3")
    hostile = {held, held.lower(), held + "\x00", " " + held, "GPU-" + "f" * 5000, "", "gpu-3"}
    node.agent.reconcile(dict.fromkeys(hostile, ()))
    assert node.agent.withheld() == {held}
