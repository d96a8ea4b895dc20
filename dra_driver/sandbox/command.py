"""`dra-driver sandbox <what>`: the local cluster sandbox's parts, each runnable on its own.

To add a part, add one row to `SANDBOX_COMMANDS`: the module exposes `add_arguments(parser)` and
`run(args) -> int`, exactly like a top-level subcommand. Every part's module is imported to build its
flags, so keep it light and import heavy dependencies inside `run()`.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

# sandbox subcommand -> (module, one-line help)
SANDBOX_COMMANDS: dict[str, tuple[str, str]] = {
    "apiserver": ("dra_driver.sandbox.apiserver.command", "run the in-memory Kubernetes API server in the foreground"),
}


def add_arguments(parser: argparse.ArgumentParser, commands: dict[str, tuple[str, str]] | None = None) -> None:
    table = SANDBOX_COMMANDS if commands is None else commands
    sub = parser.add_subparsers(dest="sandbox_command", metavar="PART", required=True)
    for name, (module_name, help_text) in table.items():
        part = sub.add_parser(name, help=help_text, description=help_text)
        part.set_defaults(_sandbox_module=module_name)
        module = importlib.import_module(module_name)
        add: Callable[[argparse.ArgumentParser], None] = module.add_arguments
        add(part)


def run(args: argparse.Namespace) -> int:
    module = importlib.import_module(args._sandbox_module)
    run_part: Callable[[argparse.Namespace], int] = module.run
    return run_part(args)
