"""The compute-domain part of the crash campaign in its short form (`make crash-campaign` runs it at length):
channel and daemon claims, the #1162 pending-abort sequence, SIGKILLs at the plugin's crash points; and proof that
its checks fail on the states they exist to catch."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from dra_sandbox.cdcrashcampaign import NODE, CdCampaign, CdCampaignSettings, cd_cluster_config, install_domain
from dra_sandbox.cluster import SandboxCluster
from tests.polling import wait_for

TRIALS = int(os.environ.get("DRA_CD_CRASH_TRIALS", "8"))


@pytest.fixture(scope="module")
def cd_cluster() -> Iterator[tuple[SandboxCluster, str]]:
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra-cdc-"))
    try:
        with SandboxCluster(cd_cluster_config(work)) as cluster:
            yield cluster, install_domain(cluster.api)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_short_campaign_keeps_every_invariant(cd_cluster: tuple[SandboxCluster, str]) -> None:
    cluster, domain = cd_cluster
    report = CdCampaign(cluster, domain, CdCampaignSettings(trials=TRIALS, seed=20261201, crash_probability=0.6)).run()
    assert report.violations == []
    assert report.trials == TRIALS and report.crashes > 0, report
    assert sum(report.operations.values()) == TRIALS


def test_checks_catch_a_stray_label_and_a_stray_daemon_dir(cd_cluster: tuple[SandboxCluster, str]) -> None:
    cluster, domain = cd_cluster
    campaign = CdCampaign(cluster, domain, CdCampaignSettings(trials=0, seed=1))
    campaign.check("clean")
    assert campaign.report.violations == []
    cluster.api.request("PATCH", f"/api/v1/nodes/{NODE}", body={"metadata": {"labels": {
        "gpu.dra.dev/computeDomain": domain}}}, content_type="application/merge-patch+json")
    stray = campaign.plugin.plugin_dir / "domains" / domain
    stray.mkdir(parents=True)
    try:
        campaign.check("planted")
        assert any("node label" in v for v in campaign.report.violations)
        assert any("daemon config dir" in v for v in campaign.report.violations)
    finally:
        stray.rmdir()
        cluster.api.request("PATCH", f"/api/v1/nodes/{NODE}", body={"metadata": {"labels": {
            "gpu.dra.dev/computeDomain": None}}}, content_type="application/merge-patch+json")


def test_a_crash_right_after_the_abort_is_recorded_still_refuses_the_stale_prepare(
        cd_cluster: tuple[SandboxCluster, str]) -> None:
    """NVIDIA #1162 with a crash point: the plugin dies just after recording PrepareAborted (before undoing the
    node label); its restart's recovery finishes the undo, and the stale prepare retry is refused."""
    cluster, domain = cd_cluster
    campaign = CdCampaign(cluster, domain, CdCampaignSettings(trials=0, seed=3))
    plugin = campaign.plugin
    claim = campaign.new_claim("channel-0")
    campaign.set_ready(False)
    plugin.restart({"DRA_DRIVER_CRASH_AT": "cd-unprepare:after-abort"})
    with campaign._client() as client:
        assert "not ready" in (client.prepare([claim.ref])[claim.ref.uid].error or "")
    node = f"/api/v1/nodes/{NODE}"
    assert cluster.api.request("GET", node)["metadata"]["labels"].get("gpu.dra.dev/computeDomain") == domain
    with campaign._client() as client, contextlib.suppress(grpc.RpcError):
        client.unprepare([claim.ref])
    wait_for(lambda: not plugin.alive(), 10.0, "the plugin killed at cd-unprepare:after-abort")  # the label still set
    assert cluster.api.request("GET", node)["metadata"]["labels"].get("gpu.dra.dev/computeDomain") == domain
    plugin.restart()
    try:
        assert "gpu.dra.dev/computeDomain" not in cluster.api.request("GET", node)["metadata"]["labels"]
        campaign.set_ready(True)
        with campaign._client() as client:
            assert client.unprepare([claim.ref])[claim.ref.uid] is None  # the kubelet's retry
            stale = client.prepare([claim.ref])[claim.ref.uid].error or ""
        assert "stale prepare" in stale and "already aborted" in stale
        assert "gpu.dra.dev/computeDomain" not in cluster.api.request("GET", node)["metadata"]["labels"]
        assert not list(cluster.cdi_root.glob(f"*{claim.ref.uid}*"))
    finally:
        campaign.set_ready(True)


def test_concurrent_identical_prepares_and_foreign_daemon_claims_keep_the_invariants(
        cd_cluster: tuple[SandboxCluster, str]) -> None:
    """The two hostile operations of the campaign on their own, with crashes: identical prepares of one claim from
    several threads all answer the same CDI ids; a daemon claim outside the driver's namespace is never prepared."""
    cluster, domain = cd_cluster
    campaign = CdCampaign(cluster, domain, CdCampaignSettings(trials=0, seed=11, crash_probability=0.5))
    for _ in range(3):
        campaign.op_concurrent_prepare()
        campaign.check("concurrent prepare")
        campaign.op_foreign_daemon()
        campaign.check("foreign daemon claim")
    assert campaign.report.violations == []
    assert {c.ref.namespace for c in campaign.foreign} <= {"other", "team"} and len(campaign.foreign) == 3
    for claim in list(campaign.prepared.values()):
        campaign._unprepare_until_ok(claim)
        campaign.released.append(campaign.prepared.pop(claim.ref.uid))
    campaign.check("after unprepare of all")
    assert campaign.report.violations == []


def test_checks_catch_a_foreign_daemon_claim_on_the_node(cd_cluster: tuple[SandboxCluster, str]) -> None:
    cluster, domain = cd_cluster
    campaign = CdCampaign(cluster, domain, CdCampaignSettings(trials=0, seed=2))
    claim = campaign.new_claim("daemon-0", "other")
    campaign.foreign.append(claim)
    spec = campaign._spec(claim.ref.uid)
    spec.write_text("{}")
    try:
        campaign.check("planted")
        assert any("other/" in v and "outside the driver's namespace has a CDI spec" in v
                   for v in campaign.report.violations)
    finally:
        spec.unlink()
