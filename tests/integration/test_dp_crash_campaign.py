"""The crash campaign's device-plugin part (dra_sandbox/dpcrashcampaign.py): two trials in the quick phase, a seeded
short campaign in the slow one, and proof that its checks catch a GPU in both worlds."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from dra_driver.cdi.writer import node_claim_spec_name
from dra_driver.deviceplugin.cdispecs import SPEC_CLASS, allocation_key
from dra_driver.deviceplugin.ownership import FILE_NAME, OwnershipFile
from dra_sandbox.cluster import SandboxCluster
from dra_sandbox.crashcampaign import CampaignSettings
from dra_sandbox.dpcrashcampaign import DpCampaign, dp_node
from tests.integration.conftest import sandbox
from tests.integration.shortcampaign import run_short

TRIALS = int(os.environ.get("DRA_DP_CRASH_TRIALS", "10"))
SEED = 20261203


@pytest.fixture(scope="module")
def dp_cluster() -> Iterator[SandboxCluster]:
    with sandbox("dra-dpcc-", [dp_node()], device_plugin=True) as cluster:
        yield cluster


def test_two_trials_of_both_worlds_keep_every_invariant(dp_cluster: SandboxCluster) -> None:
    run_short(DpCampaign(dp_cluster, CampaignSettings(trials=2, seed=3, crash_probability=1.0)))


@pytest.mark.slow
def test_seeded_campaign_kills_at_device_plugin_points(dp_cluster: SandboxCluster) -> None:
    """A short campaign with a fixed seed (the same trials on every run): real SIGKILLs at deviceplugin: points."""
    report = run_short(DpCampaign(dp_cluster, CampaignSettings(trials=TRIALS, seed=SEED, crash_probability=0.7)),
                       killed_at_own_points=True)
    # Both worlds were asked: claims prepared, pods admitted or rejected by the kubelet (a crashed Allocate rejects).
    assert report.claims > 0 and report.pods + report.pods_rejected > 0, report.summary()


def test_checks_catch_a_gpu_in_both_worlds(dp_cluster: SandboxCluster) -> None:
    campaign = DpCampaign(dp_cluster, CampaignSettings(trials=0, seed=1, crash_probability=0.0))
    campaign.op_prepare_new()
    [claim] = campaign.prepared.values()
    gpu = campaign.uuid_of[claim.devices[0]]
    record = OwnershipFile(campaign.plugin.plugin_dir / FILE_NAME)
    with record.change() as changing:  # as an Allocate that ignored the claim's hold would leave it
        changing.new = changing.old.with_allocated({gpu}, time.time(), "")
    campaign.check("planted")
    assert any(f"GPU {gpu} is the device plugin's and a DRA claim's" in v for v in campaign.report.violations)
    with record.change() as changing:
        changing.new = changing.old.without_allocated({gpu})
    planted = len(campaign.report.violations)
    campaign.finish()
    assert len(campaign.report.violations) == planted, campaign.report.violations


def test_a_restarted_plugin_sweeps_the_temp_files_a_crash_left(dp_cluster: SandboxCluster) -> None:
    """What a SIGKILL between a temp file and its rename leaves, of the ownership record (one campaign run found it)
    and of an Allocate's CDI spec: gone once the plugin starts again; the campaign's checks say so while there."""
    campaign = DpCampaign(dp_cluster, CampaignSettings(trials=0, seed=1))
    spec = node_claim_spec_name(f"k8s.{dp_cluster.config.driver_name}", SPEC_CLASS, campaign.node,
                                allocation_key(["GPU-a"]))  # fmt: skip
    left = [campaign.plugin.plugin_dir / f".{FILE_NAME}.0a1b2c3d.tmp", dp_cluster.cdi_root / f".{spec}.0a1b2c3d.tmp"]
    for file in left:
        file.write_text("{")
    campaign.check("planted")
    assert any(f"'{left[0].name}'" in v and f"'{left[1].name}'" in v for v in campaign.report.violations)
    campaign.plugin.kill()
    campaign.plugin.start()
    campaign.plugin.wait_serving()
    assert not any(file.exists() for file in left)
