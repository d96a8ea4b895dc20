"""`dra-sandbox`: the test bench's entry point (local API server, e2e scenarios, the demo)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from dra_driver import __version__
from dra_driver.commands.dispatch import Command, Subcommand, build_parser, main_for
from dra_driver.commands.flags import FlagParser


def _apiserver() -> Command:
    from dra_sandbox.apiserver import command

    return command


def _e2e() -> Command:
    from dra_sandbox.e2e import command

    return command


def _crash_campaign() -> Command:
    from dra_sandbox import crashcampaigncommand

    return crashcampaigncommand


def _up() -> Command:
    from dra_sandbox.up import UpCommand

    return UpCommand()


def _down() -> Command:
    from dra_sandbox.up import DownCommand

    return DownCommand()


def _gpu_smoke() -> Command:
    from dra_sandbox import gpusmoke

    return gpusmoke


def _demo() -> Command:
    from dra_sandbox import demo

    return demo


def _nvidia_driver() -> Command:
    from dra_sandbox import nvidiadriver

    return nvidiadriver


PROG = "dra-sandbox"
DESCRIPTION = "Test bench for dra-driver: a local cluster with fake GPUs, e2e scenarios, the demo"
SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand("apiserver", "run the in-memory Kubernetes API server in the foreground", _apiserver),
    Subcommand("up", "start a local cluster with fake GPU nodes and keep it up (foreground, or --detach)", _up),
    Subcommand("down", "stop the cluster `dra-sandbox up --detach` started", _down),
    Subcommand("e2e", "run the e2e scenarios on the sandbox or, with --kubeconfig, a real cluster", _e2e),
    Subcommand("demo", "run the driver end to end on a local sandbox with fake GPUs", _demo),
    Subcommand("gpu-smoke", "the driver end to end on this machine's real GPUs (skips without one)", _gpu_smoke),
    Subcommand(
        "crash-campaign", "SIGKILL-restart trials against the kubelet plugin, checking invariants", _crash_campaign
    ),
    Subcommand("nvidia-driver", "unload, load or reload a fake node's NVIDIA driver under its running plugin",
               _nvidia_driver),
)


def parser() -> FlagParser:
    return build_parser(PROG, DESCRIPTION, __version__, SUBCOMMANDS)


def main(argv: Sequence[str] | None = None) -> int:
    # gRPC's C core logs at INFO to stderr by itself (`Got goaway [2] err=UNAVAILABLE` whenever a plugin the
    # kubelet simulator talks to stops, as every stop does): only its errors, unless the caller asks for more.
    # Read when gRPC starts, which is later (the first channel), and inherited by the processes started here.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    return main_for(PROG, DESCRIPTION, __version__, SUBCOMMANDS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
