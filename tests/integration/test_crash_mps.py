"""SIGKILL the real plugin at every MPS step of a claim (directories, compute mode, daemon start; daemon stop,
compute-mode reset) and around them; restart it; the kubelet's retry must converge: the claim prepared once with
its daemon running with the recorded limits, and once it is unprepared no daemon, no MPS directory and no GPU
outside compute mode Default is left — read from the fake NVML state file and the plugin dir, as a restart sees
them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.nvml.fake.state import read_fake_state
from dra_driver.nvml.types import ComputeMode
from dra_driver.plugin.checkpoint import ClaimState
from dra_sandbox.cluster import SandboxCluster
from dra_sandbox.kubelet.draclient import ClaimRef
from tests.integration.conftest import NODE, allocated_claim, checkpoint, dra_client, spec_files
from tests.integration.test_crash import _crash_during, crash_in_prepare_then_retry, crash_in_unprepare_then_retry

# One GPU (or partition) per case: cases must not step on each other inside the module's cluster.
WHOLE = iter(f"gpu-{i}" for i in range(7))


def _config(kind: str = "GpuConfig") -> list[Any]:
    return [
        {
            "source": "FromClaim",
            "requests": [],
            "opaque": {
                "driver": DRIVER_NAME,
                "parameters": {
                    "apiVersion": "gpu.dra.dev/v1beta1",
                    "kind": kind,
                    "sharing": {
                        "strategy": "MPS",
                        "mpsConfig": {"defaultActiveThreadPercentage": 40, "defaultPinnedDeviceMemoryLimit": "8Gi"},
                    },
                },
            },
        }
    ]


def _mps_root(cluster: SandboxCluster) -> Path:
    return cluster.plugins[NODE].plugin_dir / "mps"


def _assert_prepared_with_daemon(cluster: SandboxCluster, ref: ClaimRef, device: str) -> None:
    record = checkpoint(cluster).claims[ref.uid]
    assert record.state is ClaimState.PREPARE_COMPLETED
    [prepared] = record.devices
    assert prepared.device == device and prepared.mps is not None
    assert len(spec_files(cluster, ref.uid)) == 1
    state = read_fake_state(cluster.plugins[NODE].state_file)
    [daemon] = state.mps_daemons
    assert daemon.id == prepared.mps.daemon == f"claim-{ref.uid}"
    assert daemon.active_thread_percentage == 40
    assert dict(daemon.pinned_memory_limits) == {prepared.mps.uuid: 8 << 30}
    assert [p.name for p in _mps_root(cluster).iterdir()] == [daemon.id]
    exclusive = [g.uuid for g in state.gpus if g.compute_mode is ComputeMode.EXCLUSIVE_PROCESS]
    assert exclusive == ([] if prepared.mig is not None else [prepared.gpu_uuid])


def _assert_nothing_left(cluster: SandboxCluster, ref: ClaimRef) -> None:
    assert ref.uid not in checkpoint(cluster).claims
    assert spec_files(cluster, ref.uid) == []
    state = read_fake_state(cluster.plugins[NODE].state_file)
    assert state.mps_daemons == ()
    assert {g.compute_mode for g in state.gpus} == {ComputeMode.DEFAULT}
    assert not _mps_root(cluster).exists() or list(_mps_root(cluster).iterdir()) == []


@pytest.mark.parametrize(
    "point",
    [
        "prepare:after-checkpoint-started",
        "sharing:after-mps-dirs",
        "sharing:after-compute-mode",
        "sharing:after-mps-start",
        "prepare:after-cdi",
    ],
)
def test_crash_during_an_mps_prepare_converges(cluster: SandboxCluster, point: str) -> None:
    device = next(WHOLE)
    ref = allocated_claim(cluster, [device], config=_config())
    # Startup recovery rolls the half-prepared claim back, daemon and compute mode included.
    crash_in_prepare_then_retry(
        cluster,
        point,
        ref,
        prepared=lambda: _assert_prepared_with_daemon(cluster, ref, device),
        released=lambda: _assert_nothing_left(cluster, ref),
    )


@pytest.mark.parametrize("point", ["sharing:after-mps-stop", "sharing:after-compute-mode-reset"])
def test_crash_during_an_mps_unprepare_converges(cluster: SandboxCluster, point: str) -> None:
    device = next(WHOLE)
    ref = allocated_claim(cluster, [device], config=_config())
    crash_in_unprepare_then_retry(
        cluster,
        point,
        ref,
        prepared=lambda: _assert_prepared_with_daemon(cluster, ref, device),
        released=lambda: _assert_nothing_left(cluster, ref),
    )


@pytest.mark.parametrize("point", ["sharing:after-mps-start", "sharing:after-mps-stop"])
def test_crash_around_mps_on_a_mig_partition_converges(cluster: SandboxCluster, point: str) -> None:
    device = "gpu-7-mig-3g40gb-9-4" if point.endswith("start") else "gpu-7-mig-3g40gb-9-0"
    ref = allocated_claim(cluster, [device], config=_config("MigDeviceConfig"))
    channel, client = dra_client(cluster)
    if point.endswith("stop"):
        assert client.prepare([ref])[ref.uid].ok
        _assert_prepared_with_daemon(cluster, ref, device)
    channel.close()
    _crash_during(cluster, point, "unprepare" if point.endswith("stop") else "prepare", ref)
    channel, client = dra_client(cluster)
    if point.endswith("start"):
        assert client.prepare([ref])[ref.uid].ok
        _assert_prepared_with_daemon(cluster, ref, device)
    assert client.unprepare([ref]) == {ref.uid: None}
    _assert_nothing_left(cluster, ref)
    assert all(not g.gis for g in read_fake_state(cluster.plugins[NODE].state_file).gpus)
    channel.close()
