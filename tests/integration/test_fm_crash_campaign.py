"""The crash campaign's Fabric Manager part (dra_sandbox/fmcrashcampaign.py): two trials in the quick phase, a seeded
short campaign in the slow one, and proof that its checks catch a partition active without a record, a GPU left on
vfio-pci and the foreign partition deactivated."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.fake.backend import FakeNvml
from dra_sandbox.cluster import SandboxCluster
from dra_sandbox.crashcampaign import CampaignSettings
from dra_sandbox.fmcrashcampaign import VFIO_DRIVER, FmCampaign, fm_node
from tests.integration.conftest import sandbox
from tests.integration.shortcampaign import run_short

TRIALS = int(os.environ.get("DRA_FM_CRASH_TRIALS", "10"))
SEED = 20261202


@pytest.fixture(scope="module")
def fm_cluster() -> Iterator[SandboxCluster]:
    with sandbox("dra-fmc-", [fm_node()]) as cluster:
        yield cluster


def test_two_partition_trials_keep_every_invariant(fm_cluster: SandboxCluster) -> None:
    campaign = FmCampaign(fm_cluster, CampaignSettings(trials=2, seed=7, crash_probability=1.0))
    run_short(campaign)
    assert campaign.active() == {campaign.foreign}  # every claim unprepared: the foreign partition alone is active


@pytest.mark.slow
def test_seeded_partition_campaign_kills_at_fm_points(fm_cluster: SandboxCluster) -> None:
    """A short campaign with a fixed seed (the same trials on every run): real SIGKILLs at fmpartition: points."""
    campaign = FmCampaign(fm_cluster, CampaignSettings(trials=TRIALS, seed=SEED, crash_probability=0.8))
    run_short(campaign, killed_at_own_points=True)
    assert campaign.active() == {campaign.foreign}


def test_checks_catch_an_unowned_partition_and_the_foreign_one_deactivated(fm_cluster: SandboxCluster) -> None:
    campaign = FmCampaign(fm_cluster, CampaignSettings(trials=0, seed=1))
    campaign.check("clean", final=True)
    assert campaign.report.violations == []
    admin = open_backend(campaign.plugin.nvml_spec, driver_root="/")
    assert isinstance(admin, FakeNvml)
    admin.init()
    fm, pci = admin.fabric_manager(), admin.pci_sysfs()
    gpu = next(g for g in admin.gpus() if g.minor == 0)
    address = gpu.pci_bus_id.lower()
    [alone] = [p.id for p in fm.supported_partitions() if [g.uuid for g in p.gpus] == [gpu.uuid]]
    try:
        # A partition activated with no claim record (as a lost record or a rollback that forgot it would leave).
        pci.set_driver_override(address, VFIO_DRIVER)
        pci.unbind(address, "nvidia")
        pci.bind(address, VFIO_DRIVER)
        fm.activate(alone)
        campaign.check("planted partition")
        fm.deactivate(alone)
        pci.unbind(address, VFIO_DRIVER)
        pci.set_driver_override(address, None)
        pci.bind(address, "nvidia")
        fm.deactivate(campaign.foreign)  # someone else's partition released
        campaign.check("foreign released")
    finally:
        fm.set_activated((campaign.foreign,))
        admin.shutdown()
    found = campaign.report.violations
    assert any(f"active partitions [{alone}]" in v for v in found), found
    assert any(f"PCI function {address} is bound to {VFIO_DRIVER}, not nvidia" in v for v in found), found
    assert any(f"the foreign partition {campaign.foreign} was deactivated" in v for v in found), found
