"""`dra-driver`: the single entry point, one subcommand per role."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from dra_driver import __version__

# subcommand -> (module, one-line help). Each module exposes
#   add_arguments(parser) and run(args) -> int
# and is imported only when its subcommand runs, so `dra-driver inventory` never pays for grpc or kopf.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "inventory": ("dra_driver.inventory.command", "print this node's GPU inventory, without any cluster"),
    "kubelet-plugin": ("dra_driver.plugin.command", "the per-node agent the kubelet talks to"),
    "explain": ("dra_driver.explain", "why a ResourceClaim can or cannot be allocated, node by node"),
    "sandbox": ("dra_driver.sandbox.command", "local cluster sandbox: fake API server, kubelet, allocator"),
    "e2e": ("dra_driver.e2e.command", "run the e2e scenarios on the sandbox or, with --kubeconfig, a real cluster"),
    "demo": ("dra_driver.demo", "run the driver end to end on a local sandbox with fake GPUs"),
}


def build_parser(subcommands: dict[str, tuple[str, str]] | None = None) -> argparse.ArgumentParser:
    table = SUBCOMMANDS if subcommands is None else subcommands
    parser = argparse.ArgumentParser(prog="dra-driver", description="Kubernetes DRA driver for NVIDIA GPUs")
    parser.add_argument("--version", action="version", version=f"dra-driver {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in table.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        sub_parser.set_defaults(_module=module_name)
        module = importlib.import_module(module_name)
        add_arguments: Callable[[argparse.ArgumentParser], None] = module.add_arguments
        add_arguments(sub_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    # Build only the requested subcommand's parser so unrelated heavy modules stay unimported.
    wanted = next((a for a in args_list if not a.startswith("-")), None)
    table = {wanted: SUBCOMMANDS[wanted]} if wanted in SUBCOMMANDS else SUBCOMMANDS
    parser = build_parser(table)
    args = parser.parse_args(args_list)
    module = importlib.import_module(args._module)
    run: Callable[[argparse.Namespace], int] = module.run
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
