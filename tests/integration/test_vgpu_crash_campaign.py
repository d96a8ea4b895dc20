"""The crash campaign's vGPU part in its short form, on an SR-IOV host and an mdev host (dra_sandbox/
vgpucrashcampaign.py), and proof that its checks catch a vGPU without a record and a foreign vGPU touched."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.fake.backend import FakeNvml
from dra_sandbox.cluster import SandboxCluster
from dra_sandbox.crashcampaign import CampaignSettings
from dra_sandbox.vgpucrashcampaign import MDEV_NODE, SRIOV_NODE, TYPE_20C, VgpuCampaign, vgpu_node
from tests.integration.conftest import sandbox

TRIALS = int(os.environ.get("DRA_VGPU_CRASH_TRIALS", "8"))


@pytest.fixture(scope="module")
def hosts() -> Iterator[SandboxCluster]:
    with sandbox("dra-vc-", [vgpu_node(SRIOV_NODE, mdev=False), vgpu_node(MDEV_NODE, mdev=True)]) as cluster:
        yield cluster


def _admin(campaign: VgpuCampaign) -> FakeNvml:
    admin = open_backend(campaign.plugin.nvml_spec, driver_root="/")
    assert isinstance(admin, FakeNvml)
    admin.init()
    return admin


@pytest.mark.slow
@pytest.mark.parametrize("node", [SRIOV_NODE, MDEV_NODE])
def test_short_vgpu_campaign_keeps_every_invariant(hosts: SandboxCluster, node: str) -> None:
    campaign = VgpuCampaign(hosts, node, CampaignSettings(trials=TRIALS, seed=20261206, crash_probability=0.8))
    report = campaign.run()
    assert report.violations == [], report.summary()
    assert report.trials == TRIALS and report.kills_by_family()["vgpu"] > 0, report.summary()
    assert campaign.live_vgpus() == {campaign.foreign: TYPE_20C}  # the foreign vGPU alone is left


def test_checks_catch_a_vgpu_without_a_record_and_a_foreign_one_touched(hosts: SandboxCluster) -> None:
    campaign = VgpuCampaign(hosts, SRIOV_NODE, CampaignSettings(trials=0, seed=1, crash_probability=0.0))
    admin = _admin(campaign)
    try:
        sysfs = admin.vgpu_sysfs()
        gpu = next(g for g in admin.gpus() if g.minor == 5)
        stray = sysfs.virtual_functions(gpu.pci_bus_id.lower())[0].address
        sysfs.set_vgpu_type(stray, TYPE_20C)
        campaign.check("planted")
        sysfs.set_vgpu_type(stray, 0)
        sysfs.set_vgpu_type(campaign.foreign, 0)  # someone else's vGPU destroyed
        campaign.check("foreign gone")
    finally:
        admin.shutdown()
    assert any(f"vGPU {stray} (type {TYPE_20C}) exists without a claim record" in v for v in campaign.report.violations)
    assert any(f"the foreign vGPU {campaign.foreign}" in v and "gone" in v for v in campaign.report.violations)
