"""`dra-sandbox`: the test bench's entry point (local API server, e2e scenarios, the demo)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from typing import cast

from dra_driver import __version__
from dra_driver.commands.dispatch import Command, Subcommand, build_parser, main_for
from dra_driver.commands.flags import FlagParser


def _lazy(module: str, command_class: str = "") -> Callable[[], Command]:
    """A subcommand's loader: imports `module` (relative to dra_sandbox) only when that subcommand's parser is
    built (only the one that runs, see `main_for`), and returns the module, or a new instance of its
    `command_class`. `parser()` builds every subcommand's parser, so a test that calls it checks each loader."""

    def load() -> Command:
        loaded = importlib.import_module(module, "dra_sandbox")
        return cast(Command, getattr(loaded, command_class)() if command_class else loaded)

    return load


PROG = "dra-sandbox"
DESCRIPTION = "Test bench for dra-driver: a local cluster with fake GPUs, e2e scenarios, the demo"
SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand("apiserver", "run the in-memory Kubernetes API server in the foreground", _lazy(".apiserver.command")),
    Subcommand("up", "start a local cluster with fake GPU nodes and keep it up (foreground, or --detach)",
               _lazy(".up", "UpCommand")),
    Subcommand("down", "stop the cluster `dra-sandbox up --detach` started", _lazy(".up", "DownCommand")),
    Subcommand("e2e", "run the e2e scenarios on the sandbox or, with --kubeconfig, a real cluster",
               _lazy(".e2e.command")),
    Subcommand("demo", "run the driver end to end on a local sandbox with fake GPUs", _lazy(".demo")),
    Subcommand("gpu-smoke", "the driver end to end on this machine's real GPUs (skips without one)",
               _lazy(".gpusmoke")),
    Subcommand("crash-campaign", "SIGKILL-restart trials against the kubelet plugin, checking invariants",
               _lazy(".crashcampaigncommand")),
    Subcommand("nvidia-driver", "unload, load or reload a fake node's NVIDIA driver under its running plugin",
               _lazy(".nvidiadriver")),
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
