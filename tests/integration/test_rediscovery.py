"""Re-discovery without a restart: a static MIG layout changed by an admin shows up in the slices (periodic
re-read), and SIGHUP re-reads at once."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.types import Placement
from dra_sandbox.cluster import NodeSpec, SandboxCluster
from tests.integration.conftest import sandbox
from tests.polling import wait_for

NODE = "node-a100"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SandboxCluster]:
    # Only SIGHUP re-reads in the first test; the second restarts the plugin with a short interval.
    nodes = [NodeSpec(NODE, "fake:dgx-a100", mig_mode="static")]
    with sandbox("dra-rd-", nodes, plugin_env={"DRA_DRIVER_REDISCOVERY_INTERVAL": "3600"}) as c:
        yield c


def _devices(cluster: SandboxCluster) -> set[str]:
    slices = cluster.wait_pool_published(NODE)
    return {d["name"] for s in slices for d in s["spec"].get("devices", [])}


def test_admin_made_mig_device_is_published_after_sighup(cluster: SandboxCluster) -> None:
    plugin = cluster.plugins[NODE]
    assert _devices(cluster) == set()  # MIG on, no instances yet: nothing to offer in static mode
    admin = open_backend(plugin.nvml_spec)  # the same fake GPUs, as `nvidia-smi mig -cgi` would change them
    admin.init()
    gpu = admin.gpus()[2].uuid
    gi = admin.create_gpu_instance(gpu, 9, Placement(4, 4))
    admin.create_compute_instance(gpu, gi.id, 2)
    assert plugin.process is not None
    plugin.process.send_signal(signal.SIGHUP)
    wait_for(lambda: _devices(cluster) == {"gpu-2-mig-3g20gb-9-4"}, 20, "the new MIG device to be published")
    slices = cluster.wait_pool_published(NODE)
    assert {s["spec"]["pool"]["generation"] for s in slices} == {2}
    admin.destroy_compute_instance(gpu, gi.id, 0)
    admin.destroy_gpu_instance(gpu, gi.id)
    plugin.process.send_signal(signal.SIGHUP)
    wait_for(lambda: _devices(cluster) == set(), 20, "the removed MIG device to be unpublished")
    admin.shutdown()


def test_periodic_rediscovery_without_a_signal(cluster: SandboxCluster) -> None:
    plugin = cluster.plugins[NODE]
    plugin.stop()
    plugin.start({"DRA_DRIVER_REDISCOVERY_INTERVAL": "1"})
    plugin.wait_serving()
    admin = open_backend(plugin.nvml_spec)
    admin.init()
    gpu = admin.gpus()[5].uuid
    gi = admin.create_gpu_instance(gpu, 19, Placement(3, 1))
    admin.create_compute_instance(gpu, gi.id, 0)
    wait_for(lambda: "gpu-5-mig-1g5gb-19-3" in _devices(cluster), 20, "the periodic re-discovery to publish it")
    admin.shutdown()
