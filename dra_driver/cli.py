"""`dra-driver`: the product's single entry point, one subcommand per role."""

from __future__ import annotations

from collections.abc import Sequence

from dra_driver import __version__
from dra_driver.commands.dispatch import Command, Subcommand, build_parser, main_for
from dra_driver.commands.flags import FlagParser


def _inventory() -> Command:
    from dra_driver.commands import inventory

    return inventory


def _kubelet_plugin() -> Command:
    from dra_driver.commands import kubelet_plugin

    return kubelet_plugin


def _compute_domain_kubelet_plugin() -> Command:
    from dra_driver.commands import compute_domain_plugin

    return compute_domain_plugin


def _explain() -> Command:
    from dra_driver.commands import explain

    return explain


def _health() -> Command:
    from dra_driver.commands import health

    return health


def _status() -> Command:
    from dra_driver.commands import status

    return status


def _controller() -> Command:
    from dra_driver.commands import controller

    return controller


def _compute_domain_daemon() -> Command:
    from dra_driver.commands import compute_domain_daemon

    return compute_domain_daemon


PROG = "dra-driver"
DESCRIPTION = "Kubernetes DRA driver for NVIDIA GPUs"
SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand("inventory", "print this node's GPU inventory, without any cluster", _inventory),
    Subcommand("kubelet-plugin", "the per-node agent the kubelet talks to", _kubelet_plugin),
    Subcommand("compute-domain-kubelet-plugin", "the per-node agent of the compute-domain driver (IMEX channels "
               "and daemons)", _compute_domain_kubelet_plugin),
    Subcommand("controller", "the cluster-wide controller: GpuSharingPolicies -> DeviceClasses", _controller),
    Subcommand("explain", "why a ResourceClaim can or cannot be allocated, node by node", _explain),
    Subcommand("status", "the fleet's GPUs: health, taints, MIG layout, sharing and who holds what", _status),
    Subcommand("health", "admin device taints as DeviceTaintRules: taint | clear | show | migrate", _health),
    Subcommand("compute-domain-daemon", "a ComputeDomain's IMEX daemon on one node: run | check",
               _compute_domain_daemon),
)


def parser() -> FlagParser:
    return build_parser(PROG, DESCRIPTION, __version__, SUBCOMMANDS)


def main(argv: Sequence[str] | None = None) -> int:
    return main_for(PROG, DESCRIPTION, __version__, SUBCOMMANDS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
