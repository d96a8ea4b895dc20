"""SIGKILL the real plugin at each Fabric Manager point of a partition claim on a fake HGX node (FM in shared NVSwitch
mode, the fake's `fabric_partitions=true`); restart it; startup recovery and the kubelet's retry must converge: the
claim prepared once with its partition active and its GPUs on vfio-pci, and once it is unprepared the partition
inactive (NVIDIA's #1331: never left active) and its GPUs back on nvidia (docs/passthrough.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dra_driver.nvml.fake.state import read_fake_state
from dra_driver.plugin.checkpoint import ClaimState
from dra_sandbox.cluster import NodeSpec, SandboxCluster
from dra_sandbox.kubelet.draclient import ClaimRef
from tests.integration.conftest import NODE, allocated_claim, checkpoint, sandbox, spec_files
from tests.integration.test_crash import crash_in_prepare_then_retry, crash_in_unprepare_then_retry

# The FM points only: the engine's and the binder's own points around them are killed in-process for partition
# claims by tests/fmpartition. One pair of GPUs per case (dgx-h100: partitions 3 … 6 hold two GPUs each): cases must
# not step on each other in a cluster.
PREPARE_POINTS = ("fmpartition:after-record", "fmpartition:after-activate")
PAIRS = iter(range(3, 7))


@pytest.fixture(scope="module")
def cluster() -> Iterator[SandboxCluster]:
    node = NodeSpec(NODE, "fake:dgx-h100,mig=off,fabric_partitions=true", mig_mode="static",
                    plugin_env={"DRA_DRIVER_FABRIC_PARTITIONS": "on"})  # fmt: skip
    with sandbox("dra-fm-", [node]) as c:
        yield c


def _active(cluster: SandboxCluster) -> tuple[int, ...]:
    return read_fake_state(cluster.plugins[NODE].state_file).fm_active


def _prepared(cluster: SandboxCluster, ref: ClaimRef, partition: int) -> None:
    record = checkpoint(cluster).claims[ref.uid]
    assert record.state is ClaimState.PREPARE_COMPLETED
    [prepared] = record.devices
    made = prepared.fm_partition
    assert made is not None and made.activating and all(g.started for g in made.gpus)
    assert partition in _active(cluster)
    assert len(spec_files(cluster, ref.uid)) == 1


def _released(cluster: SandboxCluster, ref: ClaimRef, partition: int) -> None:
    assert ref.uid not in checkpoint(cluster).claims
    assert spec_files(cluster, ref.uid) == []
    assert partition not in _active(cluster)


@pytest.mark.parametrize("point", PREPARE_POINTS)
def test_crash_during_a_partition_prepare_converges(cluster: SandboxCluster, point: str) -> None:
    partition = next(PAIRS)
    ref = allocated_claim(cluster, [f"fm-partition-{partition}"])
    crash_in_prepare_then_retry(cluster, point, ref, prepared=lambda: _prepared(cluster, ref, partition),
                                released=lambda: _released(cluster, ref, partition))  # fmt: skip


def test_crash_during_a_partition_unprepare_converges(cluster: SandboxCluster) -> None:
    partition = next(PAIRS)
    ref = allocated_claim(cluster, [f"fm-partition-{partition}"])
    crash_in_unprepare_then_retry(cluster, "fmpartition:after-deactivate", ref,
                                  prepared=lambda: _prepared(cluster, ref, partition),
                                  released=lambda: _released(cluster, ref, partition))  # fmt: skip
