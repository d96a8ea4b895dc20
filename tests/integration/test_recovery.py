"""Issue 12 (findings 1-6) against the real kubelet-plugin process in the sandbox: a retried unprepare after a
crash, damaged prepared claims, a lost or corrupt checkpoint (with and without the API), crash-leftover temp
files, malformed claim names, and unusable state directories. Outcomes are read from the bytes on disk, the fake
NVML's state file and the API server's request log."""

from __future__ import annotations

import os
import shutil

import pytest

from dra_driver.defaults import DRIVER_NAME as DRIVER
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.fake.state import read_fake_state
from dra_driver.nvml.types import Placement
from dra_driver.plugin.checkpoint import ClaimState
from dra_driver.plugin.faults import ENV_VAR
from dra_sandbox.cluster import SandboxCluster
from dra_sandbox.kubelet.draclient import ClaimRef
from tests.integration.conftest import NODE, allocated_claim, checkpoint, dra_client, restart_plugin, spec_files
from tests.plugin.readonly import read_only
from tests.polling import wait_for

Instance = tuple[str, int, int, int]  # GPU UUID, GI id, profile id, placement start


def _instances(cluster: SandboxCluster, gpu: str | None = None) -> set[Instance]:
    state = read_fake_state(cluster.plugins[NODE].state_file)
    return {
        (g.uuid, gi.id, gi.profile_id, gi.placement.start)
        for g in state.gpus
        if gpu is None or g.uuid == gpu
        for gi in g.gis
    }


def _gpu_of(cluster: SandboxCluster, ref: ClaimRef) -> str:
    device = checkpoint(cluster).claims[ref.uid].devices[0]
    gpu: str | None = device.gpu_uuid
    assert gpu is not None
    return gpu


def _prepare(cluster: SandboxCluster, *refs: ClaimRef) -> dict[str, tuple[str, ...]]:
    """Prepare over gRPC; returns UID -> CDI ids."""
    channel, client = dra_client(cluster)
    results = client.prepare(list(refs))
    channel.close()
    assert all(r.ok for r in results.values()), {u: r.error for u, r in results.items()}
    return {uid: tuple(i for d in r.devices for i in d.cdi_device_ids) for uid, r in results.items()}


def _unprepare(cluster: SandboxCluster, *refs: ClaimRef) -> None:
    channel, client = dra_client(cluster)
    assert client.unprepare(list(refs)) == {r.uid: None for r in refs}
    channel.close()


def _admin(cluster: SandboxCluster) -> NvmlBackend:
    """The node's fake GPUs as an admin tool (`nvidia-smi mig ...`) sees them: the same state file."""
    backend = open_backend(cluster.plugins[NODE].nvml_spec)
    backend.init()
    return backend


def _log_since(cluster: SandboxCluster, offset: int) -> str:
    return cluster.plugins[NODE].log_file.read_bytes()[offset:].decode(errors="replace")


def test_a_retried_unprepare_after_a_crash_spares_the_instance_that_reuses_its_id(cluster: SandboxCluster) -> None:
    """Finding 1, as reported: unprepare A dies after releasing its devices; after the restart B gets A's GI id at
    another placement; the kubelet's retried unprepare of A must not destroy B's instance."""
    a = allocated_claim(cluster, ["gpu-0-mig-1g10gb-19-6"])
    _prepare(cluster, a)
    a_mig = checkpoint(cluster).claims[a.uid].devices[0].mig
    assert a_mig is not None
    restart_plugin(cluster, {ENV_VAR: "unprepare:after-devices"})
    channel, client = dra_client(cluster)
    assert client.unprepare([a])[a.uid], "the plugin should have died mid-unprepare"
    channel.close()
    assert cluster.plugins[NODE].wait_exit(20) == -9
    restart_plugin(cluster)

    b = allocated_claim(cluster, ["gpu-0-mig-1g10gb-19-0"])
    _prepare(cluster, b)
    b_mig = checkpoint(cluster).claims[b.uid].devices[0].mig
    assert b_mig is not None and b_mig.gpu_instance_id == a_mig.gpu_instance_id  # NVML reused the id
    _unprepare(cluster, a)  # the kubelet's retry

    assert _instances(cluster, a_mig.parent_uuid) == {(a_mig.parent_uuid, b_mig.gpu_instance_id or 0, 19, 0)}
    assert checkpoint(cluster).claims[b.uid].state is ClaimState.PREPARE_COMPLETED
    assert a.uid not in checkpoint(cluster).claims and len(spec_files(cluster, b.uid)) == 1
    _unprepare(cluster, b)
    assert _instances(cluster, a_mig.parent_uuid) == set()


