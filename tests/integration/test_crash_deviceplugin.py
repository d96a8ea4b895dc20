"""SIGKILL the real plugin (`--device-plugin on`, the sandbox kubelet's device manager and PodResources) at each
device-plugin crash point; restart it; one GPU stays in one world at a time (docs/device-plugin.md "One GPU, one
world"), on disk (no GPU both in the ownership record's `allocated` and in a claim checkpoint record) and on the
wire (ListAndWatch reports exactly the DRA-held GPUs Unhealthy, the slices leave out exactly the allocated ones)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from dra_driver._gen import deviceplugin_v1beta1_pb2 as dp
from dra_driver._gen import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from dra_driver.deviceplugin.ownership import FILE_NAME, Ownership, OwnershipFile
from dra_driver.plugin.faults import ENV_VAR
from dra_sandbox.cluster import NodeSpec, SandboxCluster
from dra_sandbox.kubelet.draclient import ClaimRef
from tests.integration.conftest import NODE, allocated_claim, checkpoint, dra_client, restart_plugin, sandbox
from tests.polling import wait_for

# The plugin's defaults (deviceplugin/settings.py): an allocation PodResources does not list is kept for the grace
# (10 s), and PodResources is asked every 5 s.
RELEASE_WITHIN_S = 40


@pytest.fixture(scope="module")
def cluster() -> Iterator[SandboxCluster]:
    with sandbox("dra-dpc-", [NodeSpec(NODE, "fake:dgx-h100", mig_mode="static")], device_plugin=True) as c:
        yield c


def _ownership(cluster: SandboxCluster) -> Ownership:
    return OwnershipFile(cluster.plugins[NODE].plugin_dir / FILE_NAME).load()


def _slices(cluster: SandboxCluster) -> dict[str, str]:
    """Whole GPUs in the node's ResourceSlices: UUID by device name."""
    listed = cluster.api.get("/apis/resource.k8s.io/v1/resourceslices") or {}
    return {d["name"]: d["attributes"]["uuid"]["string"] for s in listed.get("items") or []
            for d in s["spec"].get("devices") or [] if d["attributes"]["type"]["string"] == "gpu"}  # fmt: skip


def _stub(cluster: SandboxCluster) -> tuple[grpc.Channel, dp_grpc.DevicePluginStub]:
    directory = cluster.plugins[NODE].device_plugins_dir
    # The device-plugin socket comes up beside the DRA ones, not before `wait_serving` returns.
    socket = wait_for(lambda: next((p for p in directory.glob("*.sock") if p.name != "kubelet.sock"), None), 30,
                      "the plugin's device-plugin socket", interval=0.05)  # fmt: skip
    channel = grpc.insecure_channel(f"unix://{socket}")
    return channel, dp_grpc.DevicePluginStub(channel)


def _unhealthy(cluster: SandboxCluster) -> set[str]:
    """The GPUs ListAndWatch's first answer reports Unhealthy. A killed plugin leaves its socket file behind, so
    until the restarted one serves, the socket refuses: asked again until it answers."""

    def listed() -> tuple[set[str]] | None:
        channel, stub = _stub(cluster)
        stream = stub.ListAndWatch(dp.Empty(), timeout=10)
        try:
            return ({d.ID for d in next(stream).devices if d.health == "Unhealthy"},)
        except grpc.RpcError as exc:
            if exc.code() is grpc.StatusCode.UNAVAILABLE:
                return None
            raise
        finally:
            stream.cancel()
            channel.close()

    return wait_for(listed, 30, "the restarted plugin's ListAndWatch", interval=0.1)[0]


def _dra_gpus(cluster: SandboxCluster) -> set[str]:
    """Every GPU a claim checkpoint record names (none before the first claim writes the file)."""
    cp = checkpoint(cluster)
    claims = cp.claims.values() if cp is not None else ()
    return {d.gpu_uuid for r in claims for d in (*r.devices, *r.allocated) if d.gpu_uuid is not None}


def _one_world(cluster: SandboxCluster) -> None:
    """The invariant, on disk and on the wire, with the plugin serving."""
    owned = _ownership(cluster)
    dra = _dra_gpus(cluster) | set(owned.dra)
    assert not set(owned.allocated) & _dra_gpus(cluster), "a GPU is both the device plugin's and a DRA claim's"
    assert not set(owned.allocated) & set(owned.dra)
    assert _unhealthy(cluster) == dra  # ListAndWatch withholds exactly the DRA-held GPUs (the fake's are healthy)
    withheld = set(owned.allocated)
    wait_for(lambda: not withheld & set(_slices(cluster).values()), 30, "the allocated GPUs to leave the slices")


