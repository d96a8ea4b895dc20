"""dra_driver/cli.py: SUBCOMMANDS loads each subcommand's module by name (importlib, only the one that runs), and
the same modules are imported under `if TYPE_CHECKING:` for the static tools. The two lists must name the same
modules, each must load as a Command, and import-linter's graph must see cli import each one (the `layers` and
`reachable` contracts follow those edges)."""

from __future__ import annotations

import ast
from pathlib import Path

from dra_driver import cli
from dra_sandbox import layers

REPO = Path(__file__).resolve().parents[1]


def _type_checking_imports() -> set[str]:
    tree = ast.parse((REPO / "dra_driver" / "cli.py").read_text())
    blocks = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    assert len(blocks) == 1
    return {alias.name for n in ast.walk(blocks[0]) if isinstance(n, ast.Import) for alias in n.names}


def _table_modules() -> set[str]:
    modules = set()
    for subcommand in cli.SUBCOMMANDS:
        command = subcommand.load()
        assert callable(command.add_arguments) and callable(command.run), subcommand.name
        modules.add(getattr(command, "__name__", ""))
    return modules


def test_the_table_and_the_static_imports_name_the_same_modules() -> None:
    table = _table_modules()
    assert len(table) == len(cli.SUBCOMMANDS)
    assert table == _type_checking_imports()
    assert all(m.startswith(f"{cli.COMMANDS_PACKAGE}.") for m in table)


def test_import_linter_sees_cli_import_every_subcommand_module() -> None:
    graph = layers.build_graph(layers.read_contracts(REPO))
    for module in _type_checking_imports():
        assert graph.direct_import_exists(importer="dra_driver.cli", imported=module), module