def test_restart_repairs_deleted_specs_and_a_vanished_mig_instance(cluster: SandboxCluster) -> None:
    """Finding 2: startup verifies every prepared claim and makes again what is missing."""
    mig, whole = allocated_claim(cluster, ["gpu-6-mig-3g40gb-9-4"]), allocated_claim(cluster, ["gpu-7"])
    first = _prepare(cluster, mig, whole)
    specs = {ref.uid: spec_files(cluster, ref.uid)[0].read_bytes() for ref in (mig, whole)}
    recorded = checkpoint(cluster).claims[mig.uid].devices[0].mig
    assert recorded is not None and recorded.gpu_instance_id is not None and recorded.compute_instance_id is not None
    plugin = cluster.plugins[NODE]
    plugin.stop()
    for ref in (mig, whole):
        spec_files(cluster, ref.uid)[0].unlink()
    admin = _admin(cluster)
    admin.destroy_compute_instance(recorded.parent_uuid, recorded.gpu_instance_id, recorded.compute_instance_id)
    admin.destroy_gpu_instance(recorded.parent_uuid, recorded.gpu_instance_id)
    plugin.start()
    plugin.wait_serving()

    assert {ref.uid: spec_files(cluster, ref.uid)[0].read_bytes() for ref in (mig, whole)} == specs
    assert {(p, s) for _, _, p, s in _instances(cluster, recorded.parent_uuid)} == {(9, 4)}
    assert _prepare(cluster, mig, whole) == first
    _unprepare(cluster, mig, whole)


@pytest.mark.parametrize(
    ("how", "mig_device", "whole_device"),
    [("corrupt", "gpu-1-mig-1g10gb-19-6", "gpu-2"), ("missing", "gpu-3-mig-1g10gb-19-6", "gpu-4")],
)
def test_a_lost_checkpoint_keeps_what_claims_use(
    cluster: SandboxCluster, how: str, mig_device: str, whole_device: str
) -> None:
    """Finding 3: a corrupt or deleted checkpoint no longer makes the startup sweeps delete in-use CDI specs and
    destroy in-use MIG instances: ownership is rebuilt from the claims the API has allocated here."""
    mig, whole = allocated_claim(cluster, [mig_device]), allocated_claim(cluster, [whole_device])
    first = _prepare(cluster, mig, whole)
    gpu = _gpu_of(cluster, mig)
    in_use = _instances(cluster, gpu)
    specs = {ref.uid: spec_files(cluster, ref.uid)[0].read_bytes() for ref in (mig, whole)}
    plugin = cluster.plugins[NODE]
    _admin(cluster).create_gpu_instance(gpu, 14, Placement(0, 2))  # allocated to nobody
    plugin.stop()
    path = plugin.plugin_dir / "checkpoint.json"
    if how == "corrupt":
        path.write_bytes(path.read_bytes()[:-40])
    else:
        path.unlink()
    lists_before = cluster.server.request_log.count(verb="list", resource="resourceclaims")
    plugin.start()
    plugin.wait_serving()

    assert _instances(cluster, gpu) == in_use  # the claim's instance survives, the stray one is gone
    assert {ref.uid: spec_files(cluster, ref.uid)[0].read_bytes() for ref in (mig, whole)} == specs
    rebuilt = checkpoint(cluster)
    assert {rebuilt.claims[r.uid].state for r in (mig, whole)} == {ClaimState.PREPARE_COMPLETED}
    assert cluster.server.request_log.count(verb="list", resource="resourceclaims") > lists_before
    if how == "corrupt":
        assert list(plugin.plugin_dir.glob("checkpoint.json.corrupt-*"))
    assert _prepare(cluster, mig, whole) == first  # the kubelet's retry gets the same answer
    _unprepare(cluster, mig, whole)
    assert _instances(cluster, gpu) == set() and spec_files(cluster, mig.uid) == []


