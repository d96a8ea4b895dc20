"""`dra-sandbox crash-campaign`: the command that runs the crash campaign's parts in one trial loop
(crashtrials.run_together): the GPU plugin's (crashcampaign.py), the ComputeDomain plugin's (cdcrashcampaign.py), the
vGPU hosts' (vgpucrashcampaign.py), the Fabric Manager node's (fmcrashcampaign.py) and the node serving the
device-plugin API beside DRA (dpcrashcampaign.py), each in a sandbox of its own, then each part's report
(docs/sandbox.md "Crash campaign")."""

from __future__ import annotations

import argparse
import contextlib
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from dra_driver.commands.flags import FlagParser, apply_env_defaults
from dra_sandbox.cdcrashcampaign import CdCampaign, CdCampaignSettings, cd_cluster_config, install_domain
from dra_sandbox.cluster import ClusterConfig, SandboxCluster
from dra_sandbox.crashcampaign import Campaign, CampaignSettings, NodeCampaign, campaign_node
from dra_sandbox.crashtrials import CrashTrials, run_together
from dra_sandbox.dpcrashcampaign import DpCampaign, dp_node
from dra_sandbox.fmcrashcampaign import FmCampaign, fm_node
from dra_sandbox.vgpucrashcampaign import MDEV_NODE, SRIOV_NODE, VgpuCampaign, vgpu_node

# The parts beside the GPU plugin's: flag, default (a share of --trials: 1/divisor, at least `least`), what they run.
PART_TRIALS: Final = (
    ("--cd-trials", 4, 1, "trials on the compute-domain plugin (channel and daemon claims; dra_sandbox/"
                          "cdcrashcampaign.py)"),
    ("--vgpu-trials", 3, 2, "trials on vGPU hosts (dra_sandbox/vgpucrashcampaign.py: half on an SR-IOV host, half on "
                            "an mdev host; crashes mostly at vgpu: points)"),
    ("--fm-trials", 6, 1, "trials on a node whose Fabric Manager offers partitions (dra_sandbox/fmcrashcampaign.py: "
                          "fm-partition claims; crashes mostly at fmpartition: and vfio: points)"),
    ("--dp-trials", 6, 1, "trials on a node serving the device-plugin API beside DRA (dra_sandbox/dpcrashcampaign.py: "
                          "pods asking for nvidia.com/gpu beside claims; crashes also at deviceplugin: points)"),
)  # fmt: skip


