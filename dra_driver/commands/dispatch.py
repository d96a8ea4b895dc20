"""A console script with one subcommand per role, typed and imported lazily.

Each subcommand is a module (or any object) with `add_arguments(parser)` and `run(args) -> int`. Only the
subcommand that runs is imported, so `dra-driver inventory` never pays for grpc or the API client.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from dra_driver.commands.flags import FlagParser


class Command(Protocol):
    def add_arguments(self, parser: FlagParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


@dataclass(frozen=True)
class Subcommand:
    """One subcommand: its name and help, and how its module is loaded."""

    name: str
    help: str
    load: Callable[[], Command]


def build_parser(prog: str, description: str, version: str, subcommands: Sequence[Subcommand]) -> FlagParser:
    """One subparser per entry; each remembers its command object as `args.command_impl`."""
    parser = FlagParser(prog=prog, description=description)
    parser.add_argument("--version", action="version", version=f"{prog} {version}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for entry in subcommands:
        command = entry.load()
        sub_parser = sub.add_parser(entry.name, help=entry.help, description=entry.help)
        sub_parser.set_defaults(command_impl=command)
        command.add_arguments(sub_parser)
    return parser


def pause_gc() -> Callable[[], None]:
    """Pause the cyclic garbage collector; returns what puts it back as it was (enabled or not).

    The kubelet plugin's imports make ≈ 80,000 container objects that nearly all live on: the collector would run
    ≈ 100 times over them and free next to nothing (-2.7 % of the imports' instructions, -0.6 % to the kubelet
    sockets once the first collections after the pause have walked them; docs/perf-findings.md "Start-up").
    Reference counting still frees the rest; cycles made meanwhile wait for the next collection."""
    enabled = gc.isenabled()
    gc.disable()
    return gc.enable if enabled else _keep_disabled


def _keep_disabled() -> None:
    """The collector was off before the pause (a caller's choice): it stays off."""


def main_for(
    prog: str, description: str, version: str, subcommands: Sequence[Subcommand], argv: Sequence[str] | None
) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    # Build only the requested subcommand's parser so unrelated heavy modules stay unimported.
    wanted = next((a for a in args_list if not a.startswith("-")), None)
    chosen = [s for s in subcommands if s.name == wanted] or list(subcommands)
    resume_gc = pause_gc()  # while the subcommand's modules load
    try:
        args = build_parser(prog, description, version, chosen).parse_args(args_list)
    finally:
        resume_gc()
    command: Command = args.command_impl
    return command.run(args)
