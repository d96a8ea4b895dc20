"""`dra-driver`: the product's single entry point, one subcommand per role."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from dra_driver import __version__
from dra_driver.commands.dispatch import Command, Subcommand, build_parser, main_for
from dra_driver.commands.flags import FlagParser

if TYPE_CHECKING:
    # Never run: at run time `_lazy` imports only the chosen subcommand's module (dispatch.main_for), so
    # `dra-driver inventory` never pays for grpc or the API client. These statements are what the static tools
    # read instead: grimp reads imports under TYPE_CHECKING, so import-linter's `layers` and `reachable` contracts
    # still follow cli -> commands.<module>; mypy checks each module against Command, which `_lazy`'s cast cannot.
    # tests/test_cli_table.py checks that these and SUBCOMMANDS name the same modules, and that each loads.
    import dra_driver.commands.compute_domain_daemon
    import dra_driver.commands.compute_domain_plugin
    import dra_driver.commands.controller
    import dra_driver.commands.explain
    import dra_driver.commands.health
    import dra_driver.commands.inventory
    import dra_driver.commands.kubelet_plugin
    import dra_driver.commands.status

    _COMMANDS: tuple[Command, ...] = (
        dra_driver.commands.compute_domain_daemon,
        dra_driver.commands.compute_domain_plugin,
        dra_driver.commands.controller,
        dra_driver.commands.explain,
        dra_driver.commands.health,
        dra_driver.commands.inventory,
        dra_driver.commands.kubelet_plugin,
        dra_driver.commands.status,
    )

COMMANDS_PACKAGE = "dra_driver.commands"


def _lazy(module: str) -> Callable[[], Command]:
    """A subcommand's loader: imports `dra_driver.commands.<module>` only when that subcommand's parser is built
    (only the one that runs; `parser()` builds them all) and returns the module."""

    def load() -> Command:
        return cast(Command, importlib.import_module(f"{COMMANDS_PACKAGE}.{module}"))

    return load


PROG = "dra-driver"
DESCRIPTION = "Kubernetes DRA driver for NVIDIA GPUs"
SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand("inventory", "print this node's GPU inventory, without any cluster", _lazy("inventory")),
    Subcommand("kubelet-plugin", "the per-node agent the kubelet talks to", _lazy("kubelet_plugin")),
    Subcommand("compute-domain-kubelet-plugin", "the per-node agent of the compute-domain driver (IMEX channels "
               "and daemons)", _lazy("compute_domain_plugin")),
    Subcommand("controller", "the cluster-wide controller: GpuSharingPolicies -> DeviceClasses", _lazy("controller")),
    Subcommand("explain", "why a ResourceClaim can or cannot be allocated, node by node", _lazy("explain")),
    Subcommand("status", "the fleet's GPUs: health, taints, MIG layout, sharing and who holds what", _lazy("status")),
    Subcommand("health", "admin device taints as DeviceTaintRules: taint | clear | show | migrate", _lazy("health")),
    Subcommand("compute-domain-daemon", "a ComputeDomain's IMEX daemon on one node: run | check",
               _lazy("compute_domain_daemon")),
)


def parser() -> FlagParser:
    return build_parser(PROG, DESCRIPTION, __version__, SUBCOMMANDS)


def main(argv: Sequence[str] | None = None) -> int:
    return main_for(PROG, DESCRIPTION, __version__, SUBCOMMANDS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
