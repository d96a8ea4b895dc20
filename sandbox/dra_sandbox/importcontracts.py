"""The import contracts import-linter's built-in types cannot express, as custom contract types
(`[tool.importlinter] contract_types` in pyproject.toml; docs/architecture.md "Layer contracts").

- `pure`: the `source_modules`, and every product module importing them runs, import none of
  `forbidden_modules`. "Runs" includes parent packages: importing `a.b.c` executes `a/__init__` and
  `a/b/__init__` first, an edge grimp's graph does not hold (it records `a.b.c` only), so the built-in
  `forbidden` contract would miss I/O done in a package's `__init__`. The report names the import chain.
- `reachable`: every module of `package` (but `exempt`) is imported, directly or lazily, from `entry`, so the
  product holds nothing that exists only for the tests or the bench.
- `acyclic`: no import circle among the modules of `packages` (module by module, lazy and `TYPE_CHECKING`
  imports included; import-linter's `acyclic_siblings` compares whole sibling packages instead). The report
  names each circle's modules.

grimp's graph holds every import statement of a module, including those inside functions (lazy imports)
and under `if TYPE_CHECKING:`; external modules (third-party and the standard library) appear under their
top-level name (`os.path` is `os`), so a forbidden external module is named by its top-level package.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output


@dataclass(frozen=True)
class BrokenImport:
    """One import a contract refuses: `chain` (entry first) ends in the module that has it."""

    chain: tuple[str, ...]
    imported: str
    line: int

    def describe(self) -> str:
        return f"{' -> '.join(self.chain)} imports {self.imported} (line {self.line})"


def under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def runs_on_import(graph: ImportGraph, module: str) -> Iterator[str]:
    """The graph's modules that importing `module` executes: what it imports, and each one's parent packages."""
    for imported in sorted(graph.find_modules_directly_imported_by(module)):
        parts = imported.split(".")
        for end in range(1, len(parts) + 1):
            candidate = ".".join(parts[:end])
            if candidate != module and candidate in graph.modules and not _is_external(graph, candidate):
                yield candidate


def _is_external(graph: ImportGraph, module: str) -> bool:
    """Third-party and standard-library modules: grimp keeps them squashed (one node per top-level name)."""
    return bool(graph.is_module_squashed(module))


def _internal(graph: ImportGraph) -> list[str]:
    return sorted(m for m in graph.modules if not _is_external(graph, m))


def _lines(graph: ImportGraph, importer: str, imported: str) -> list[int]:
    details = graph.get_import_details(importer=importer, imported=imported)
    return sorted({int(d["line_number"]) for d in details}) or [0]


def _expand(prefixes: Iterable[str]) -> tuple[str, ...]:
    return tuple(p.strip() for p in prefixes if p.strip())


def find_impure(graph: ImportGraph, sources: Iterable[str], forbidden: Iterable[str]) -> list[BrokenImport]:
    """Each forbidden import (importer and line) reached from a source module, with the first (shortest) chain
    that reaches it."""
    sources, forbidden = _expand(sources), _expand(forbidden)
    found: dict[tuple[str, str, int], BrokenImport] = {}
    for start in [m for m in _internal(graph) if any(under(m, s) for s in sources)]:
        via: dict[str, tuple[str, ...]] = {start: (start,)}
        queue = deque([start])
        while queue:
            module = queue.popleft()
            for imported in sorted(graph.find_modules_directly_imported_by(module)):
                if any(under(imported, f) for f in forbidden):
                    for line in _lines(graph, module, imported):
                        found.setdefault((module, imported, line), BrokenImport(via[module], imported, line))
            for dep in runs_on_import(graph, module):
                if dep not in via:
                    via[dep] = (*via[module], dep)
                    queue.append(dep)
    return sorted(found.values(), key=lambda b: (b.chain[-1], b.line, b.imported))


def find_unreachable(graph: ImportGraph, package: str, entry: str, exempt: Iterable[str]) -> list[str]:
    """The modules of `package` (but `exempt`) that importing `entry` never runs."""
    exempt = _expand(exempt)
    seen: set[str] = set()
    stack = [entry]
    while stack:
        module = stack.pop()
        if module not in seen:
            seen.add(module)
            stack += runs_on_import(graph, module)
    return [
        m
        for m in _internal(graph)
        if under(m, package) and not any(under(m, e) for e in exempt) and m not in seen
    ]


def find_circles(graph: ImportGraph, packages: Iterable[str]) -> list[tuple[str, ...]]:
    """The import circles among the modules of `packages`: each strongly connected set of two or more modules
    (Tarjan's algorithm, iterative), sorted."""
    packages = _expand(packages)
    modules = [m for m in _internal(graph) if any(under(m, p) for p in packages)]
    inside = set(modules)
    edges = {m: sorted(i for i in graph.find_modules_directly_imported_by(m) if i in inside) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[tuple[str, ...]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            module, next_edge = work.pop()
            if next_edge == 0:
                index[module] = low[module] = len(index)
                stack.append(module)
                on_stack.add(module)
            if next_edge < len(edges[module]):
                work.append((module, next_edge + 1))
                imported = edges[module][next_edge]
                if imported not in index:
                    work.append((imported, 0))
                elif imported in on_stack:
                    low[module] = min(low[module], index[imported])
                continue
            if work:  # finished `module`: its caller (the importer) inherits its low link
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == module:
                        break
                if len(members) > 1:
                    circles.append(tuple(sorted(members)))
    return sorted(circles)


class PureContract(Contract):
    """`source_modules` (and their submodules) reach none of `forbidden_modules`, transitively, parent
    packages included. External forbidden modules are top-level names (grimp squashes `os.path` to `os`)."""

    type_name = "pure"

    source_modules = fields.ListField(subfield=fields.StringField())
    forbidden_modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        sources = list(self.source_modules)  # type: ignore[call-overload]
        missing = [s for s in sources if s not in graph.modules]
        broken = find_impure(graph, sources, self.forbidden_modules)  # type: ignore[arg-type]
        output.verbose_print(verbose, f"{len(broken)} forbidden imports reached from {len(sources)} sources")
        lines = [f"{name} is not a module of the graph: fix source_modules" for name in missing]
        return ContractCheck(kept=not lines and not broken, metadata={"lines": lines + [b.describe() for b in broken]})

    def render_broken_contract(self, check: ContractCheck) -> None:
        _render(check)


class ReachableContract(Contract):
    """Every module of `package` (but `exempt`) is run by importing `entry`."""

    type_name = "reachable"

    package = fields.StringField()
    entry = fields.StringField()
    exempt = fields.ListField(subfield=fields.StringField(), required=False, default=[])

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        unreachable = find_unreachable(graph, self.package, self.entry, self.exempt)  # type: ignore[arg-type]
        lines = [f"{m} is not imported from {self.entry}: move it to the bench or use it" for m in unreachable]
        return ContractCheck(kept=not lines, metadata={"lines": lines})

    def render_broken_contract(self, check: ContractCheck) -> None:
        _render(check)


class AcyclicContract(Contract):
    """No import circle among the modules of `packages`."""

    type_name = "acyclic"

    packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        circles = find_circles(graph, self.packages)  # type: ignore[arg-type]
        lines = [f"import circle: {' <-> '.join(circle)}: move what they share into a module below them"
                 for circle in circles]
        return ContractCheck(kept=not lines, metadata={"lines": lines})

    def render_broken_contract(self, check: ContractCheck) -> None:
        _render(check)


def _render(check: ContractCheck) -> None:
    for line in check.metadata["lines"]:
        output.print_error(line, bold=False)
    output.new_line()
