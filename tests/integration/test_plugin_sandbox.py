"""The real kubelet-plugin process in the sandbox: registration by the kubelet simulator, both DRA API
versions, idempotency, overlap refusal, bad configs, 100 claims at once, restart in between."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from dra_driver.defaults import DRIVER_NAME
from dra_sandbox.cluster import SandboxCluster
from tests.integration.conftest import NODE, allocated_claim, checkpoint, dra_client, restart_plugin, spec_files
from tests.polling import wait_for


def test_the_kubelet_registers_the_plugin_with_v1(cluster: SandboxCluster) -> None:
    kubelet = cluster.kubelets[NODE]
    plugin = wait_for(lambda: kubelet.plugins.get(DRIVER_NAME), 20, "registration")
    assert plugin.service == "v1.DRAPlugin"
    assert plugin.endpoint == str(cluster.plugins[NODE].plugin_dir / "dra.sock")


def test_prepare_unprepare_v1_and_v1beta1_idempotent(cluster: SandboxCluster) -> None:
    for service, device in (("v1.DRAPlugin", "gpu-0"), ("v1beta1.DRAPlugin", "gpu-1")):
        ref = allocated_claim(cluster, [device])
        channel, client = dra_client(cluster, service)
        first = client.prepare([ref])[ref.uid]
        assert first.ok, first.error
        assert [d.device for d in first.devices] == [device]
        assert client.prepare([ref])[ref.uid] == first  # idempotent
        assert len(spec_files(cluster, ref.uid)) == 1
        assert client.unprepare([ref]) == {ref.uid: None}
        assert client.unprepare([ref]) == {ref.uid: None}  # idempotent
        assert spec_files(cluster, ref.uid) == []
        channel.close()


def test_overlap_and_bad_config_are_per_claim_errors(cluster: SandboxCluster) -> None:
    holder = allocated_claim(cluster, ["gpu-2"])
    intruder = allocated_claim(cluster, ["gpu-2"], namespace="default")
    channel, client = dra_client(cluster)
    assert client.prepare([holder])[holder.uid].ok
    refused = client.prepare([intruder])[intruder.uid]
    assert not refused.ok and refused.error is not None
    assert holder.name in refused.error and intruder.name in refused.error
    bad_config = [
        {
            "source": "FromClaim",
            "opaque": {
                "driver": DRIVER_NAME,
                "parameters": {
                    "apiVersion": "gpu.dra.dev/v1beta1",
                    "kind": "GpuConfig",
                    "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}},
                },
            },
        }
    ]
    bad = allocated_claim(cluster, ["gpu-3"], config=bad_config)
    result = client.prepare([bad])[bad.uid]
    assert result.error is not None
    assert "mpsConfig.defaultActiveThreadPercentage" in result.error and "between 1 and 100" in result.error
    assert client.unprepare([holder, intruder, bad]) == {holder.uid: None, intruder.uid: None, bad.uid: None}
    channel.close()


def test_many_mig_claims_prepared_concurrently(cluster: SandboxCluster) -> None:
    """Every 1g.10gb placement of the node (56) prepared by concurrent calls, then released in one batch."""
    slices = cluster.items("/apis/resource.k8s.io/v1/resourceslices")
    names = sorted(d["name"] for s in slices for d in s["spec"].get("devices", []) if "-mig-1g10gb-19-" in d["name"])
    assert len(names) == 56
    refs = [allocated_claim(cluster, [n]) for n in names]
    channel, client = dra_client(cluster)
    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda r: client.prepare([r])[r.uid], refs))
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
    assert client.unprepare(refs) == {r.uid: None for r in refs}
    assert checkpoint(cluster).claims == {}
    channel.close()


def test_restart_between_prepare_and_unprepare(cluster: SandboxCluster) -> None:
    ref = allocated_claim(cluster, ["gpu-4"])
    channel, client = dra_client(cluster)
    prepared = client.prepare([ref])[ref.uid]
    channel.close()
    restart_plugin(cluster)
    channel, client = dra_client(cluster)
    assert client.prepare([ref])[ref.uid] == prepared
    assert client.unprepare([ref]) == {ref.uid: None}
    assert spec_files(cluster, ref.uid) == []
    channel.close()
