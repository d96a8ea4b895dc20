"""SIGKILL the plugin at every step of prepare, unprepare and MIG create/destroy; restart it; the kubelet's
retry must converge: the claim prepared exactly once (or released), no stray CDI file, a valid checkpoint,
and no orphaned GPU or compute instance in the fake NVML state."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.nvml.fake.state import read_fake_state
from dra_driver.plugin.checkpoint import ClaimState
from dra_driver.plugin.faults import ENV_VAR, METADATA_POINTS, MIG_POINTS, PREPARE_POINTS, UNPREPARE_POINTS
from dra_sandbox.cluster import SandboxCluster
from dra_sandbox.kubelet.draclient import ClaimRef
from tests.integration.conftest import NODE, allocated_claim, checkpoint, dra_client, restart_plugin, spec_files

MIG_PREPARE = [p for p in MIG_POINTS if "destroy" not in p]
MIG_UNPREPARE = [p for p in MIG_POINTS if "destroy" in p]
# One device per case: cases must not step on each other inside the shared cluster.
WHOLE = iter(f"gpu-{i}" for i in range(8))
PARTITIONS = iter(f"gpu-{g}-mig-3g40gb-9-{start}" for g in range(8) for start in (4, 0))


def _live_instances(cluster: SandboxCluster) -> list[tuple[str, int, int]]:
    state = read_fake_state(cluster.plugins[NODE].state_file)
    return [(g.uuid, gi.profile_id, gi.placement.start) for g in state.gpus for gi in g.gis]


def _crash_during(cluster: SandboxCluster, point: str, call: str, ref: ClaimRef) -> None:
    restart_plugin(cluster, {ENV_VAR: point})
    channel, client = dra_client(cluster)
    result = getattr(client, call)([ref])
    channel.close()
    assert cluster.plugins[NODE].wait_exit(20) == -9, f"the plugin did not die at {point}"
    error = result[ref.uid].error if call == "prepare" else result[ref.uid]
    assert error, f"{call} reported success although the plugin was killed at {point}"
    restart_plugin(cluster)


def crash_in_prepare_then_retry(
    cluster: SandboxCluster, point: str, ref: ClaimRef, prepared: Callable[[], None], released: Callable[[], None]
) -> None:
    """SIGKILL the plugin at `point` of the claim's prepare; startup recovery must leave it `released`, the kubelet's
    retry must leave it `prepared`, and an unprepare `released` again."""
    _crash_during(cluster, point, "prepare", ref)
    released()
    channel, client = dra_client(cluster)
    retried = client.prepare([ref])[ref.uid]  # the kubelet retries the claim
    assert retried.ok, retried.error
    prepared()
    assert client.unprepare([ref]) == {ref.uid: None}
    released()
    channel.close()


def crash_in_unprepare_then_retry(
    cluster: SandboxCluster, point: str, ref: ClaimRef, prepared: Callable[[], None], released: Callable[[], None]
) -> None:
    """Prepare the claim (`prepared`), SIGKILL the plugin at `point` of its unprepare; the kubelet's retry must leave
    it `released`."""
    channel, client = dra_client(cluster)
    assert client.prepare([ref])[ref.uid].ok
    prepared()
    channel.close()
    _crash_during(cluster, point, "unprepare", ref)
    channel, client = dra_client(cluster)
    assert client.unprepare([ref]) == {ref.uid: None}
    released()
    channel.close()


def _assert_prepared_once(cluster: SandboxCluster, ref: ClaimRef, device: str) -> None:
    uid = ref.uid
    cp = checkpoint(cluster)
    assert cp.claims[uid].state is ClaimState.PREPARE_COMPLETED
    assert [d.device for d in cp.claims[uid].devices] == [device]
    assert len(spec_files(cluster, uid)) == 1
    assert len(list(cluster.cdi_root.glob("k8s.*-claim_*.json"))) == len(cp.claims)  # no stray spec of any claim
    # KEP-5304 device metadata (the sandbox reports 1.37): one spec per claim (one request each), none stray.
    assert (cluster.cdi_root / f"{DRIVER_NAME}_metadata_{uid}_r0.json").is_file()
    assert len(list(cluster.cdi_root.glob(f"{DRIVER_NAME}_metadata_*.json"))) == len(cp.claims)


def _assert_released(cluster: SandboxCluster, ref: ClaimRef) -> None:
    uid = ref.uid
    assert uid not in checkpoint(cluster).claims
    assert spec_files(cluster, uid) == []
    assert list(cluster.cdi_root.glob(f"*{uid}*")) == []
    assert not (cluster.plugins[NODE].plugin_dir / "dra-device-metadata" / f"{ref.namespace}_{ref.name}").exists()


# One device metadata point (the eight GPUs are one per case); the crash campaign arms both.
@pytest.mark.parametrize("point", [*PREPARE_POINTS, METADATA_POINTS[0], *MIG_PREPARE])
def test_crash_during_prepare_converges(cluster: SandboxCluster, point: str) -> None:
    device = next(PARTITIONS) if point.startswith("mig:") else next(WHOLE)
    ref = allocated_claim(cluster, [device])
    _crash_during(cluster, point, "prepare", ref)
    channel, client = dra_client(cluster)
    retried = client.prepare([ref])[ref.uid]  # the kubelet retries the claim
    assert retried.ok, retried.error
    _assert_prepared_once(cluster, ref, device)
    if point.startswith("mig:"):
        assert len(_live_instances(cluster)) == 1  # exactly the claim's partition, nothing orphaned
        mig_uuid = checkpoint(cluster).claims[ref.uid].devices[0].mig.uuid
        assert mig_uuid and mig_uuid.startswith("MIG-")
    assert client.unprepare([ref]) == {ref.uid: None}
    _assert_released(cluster, ref)
    assert _live_instances(cluster) == []
    channel.close()


@pytest.mark.parametrize("point", [*UNPREPARE_POINTS, *MIG_UNPREPARE])
def test_crash_during_unprepare_converges(cluster: SandboxCluster, point: str) -> None:
    device = next(PARTITIONS) if point.startswith("mig:") else next(WHOLE)
    ref = allocated_claim(cluster, [device])
    channel, client = dra_client(cluster)
    assert client.prepare([ref])[ref.uid].ok
    channel.close()
    _crash_during(cluster, point, "unprepare", ref)
    channel, client = dra_client(cluster)
    assert client.unprepare([ref]) == {ref.uid: None}
    _assert_released(cluster, ref)
    assert _live_instances(cluster) == []
    # The device is usable again: a new claim on it prepares cleanly.
    again = allocated_claim(cluster, [device])
    assert client.prepare([again])[again.uid].ok
    assert client.unprepare([again]) == {again.uid: None}
    channel.close()


def test_unknown_crash_point_is_refused() -> None:
    from dra_driver.plugin.faults import FaultPoints

    with pytest.raises(ValueError, match="unknown crash point"):
        FaultPoints("prepare:after-lunch")
    assert grpc is not None
