"""SIGKILL the real plugin while a share of a GPU comes or goes next to another share of the same GPU: the one MPS
daemon of that GPU must end up serving exactly the shares that are prepared, with their limits (the largest
share's), and disappear — compute mode back to Default — with the last one. Read from the fake NVML state file
and the plugin dir, as a restart sees them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.nvml.fake.state import read_fake_state
from dra_driver.nvml.types import ComputeMode
from dra_sandbox.cluster import NodeSpec, SandboxCluster
from dra_sandbox.kubelet.draclient import ClaimRef
from dra_sandbox.objects import create_allocated_claim
from tests.integration.conftest import NODE, checkpoint, dra_client, sandbox, spec_files
from tests.integration.test_crash import _crash_during

GIB = 1 << 30
GPUS = iter(range(8))


@pytest.fixture(scope="module")
def cluster() -> Iterator[SandboxCluster]:
    node = NodeSpec(NODE, "fake:dgx-h100", mig_mode="none", plugin_env={"DRA_DRIVER_SHARING_MODE": "shares"})
    with sandbox("dra-sh-", [node]) as c:
        yield c


def _share(cluster: SandboxCluster, gpu: int, memory_gib: int, compute: int) -> ClaimRef:
    name = f"s-{uuid.uuid4().hex[:10]}"
    claim = create_allocated_claim(
        cluster.api,
        namespace="default",
        name=name,
        driver=DRIVER_NAME,
        pool=NODE,
        devices=[f"gpu-{gpu}-shared"],
        result_fields=[
            {"shareID": str(uuid.uuid4()), "consumedCapacity": {"memory": f"{memory_gib}Gi", "compute": str(compute)}}
        ],
    )
    return ClaimRef(namespace="default", name=name, uid=claim["metadata"]["uid"])


def _daemon_limits(cluster: SandboxCluster) -> dict[str, tuple[int | None, dict[str, int], int]]:
    """daemon id -> (thread %, pinned limits, number of shares) of every running daemon."""
    state = read_fake_state(cluster.plugins[NODE].state_file)
    return {d.id: (d.active_thread_percentage, dict(d.pinned_memory_limits), len(d.shares)) for d in state.mps_daemons}


def _exclusive_gpus(cluster: SandboxCluster) -> set[str]:
    state = read_fake_state(cluster.plugins[NODE].state_file)
    return {g.uuid for g in state.gpus if g.compute_mode is ComputeMode.EXCLUSIVE_PROCESS}


def _gpu_uuid(cluster: SandboxCluster, ref: ClaimRef) -> str:
    [device] = checkpoint(cluster).claims[ref.uid].devices
    assert device.gpu_uuid is not None and device.mps is not None and device.mps.share
    return str(device.gpu_uuid)


def _daemon_of(gpu_uuid: str) -> str:
    return "gpu-" + gpu_uuid.lower().removeprefix("gpu-")


@pytest.mark.parametrize(
    "point", ["sharing:after-mps-dirs", "sharing:after-mps-start", "prepare:after-cdi", "prepare:after-devices"]
)
def test_crash_while_a_second_share_is_prepared(cluster: SandboxCluster, point: str) -> None:
    gpu = next(GPUS)
    first, second = _share(cluster, gpu, 10, 10), _share(cluster, gpu, 30, 40)
    channel, client = dra_client(cluster)
    assert client.prepare([first])[first.uid].ok
    channel.close()
    gpu_uuid = _gpu_uuid(cluster, first)
    _crash_during(cluster, point, "prepare", second)
    # Rolled back: the daemon serves the first share alone, with its limits.
    assert _daemon_limits(cluster)[_daemon_of(gpu_uuid)] == (10, {gpu_uuid: 10 * GIB}, 1)
    channel, client = dra_client(cluster)
    assert client.prepare([second])[second.uid].ok
    assert _daemon_limits(cluster)[_daemon_of(gpu_uuid)] == (40, {gpu_uuid: 30 * GIB}, 2)
    assert client.unprepare([first, second]) == {first.uid: None, second.uid: None}
    channel.close()
    assert _daemon_of(gpu_uuid) not in _daemon_limits(cluster)
    assert gpu_uuid not in _exclusive_gpus(cluster)
    assert spec_files(cluster, second.uid) == []


@pytest.mark.parametrize(
    "point", ["sharing:after-mps-start", "unprepare:after-devices", "sharing:after-mps-stop", "unprepare:after-cdi"]
)
def test_crash_while_a_share_goes(cluster: SandboxCluster, point: str) -> None:
    gpu = next(GPUS)
    big, small = _share(cluster, gpu, 30, 40), _share(cluster, gpu, 10, 10)
    channel, client = dra_client(cluster)
    assert client.prepare([big])[big.uid].ok and client.prepare([small])[small.uid].ok
    channel.close()
    gpu_uuid = _gpu_uuid(cluster, big)
    # The big share goes (the small one stays): "after-mps-start" is the re-limit; the last share's unprepare
    # reaches "after-mps-stop".
    last = point == "sharing:after-mps-stop"
    going = small if last else big
    staying: ClaimRef | None = None if last else small
    if last:
        channel, client = dra_client(cluster)
        assert client.unprepare([big]) == {big.uid: None}
        channel.close()
    _crash_during(cluster, point, "unprepare", going)
    channel, client = dra_client(cluster)
    assert client.unprepare([going]) == {going.uid: None}
    channel.close()
    if staying is None:
        assert _daemon_of(gpu_uuid) not in _daemon_limits(cluster)
        assert gpu_uuid not in _exclusive_gpus(cluster)
        return
    assert _daemon_limits(cluster)[_daemon_of(gpu_uuid)] == (10, {gpu_uuid: 10 * GIB}, 1)
    assert gpu_uuid in _exclusive_gpus(cluster)
    channel, client = dra_client(cluster)
    assert client.unprepare([staying]) == {staying.uid: None}
    channel.close()
    assert _daemon_of(gpu_uuid) not in _daemon_limits(cluster)
    assert gpu_uuid not in _exclusive_gpus(cluster)