def _killed(cluster: SandboxCluster, point: str) -> None:
    assert cluster.plugins[NODE].wait_exit(RELEASE_WITHIN_S) == -9, f"the plugin did not die at {point}"


def test_a_crash_after_allocate_recorded_and_after_its_release_recorded(cluster: SandboxCluster) -> None:
    """Allocate's record written, the answer never sent: the GPU stays the device plugin's across the restart, and
    returns once PodResources does not list it (after the grace); a crash right after that release is recorded
    leaves it returned."""
    gpu = _slices(cluster)["gpu-3"]
    restart_plugin(cluster, {ENV_VAR: "deviceplugin:allocate-after-record"})
    channel, stub = _stub(cluster)
    with pytest.raises(grpc.RpcError):  # the kubelet never gets the answer
        stub.Allocate(dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=[gpu])]),
                      timeout=20)  # fmt: skip
    channel.close()
    _killed(cluster, "deviceplugin:allocate-after-record")
    assert gpu in _ownership(cluster).allocated  # the record was written before the answer
    # The restarted plugin still owns it (PodResources does not list it, but the grace has not passed) and is
    # killed again right after the reconcile that releases it records the release (no wire check in between: the
    # grace runs out within seconds of the restart).
    restart_plugin(cluster, {ENV_VAR: "deviceplugin:release-after-record"})
    _killed(cluster, "deviceplugin:release-after-record")
    assert gpu not in _ownership(cluster).allocated  # the release was recorded before the crash
    restart_plugin(cluster)
    wait_for(lambda: _slices(cluster).get("gpu-3") == gpu, 30, "the released GPU back in the slices")
    _one_world(cluster)
    assert gpu not in _unhealthy(cluster)


def _crash_after_the_guard_reserved(cluster: SandboxCluster, device: str) -> tuple[str, ClaimRef]:
    """A claim of `device` whose prepare the plugin was killed in right after the guard reserved its GPU."""
    gpu = _slices(cluster)[device]
    ref = allocated_claim(cluster, [device])
    restart_plugin(cluster, {ENV_VAR: "deviceplugin:guard-after-reserve"})
    channel, client = dra_client(cluster)
    assert client.prepare([ref])[ref.uid].error
    channel.close()
    _killed(cluster, "deviceplugin:guard-after-reserve")
    return gpu, ref


def test_a_crash_after_the_guard_reserved_a_claims_gpu(cluster: SandboxCluster) -> None:
    """The guard's reservation written, the engine not run: the restarted plugin reports the GPU Unhealthy and
    Allocate refuses it; the kubelet's retry prepares the claim, and its unprepare hands the GPU back."""
    gpu, ref = _crash_after_the_guard_reserved(cluster, "gpu-5")
    assert _ownership(cluster).dra[gpu].claim_uid == ref.uid
    cp = checkpoint(cluster)
    assert cp is None or ref.uid not in cp.claims
    restart_plugin(cluster)
    _one_world(cluster)
    assert gpu in _unhealthy(cluster)
    channel, stub = _stub(cluster)
    with pytest.raises(grpc.RpcError) as refused:
        stub.Allocate(dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=[gpu])]),
                      timeout=20)  # fmt: skip
    channel.close()
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    channel, client = dra_client(cluster)
    retried = client.prepare([ref])[ref.uid]  # the kubelet retries the claim
    assert retried.ok, retried.error
    _one_world(cluster)
    assert gpu in _dra_gpus(cluster)
    assert client.unprepare([ref]) == {ref.uid: None}
    channel.close()
    assert gpu not in _ownership(cluster).dra  # the reservation went with the claim
    _one_world(cluster)
    assert gpu not in _unhealthy(cluster)


def test_a_reservation_left_by_a_crash_and_never_retried_is_dropped(cluster: SandboxCluster) -> None:
    """The claim is deleted instead of retried: its reservation goes once the checkpoint does not name the GPU and
    the grace has passed, and the GPU is the kubelet's again (Healthy, allocatable)."""
    gpu, ref = _crash_after_the_guard_reserved(cluster, "gpu-6")
    cluster.api.request("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{ref.namespace}/resourceclaims/{ref.name}")
    restart_plugin(cluster)
    wait_for(lambda: gpu not in _ownership(cluster).dra, RELEASE_WITHIN_S, "the left reservation dropped", interval=0.2)
    _one_world(cluster)
    assert gpu not in _unhealthy(cluster)
    channel, stub = _stub(cluster)
    answer = stub.Allocate(dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=[gpu])]),
                           timeout=20)  # fmt: skip
    channel.close()
    assert len(answer.container_responses[0].cdi_devices) == 1
    assert gpu in _ownership(cluster).allocated