def part_trials(args: argparse.Namespace) -> dict[str, int]:
    """Each part's trials by flag: as given, else its share of --trials."""
    return {flag: given if (given := getattr(args, flag[2:].replace("-", "_"))) is not None
            else max(least, args.trials // divisor) for flag, divisor, least, _ in PART_TRIALS}  # fmt: skip


def add_arguments(parser: FlagParser) -> None:
    parser.add_argument("--trials", type=int, default=1000, help="number of random trials")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: time-based, printed)")
    parser.add_argument("--crash-probability", type=float, default=0.5, help="share of operations that crash")
    parser.add_argument("--passthrough-share", type=_share, default=0.25,
                        help="share of new claims that pass a GPU through to a VM (VFIO, GPUs 4-7, while one is "
                             "free); their armed crashes land on vfio: points (per PCI function: #n) 80%% of the "
                             "time. 0 leaves passthrough out; 0.6 with --trials 80 proves it (docs/passthrough.md)")
    for flag, divisor, least, text in PART_TRIALS:
        parser.add_argument(flag, type=int, default=None,
                            help=f"{text}, in the same trial loop as the GPU plugin's --trials (default: 1/{divisor} "
                                 f"of --trials, at least {least}; 0 leaves it out)")  # fmt: skip
    apply_env_defaults(parser)


def _share(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def run(args: argparse.Namespace) -> int:
    """`dra-sandbox crash-campaign`: one trial loop over both drivers' plugins (crashtrials.run_together), each in a
    sandbox of its own (the GPU node; the ComputeDomain node in an NVLink clique), then each driver's report."""
    from dra_driver.observability.logging import configure_logging

    configure_logging("warning", "text")
    # The kubelet simulator reports every refused connection while the plugin restarts; expected here.
    logging.getLogger("dra_sandbox.kubelet").setLevel(logging.ERROR)
    seed = args.seed if args.seed is not None else int(time.time())
    shares = part_trials(args)
    cd_trials, vgpu_trials, fm_trials, dp_trials = (shares[f] for f, *_ in PART_TRIALS)
    started = time.monotonic()
    progress = lambda line: print(line, flush=True)  # noqa: E731 - one line, used twice
    with contextlib.ExitStack() as stack:
        work = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra-cc-"))
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        gpu_cluster = stack.enter_context(
            SandboxCluster(ClusterConfig(work_dir=work / "gpu", nodes=[campaign_node()], runtime="cdi-check")))
        gpu = Campaign(gpu_cluster, CampaignSettings(args.trials, seed, args.crash_probability,
                                                     args.passthrough_share), progress)
        campaigns: list[CrashTrials[Any, Any]] = [gpu]
        if cd_trials > 0:
            cd_cluster = stack.enter_context(SandboxCluster(cd_cluster_config(work / "cd")))
            campaigns.append(CdCampaign(cd_cluster, install_domain(cd_cluster.api),
                                        CdCampaignSettings(cd_trials, seed, args.crash_probability), progress))
        if vgpu_trials > 0:
            vgpu_cluster = stack.enter_context(SandboxCluster(ClusterConfig(
                work_dir=work / "vgpu", runtime="cdi-check",
                nodes=[vgpu_node(SRIOV_NODE, mdev=False), vgpu_node(MDEV_NODE, mdev=True)])))
            # Seeds of their own: with the GPU part's seed both hosts would draw the GPU part's sequence.
            for n, (node, share) in enumerate(((SRIOV_NODE, (vgpu_trials + 1) // 2), (MDEV_NODE, vgpu_trials // 2))):
                settings = CampaignSettings(share, seed + 1 + n, args.crash_probability, driver_reloads=False)
                campaigns.append(VgpuCampaign(vgpu_cluster, node, settings, progress))
        # Seeds of their own too (after the vGPU hosts'), for the same reason.
        if fm_trials > 0:
            fm_cluster = stack.enter_context(SandboxCluster(ClusterConfig(
                work_dir=work / "fm", runtime="cdi-check", nodes=[fm_node()])))
            settings = CampaignSettings(fm_trials, seed + 3, args.crash_probability, driver_reloads=False)
            campaigns.append(FmCampaign(fm_cluster, settings, progress))
        if dp_trials > 0:
            dp_cluster = stack.enter_context(SandboxCluster(ClusterConfig(
                work_dir=work / "dp", runtime="cdi-check", nodes=[dp_node()], device_plugin=True)))
            settings = CampaignSettings(dp_trials, seed + 4, args.crash_probability, driver_reloads=False)
            campaigns.append(DpCampaign(dp_cluster, settings, progress))
        run_together(campaigns, seed)
    violations = [v for c in campaigns for v in c.report.violations]
    for violation in violations:
        print(f"VIOLATION {violation}")
    for campaign in campaigns:
        if isinstance(campaign, NodeCampaign):
            family = campaign.family
            print(f"SIGKILLs at {family} points ({campaign.node}): {campaign.report.family_detail(family)}")
            for unreached in campaign.report.unreached:
                print(f"armed, not reached: {unreached}")
    for campaign in campaigns:
        print(campaign.report.summary())
    print(f"crash campaign: {sum(c.report.trials for c in campaigns)} trials in one loop, {len(violations)} "
          f"violations (seed {seed}, {time.monotonic() - started:.0f} s)")
    return 1 if violations else 0