def test_a_lost_checkpoint_with_the_api_down_destroys_nothing_until_it_answers(cluster: SandboxCluster) -> None:
    mig = allocated_claim(cluster, ["gpu-5-mig-1g10gb-19-6"])
    first = _prepare(cluster, mig)
    gpu = _gpu_of(cluster, mig)
    plugin = cluster.plugins[NODE]
    stray = _admin(cluster).create_gpu_instance(gpu, 14, Placement(0, 2))
    everything = _instances(cluster, gpu)
    spec = spec_files(cluster, mig.uid)[0].read_bytes()
    plugin.stop()
    (plugin.plugin_dir / "checkpoint.json").write_bytes(b'{"version": 1, "payl')
    cluster.server.faults.inject(verb="list", resource="resourceclaims", status=503, count=100_000)
    try:
        plugin.start()
        plugin.wait_serving()
        assert _instances(cluster, gpu) == everything and spec_files(cluster, mig.uid)[0].read_bytes() == spec
    finally:
        cluster.server.faults.clear()
    # The cleanup loop (every 5 s in the sandbox) retries the rebuild once the API answers.
    wait_for(lambda: stray.id not in {i for _, i, _, _ in _instances(cluster, gpu)}, 30, "the stray instance to go")
    assert mig.uid in checkpoint(cluster).claims and spec_files(cluster, mig.uid)[0].read_bytes() == spec
    assert _prepare(cluster, mig) == first
    _unprepare(cluster, mig)


def test_restart_sweeps_only_our_crash_leftover_temp_files(cluster: SandboxCluster) -> None:
    """Finding 5."""
    plugin = cluster.plugins[NODE]
    uid = "0b6f2a56-3c4e-4b8a-9a51-4f6f0c1d2e3f"
    ours = [
        plugin.plugin_dir / ".checkpoint.json.1a2b3c4d.tmp",
        cluster.cdi_root / f".k8s.{DRIVER}-claim_{NODE}_{uid}.json.5e6f7a8b.tmp",
    ]
    theirs = [
        plugin.plugin_dir / "notes.tmp",
        cluster.cdi_root / f".k8s.{DRIVER}-claim_node-b_{uid}.json.5e6f7a8b.tmp",
        cluster.cdi_root / ".nvidia.com-gpu.json.5e6f7a8b.tmp",
    ]
    for path in ours + theirs:
        path.write_bytes(b"half a write")
    restart_plugin(cluster)
    assert [p for p in ours if p.exists()] == []
    assert [p for p in theirs if not p.exists()] == []
    for path in theirs:
        path.unlink()


def test_a_malformed_claim_name_never_reaches_the_api(cluster: SandboxCluster) -> None:
    """Finding 4: `c1#frag` with c1's UID was prepared as c1; now it is refused naming the field."""
    real = allocated_claim(cluster, ["gpu-7"])
    log = cluster.server.request_log
    gets = log.count(verb="get", resource="resourceclaims", name=real.name)
    channel, client = dra_client(cluster)
    bad = ClaimRef(namespace="default", name=f"{real.name}#frag", uid=real.uid)
    result = client.prepare([bad])[real.uid]
    channel.close()
    assert result.error is not None
    assert result.error.startswith("claims[0].name: ") and "RFC 1123 subdomain" in result.error
    assert log.count(verb="get", resource="resourceclaims", name=real.name) == gets
    recorded = checkpoint(cluster)  # None: no claim prepared yet on this node (the test run alone or first)
    assert recorded is None or real.uid not in recorded.claims
    assert spec_files(cluster, real.uid) == []


def test_the_plugin_dir_is_0750(cluster: SandboxCluster) -> None:
    """Finding 6 (the docs promised 0750; mkdir under the usual umask 022 gave 0755)."""
    assert os.stat(cluster.plugins[NODE].plugin_dir).st_mode & 0o7777 == 0o750


def _start_fails(cluster: SandboxCluster) -> str:
    plugin = cluster.plugins[NODE]
    offset = plugin.log_file.stat().st_size
    plugin.start()
    assert plugin.wait_exit(30) == 1
    return _log_since(cluster, offset)


def test_unusable_state_dirs_are_clear_startup_errors(cluster: SandboxCluster) -> None:
    """Finding 6: a directory at the checkpoint path crash-looped with a raw IsADirectoryError; a read-only
    plugin dir failed every claim with "internal error: [Errno 13] ... .tmp"."""
    plugin = cluster.plugins[NODE]
    path = plugin.plugin_dir / "checkpoint.json"
    plugin.stop()
    saved = plugin.plugin_dir.parent / "checkpoint.json.saved"
    had_checkpoint = path.exists()  # none yet when no claim was prepared in this module before this test
    if had_checkpoint:
        shutil.move(path, saved)
    path.mkdir()
    try:
        output = _start_fails(cluster)
        assert f"{path} is a directory" in output and "Move it out of the way" in output
        assert "Traceback" not in output
    finally:
        path.rmdir()
        if had_checkpoint:
            shutil.move(saved, path)
    with read_only(plugin.plugin_dir):
        output = _start_fails(cluster)
    assert f"the plugin dir {plugin.plugin_dir} (--plugin-dir) must be writable" in output
    assert "Traceback" not in output
    restart_plugin(cluster)
    assert path.is_file() or not had_checkpoint
