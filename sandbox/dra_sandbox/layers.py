"""The import contracts between the product, the bench and the product's layers: import-linter, configured in
pyproject.toml (`[tool.importlinter]`; docs/architecture.md "Layer contracts"), with two contract types of
the bench's own (dra_sandbox/importcontracts.py).

`python -m dra_sandbox.layers [ROOT]` runs `lint-imports` on the tree at ROOT (default: the current
directory), as `make lint` does: it prints each broken contract with the offending imports and exits 1.
`check` runs the same contracts on a graph in memory, for tests that break one on purpose.
"""

from __future__ import annotations

import copy
import importlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grimp
from grimp import ImportGraph
from importlinter import Contract
from importlinter.api import read_configuration
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.independence import IndependenceContract
from importlinter.contracts.layers import LayersContract

BUILT_IN: Mapping[str, type[Contract]] = {
    "forbidden": ForbiddenContract,
    "layers": LayersContract,
    "independence": IndependenceContract,
}


@dataclass(frozen=True)
class Broken:
    """A broken contract: its name and the imports that break it (`importer -> imported (l.N)` or the
    custom contracts' own lines)."""

    contract: str
    details: tuple[str, ...]


@dataclass(frozen=True)
class Contracts:
    root_packages: tuple[str, ...]
    session_options: Mapping[str, Any]
    contracts: tuple[tuple[type[Contract], Mapping[str, Any]], ...]

    def __len__(self) -> int:
        return len(self.contracts)


def package_paths(root: Path) -> list[Path]:
    """Where the root packages of the tree at `root` live (the bench is its own distribution in sandbox/)."""
    return [root, root / "sandbox"]


def read_contracts(root: Path) -> Contracts:
    config = read_configuration(str(root / "pyproject.toml"))
    session = config["session_options"]
    types = dict(BUILT_IN)
    for entry in session.get("contract_types", []):
        name, _, dotted = (part.strip() for part in entry.partition(":"))
        module, _, attribute = dotted.rpartition(".")
        types[name] = getattr(importlib.import_module(module), attribute)
    return Contracts(
        root_packages=tuple(session["root_packages"]),
        session_options=session,
        contracts=tuple((types[c["type"]], c) for c in config["contracts_options"]),
    )


def build_graph(contracts: Contracts) -> ImportGraph:
    """The import graph of the installed root packages (in this interpreter: this tree's, editable)."""
    include_external = bool(contracts.session_options.get("include_external_packages"))
    return grimp.build_graph(*contracts.root_packages, include_external_packages=include_external, cache_dir=None)


def check(graph: ImportGraph, contracts: Contracts) -> list[Broken]:
    """Every contract on a copy of `graph` (the caller may have edited it): the broken ones."""
    out = []
    for contract_class, options in contracts.contracts:
        contract = contract_class(
            name=options["name"], session_options=dict(contracts.session_options), contract_options=dict(options)
        )
        result = contract.check(copy.deepcopy(graph), verbose=False)
        if not result.kept:
            out.append(Broken(options["name"], tuple(_details(result.metadata))))
    return out


def _details(metadata: Any) -> Iterator[str]:
    """The imports named in a check's metadata: the built-in contracts nest `importer`/`imported`/`line_numbers`
    dicts in chains; the bench's contracts keep ready lines under `lines`."""
    if isinstance(metadata, Mapping):
        if "importer" in metadata and "imported" in metadata:
            lines = ", ".join(str(n) for n in metadata.get("line_numbers") or ())
            yield f"{metadata['importer']} -> {metadata['imported']}" + (f" (l.{lines})" if lines else "")
        if "lines" in metadata:
            yield from (str(line) for line in metadata["lines"])
        for key, value in metadata.items():
            if key != "lines":
                yield from _details(value)
    elif isinstance(metadata, list | tuple):
        for item in metadata:
            yield from _details(item)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    root = Path(args[0]).resolve() if args else Path.cwd()
    # A fresh interpreter whose import path puts ROOT's packages first (ahead of the editable install's
    # finder), since grimp finds the packages it reads by importing their specs.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in package_paths(root))}
    code = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    command = [sys.executable, "-c", code, "--no-cache", "--no-logo", str(root / "pyproject.toml")]
    return subprocess.run(command, cwd=root, env=env, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
