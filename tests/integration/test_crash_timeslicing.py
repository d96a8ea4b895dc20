"""SIGKILL the real plugin around the time-slice step of a TimeSlicing claim; restart it; the kubelet's retry must
converge (claim prepared once with the time-slice recorded and set on its GPU), and once the claim is unprepared
no GPU is left with a non-default time-slice in the fake NVML state file."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.nvml.fake.state import read_fake_state
from dra_driver.nvml.types import TimeSlice
from dra_driver.plugin.checkpoint import ClaimState
from dra_sandbox.cluster import SandboxCluster
from dra_sandbox.kubelet.draclient import ClaimRef
from tests.integration.conftest import NODE, allocated_claim, checkpoint, dra_client, restart_plugin, spec_files
from tests.integration.test_crash import crash_in_prepare_then_retry, crash_in_unprepare_then_retry

# One GPU per case: cases must not step on each other inside the module's cluster.
WHOLE = iter(f"gpu-{i}" for i in range(8))
CONFIG: list[Any] = [
    {
        "source": "FromClaim",
        "requests": [],
        "opaque": {
            "driver": DRIVER_NAME,
            "parameters": {
                "apiVersion": "gpu.dra.dev/v1beta1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
            },
        },
    }
]


def _time_slices(cluster: SandboxCluster) -> dict[str, TimeSlice]:
    return {g.uuid: g.time_slice for g in read_fake_state(cluster.plugins[NODE].state_file).gpus}


def _assert_prepared_with_time_slice(cluster: SandboxCluster, ref: ClaimRef, device: str) -> None:
    record = checkpoint(cluster).claims[ref.uid]
    assert record.state is ClaimState.PREPARE_COMPLETED
    [prepared] = record.devices
    assert (prepared.device, prepared.sharing, prepared.time_slice) == (device, "TimeSlicing", "Long")
    assert len(spec_files(cluster, ref.uid)) == 1
    slices = _time_slices(cluster)
    assert prepared.gpu_uuid is not None and slices[prepared.gpu_uuid] is TimeSlice.LONG
    assert [u for u, t in slices.items() if t is not TimeSlice.DEFAULT] == [prepared.gpu_uuid]


def _assert_all_default(cluster: SandboxCluster, ref: ClaimRef) -> None:
    assert ref.uid not in checkpoint(cluster).claims
    assert spec_files(cluster, ref.uid) == []
    assert set(_time_slices(cluster).values()) == {TimeSlice.DEFAULT}


@pytest.mark.parametrize(
    "point", ["sharing:after-set-timeslice", "prepare:after-checkpoint-started", "prepare:after-devices"]
)
def test_crash_during_a_time_slicing_prepare_converges(cluster: SandboxCluster, point: str) -> None:
    device = next(WHOLE)
    ref = allocated_claim(cluster, [device], config=CONFIG)
    # Startup recovery rolls the half-prepared claim back, time-slice included.
    crash_in_prepare_then_retry(
        cluster,
        point,
        ref,
        prepared=lambda: _assert_prepared_with_time_slice(cluster, ref, device),
        released=lambda: _assert_all_default(cluster, ref),
    )


@pytest.mark.parametrize("point", ["sharing:after-reset-timeslice", "unprepare:after-devices"])
def test_crash_during_a_time_slicing_unprepare_converges(cluster: SandboxCluster, point: str) -> None:
    device = next(WHOLE)
    ref = allocated_claim(cluster, [device], config=CONFIG)
    crash_in_unprepare_then_retry(
        cluster,
        point,
        ref,
        prepared=lambda: _assert_prepared_with_time_slice(cluster, ref, device),
        released=lambda: _assert_all_default(cluster, ref),
    )


def test_time_slicing_on_a_mig_partition_is_accepted_with_nothing_applied(cluster: SandboxCluster) -> None:
    restart_plugin(cluster)
    mig_config = [dict(CONFIG[0], opaque={**CONFIG[0]["opaque"]})]
    mig_config[0]["opaque"]["parameters"] = {
        "apiVersion": "gpu.dra.dev/v1beta1",
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "TimeSlicing"},
    }
    mig_config[0]["requests"] = ["r0"]
    ref = allocated_claim(cluster, ["gpu-7-mig-3g40gb-9-4"], config=mig_config)
    channel, client = dra_client(cluster)
    result = client.prepare([ref])[ref.uid]
    channel.close()
    assert not result.error and result.devices  # NVIDIA's simple-mig-ts: nothing to apply on a MIG partition
    assert ref.uid in checkpoint(cluster).claims
    assert set(_time_slices(cluster).values()) == {TimeSlice.DEFAULT}
    channel, client = dra_client(cluster)
    assert client.unprepare([ref]) == {ref.uid: None}
    channel.close()
    _assert_all_default(cluster, ref)
