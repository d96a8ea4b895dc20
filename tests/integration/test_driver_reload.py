"""An NVIDIA driver reload under the real plugin process, acted on from another process as the GPU Operator's driver
container does (`rmmod nvidia`, then `modprobe nvidia` of a new version): devices tainted unmonitored (None) while
it is away, prepares refused with a retryable error, NVML re-initialised, the slices republished with the new
driverVersion, a whole-GPU claim re-verified (its time-slice applied again), a MIG claim reported lost."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.nvml.types import TimeSlice
from dra_sandbox.cluster import NodeSpec, SandboxCluster
from tests.integration.conftest import NODE, allocated_claim, checkpoint, dra_client, sandbox
from tests.polling import wait_for

MIG_DEVICE = "gpu-0-mig-2g12gb-5-0"
NEW_VERSION = "580.300.1"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SandboxCluster]:
    with sandbox("dra-drl-", [NodeSpec(NODE, "fake:a30x4")]) as c:
        yield c


def _devices(cluster: SandboxCluster) -> dict[str, Any]:
    return {d["name"]: d for s in cluster.items("/apis/resource.k8s.io/v1/resourceslices")
            for d in s["spec"].get("devices", [])}  # fmt: skip


def _unmonitored(device: dict[str, Any]) -> bool:
    return any(t == {"key": f"{DRIVER_NAME}/unmonitored", "value": "driver-reload", "effect": "None"}
               for t in device.get("taints", []))  # fmt: skip


def _events(cluster: SandboxCluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.items("/api/v1/namespaces/default/events") if e.get("reason") == reason]


def _time_slicing(interval: str) -> list[Any]:
    parameters = {"apiVersion": "gpu.dra.dev/v1beta1", "kind": "GpuConfig",
                  "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}}  # fmt: skip
    return [{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER_NAME, "parameters": parameters}}]


def test_a_driver_reload_with_a_new_version(cluster: SandboxCluster) -> None:
    plugin = cluster.plugins[NODE]
    admin = open_backend(plugin.nvml_spec)  # another process's view of the same node
    assert isinstance(admin, FakeNvml)
    admin.init()
    gpu0 = admin.gpus()[0].uuid
    admin.set_mig_mode(gpu0, True)
    admin.reset_gpu(gpu0)
    assert plugin.process is not None
    plugin.process.send_signal(signal.SIGHUP)  # re-discover: GPU 0 offers MIG devices now
    wait_for(lambda: MIG_DEVICE in _devices(cluster), 30, "the MIG devices to be published")
    whole = allocated_claim(cluster, ["gpu-1"], config=_time_slicing("Medium"))
    mig = allocated_claim(cluster, [MIG_DEVICE])
    channel, client = dra_client(cluster)
    try:
        first = client.prepare([whole, mig])
        assert all(r.ok for r in first.values()), first
        gpu1 = admin.gpus()[1].uuid
        assert admin.time_slice(gpu1) is TimeSlice.MEDIUM

        admin.unload_driver()
        wait_for(lambda: all(_unmonitored(d) for d in _devices(cluster).values()), 30,
                 "every device tainted unmonitored while the driver is away")  # fmt: skip
        refused = client.prepare([allocated_claim(cluster, ["gpu-2"])])
        (error,) = [r.error for r in refused.values()]
        assert f"the NVIDIA driver is reloading on node {NODE}" in (error or "") and "the kubelet retries" in (error or "")

        admin.load_driver(NEW_VERSION)
        wait_for(lambda: {d["attributes"]["driverVersion"]["version"] for d in _devices(cluster).values()}
                 == {NEW_VERSION}, 30, "the slices republished with the new driverVersion")  # fmt: skip
        wait_for(lambda: not any(_unmonitored(d) for d in _devices(cluster).values()), 30, "the taint removed")

        admin.shutdown()
        admin.init()  # a session of the new driver
        assert admin.time_slice(gpu1) is TimeSlice.MEDIUM  # re-applied as recorded
        again = client.prepare([whole])[whole.uid]
        assert again.ok and [d.cdi_device_ids for d in again.devices] == [
            d.cdi_device_ids for d in first[whole.uid].devices
        ]
        lost = client.prepare([mig])[mig.uid]
        assert not lost.ok and "did not survive the NVIDIA driver reload" in (lost.error or "")
        assert MIG_DEVICE in (lost.error or "")
        assert admin.gpu_instances(gpu0) == []  # not re-created under the name the container had
        record = checkpoint(cluster).claims[mig.uid]
        assert record.lost is not None  # kept, marked
        wait_for(lambda: _events(cluster, "PreparedClaimLost"), 30, "the PreparedClaimLost Event on the claim")
        event = _events(cluster, "PreparedClaimLost")[0]
        assert event["type"] == "Warning" and event["involvedObject"]["uid"] == mig.uid
        wait_for(lambda: _events(cluster, "NvidiaDriverReloaded"), 30, "the NvidiaDriverReloaded Event on the Node")
        reloaded = _events(cluster, "NvidiaDriverReloaded")[0]
        assert reloaded["type"] == "Normal" and NEW_VERSION in reloaded["message"]
        assert reloaded["involvedObject"]["kind"] == "Node"

        assert client.unprepare([mig, whole]) == {mig.uid: None, whole.uid: None}
        assert checkpoint(cluster).claims == {}
        assert admin.time_slice(gpu1) is TimeSlice.DEFAULT
    finally:
        channel.close()
        admin.shutdown()
