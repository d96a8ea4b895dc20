"""The import contracts between the product, the bench and the product's layers, checked (`make lint`).

Why not prose: the rules in docs/architecture.md only hold if something fails when they are broken. This
reads every module's imports with `ast` (lazy imports inside functions count too: they are dependencies
all the same) and checks four kinds of contract:

- `Forbidden`: modules under `sources` must not import anything under `forbidden`, directly.
- `Pure`: modules under `sources`, and every product module they import transitively, import nothing
  that does I/O (grpc, kubernetes, pynvml, sockets, files, processes, ...). Reports the import chain.
- `Layers`: a module may import only from its own layer or the layers below it (`layers[0]` is the
  top). Modules outside every layer are not constrained by this contract.
- `Reachable`: every module of the product is imported from its entry point, so nothing in it exists only
  for the tests or the bench.

Run `python -m dra_sandbox.layers [ROOT]`: prints each broken rule with the offending import and exits 1.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Module prefixes whose import means I/O (network, files, processes, hardware) or a heavy runtime.
IO_MODULES: tuple[str, ...] = (
    "grpc",
    "kubernetes",
    "urllib3",
    "pynvml",
    "aiohttp",
    "kopf",
    "prometheus_client",
    "socket",
    "ssl",
    "http",
    "urllib",
    "subprocess",
    "os",
    "io",
    "pathlib",
    "shutil",
    "tempfile",
    "fcntl",
    "ctypes",
    "signal",
    "select",
    "asyncio",
    "glob",
    "sqlite3",
    "dra_driver._gen",
    "dra_driver.fsutil",
)


@dataclass(frozen=True)
class Forbidden:
    name: str
    sources: tuple[str, ...]
    forbidden: tuple[str, ...]


@dataclass(frozen=True)
class Pure:
    name: str
    sources: tuple[str, ...]
    forbidden: tuple[str, ...] = IO_MODULES


@dataclass(frozen=True)
class Layers:
    name: str
    layers: tuple[tuple[str, ...], ...]  # top first; each layer is a tuple of module prefixes


@dataclass(frozen=True)
class Reachable:
    """Every module under `package` (but `exempt`) is imported, directly or lazily, from `entry`: the product
    holds nothing that only the tests or the bench use."""

    name: str
    package: str
    entry: str
    exempt: tuple[str, ...] = ()


Contract = Forbidden | Pure | Layers | Reachable

CONTRACTS: tuple[Contract, ...] = (
    Forbidden(
        "the product never imports the bench, the tests or the benchmarks",
        sources=("dra_driver",),
        forbidden=("dra_sandbox", "tests", "bench"),
    ),
    Forbidden(
        "the kubelet plugin imports neither CEL nor the allocator (they cost start-up time and are not needed)",
        sources=(
            "dra_driver.plugin",
            "dra_driver.slices",
            "dra_driver.claimconfig",
            "dra_driver.inventory",
            "dra_driver.resourceapi",
        ),
        forbidden=("dra_driver.cel", "dra_driver.allocation", "celpy", "lark"),
    ),
    Forbidden(
        "the kubelet plugin's path imports no `kubernetes` package (half a second of start-up): the product's own "
        "loader and transport reach the API; only k8s.fallback, imported lazily for exec/auth-provider kubeconfigs, "
        "may",
        sources=(
            "dra_driver.commands.kubelet_plugin",
            "dra_driver.plugin",
            "dra_driver.slices",
            "dra_driver.inventory",
            "dra_driver.claimconfig",
            "dra_driver.resourceapi",
            "dra_driver.nvml",
            "dra_driver.cdi",
            "dra_driver.observability",
            "dra_driver.k8s.client",
            "dra_driver.k8s.kubeconfig",
            "dra_driver.k8s.transport",
            "dra_driver.k8s.events",
        ),
        forbidden=("kubernetes",),
    ),
    Pure(
        "the pure core does no I/O",
        sources=(
            "dra_driver.inventory.model",
            "dra_driver.inventory.catalog",
            "dra_driver.inventory.discover",
            "dra_driver.inventory.render",
            "dra_driver.slices.builder",
            "dra_driver.slices.attributes",
            "dra_driver.slices.counters",
            "dra_driver.claimconfig",
            "dra_driver.resourceapi",
            "dra_driver.policy",
            "dra_driver.cdi.model",
            "dra_driver.cdi.names",
            "dra_driver.cdi.version",
            "dra_driver.cdi.encode",
            "dra_driver.cdi.validate",
            "dra_driver.allocation",
            "dra_driver.cel",
            "dra_driver.k8s.quantity",
            "dra_driver.k8s.semver",
            "dra_driver.k8s.names",
            "dra_driver.strictdecode",
            "dra_driver.nvml.types",
            "dra_driver.nvml.backend",
            "dra_driver.nvml.profile_name",
            "dra_driver.commands.statusview",
            "dra_driver.plugin.health.healing",
        ),
    ),
    Layers(
        "product layers: nothing imports upward",
        layers=(
            ("dra_driver.cli", "dra_driver.commands", "dra_driver.controller"),
            ("dra_driver.plugin",),
            ("dra_driver.slices",),
            ("dra_driver.inventory", "dra_driver.allocation", "dra_driver.policy"),
            (
                "dra_driver.nvml",
                "dra_driver.cel",
                "dra_driver.cdi",
                "dra_driver.claimconfig",
            ),
            ("dra_driver.resourceapi",),
            (
                "dra_driver.k8s",
                "dra_driver.fsutil",
                "dra_driver.observability",
                "dra_driver._gen",
                "dra_driver.strictdecode",
            ),
            ("dra_driver.errors", "dra_driver.defaults"),
        ),
    ),
    Reachable(
        "every product module serves the product (none is there only for tests or the bench)",
        package="dra_driver",
        entry="dra_driver.cli",
        exempt=("dra_driver._gen",),  # protoc output: whole files, some messages unused
    ),
)


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # what it imports (absolute)
    line: int


@dataclass(frozen=True)
class Violation:
    contract: str
    detail: str


def under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool) -> Iterator[Import]:
    """Every import in `source`, made absolute; `from pkg import name` also yields `pkg.name`, since
    `name` may be a submodule (an extra edge to a module that does not exist is harmless)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join([*base_parts, node.module] if node.module else base_parts)
            else:
                base = node.module or ""
            yield Import(module, base, node.lineno)
            for alias in node.names:
                if alias.name != "*":
                    yield Import(module, f"{base}.{alias.name}", node.lineno)


def collect(roots: Iterable[Path]) -> dict[str, list[Import]]:
    """module -> its imports, for every .py file under each root package directory."""
    graph: dict[str, list[Import]] = {}
    for package_dir in roots:
        base = package_dir.parent
        for path in sorted(package_dir.rglob("*.py")):
            name = module_name(path, base)
            graph[name] = list(imports_of(path.read_text(), name, path.name == "__init__.py"))
    return graph


def _matches(module: str, prefixes: Sequence[str]) -> bool:
    return any(under(module, p) for p in prefixes)


def check_forbidden(contract: Forbidden, graph: Mapping[str, list[Import]]) -> list[Violation]:
    out = []
    for module, imports in graph.items():
        if not _matches(module, contract.sources):
            continue
        for imp in imports:
            if _is_real_hit(imp.target, contract.forbidden, graph):
                out.append(Violation(contract.name, f"{module}:{imp.line} imports {imp.target}"))
    return _dedupe(out)


def _is_real_hit(target: str, forbidden: Sequence[str], graph: Mapping[str, list[Import]]) -> bool:
    """A forbidden prefix that is not a module of the scanned tree (a third-party or stdlib module), or a
    scanned module: either way the import is real. `from pkg import name` edges to non-modules are not."""
    if not _matches(target, forbidden):
        return False
    top = target.split(".")[0]
    scanned_tops = {m.split(".")[0] for m in graph}
    if top in scanned_tops:
        return target in graph
    return True


def _project_deps(module: str, graph: Mapping[str, list[Import]]) -> Iterator[str]:
    """The scanned modules that importing `module` runs: its imports and their parent packages
    (importing `a.b.c` executes `a/__init__` and `a/b/__init__` first)."""
    for imp in graph.get(module, []):
        parts = imp.target.split(".")
        for end in range(1, len(parts) + 1):
            candidate = ".".join(parts[:end])
            if candidate in graph and candidate != module:
                yield candidate


def check_pure(contract: Pure, graph: Mapping[str, list[Import]]) -> list[Violation]:
    """One violation per offending import (module and line), with the first chain that reaches it."""
    found: dict[tuple[str, int], Violation] = {}
    for start in sorted(m for m in graph if _matches(m, contract.sources)):
        # Breadth-first over project modules, remembering how each was reached, for a readable chain.
        via: dict[str, list[str]] = {start: [start]}
        queue = [start]
        while queue:
            module = queue.pop(0)
            for imp in graph[module]:
                if (module, imp.line) not in found and _is_real_hit(imp.target, contract.forbidden, graph):
                    chain = " -> ".join(via[module])
                    found[(module, imp.line)] = Violation(
                        contract.name, f"{chain} imports {imp.target} (line {imp.line})"
                    )
            for dep in _project_deps(module, graph):
                if dep not in via:
                    via[dep] = [*via[module], dep]
                    queue.append(dep)
    return list(found.values())


def layer_of(module: str, layers: Sequence[Sequence[str]]) -> int | None:
    for index, layer in enumerate(layers):
        if _matches(module, layer):
            return index
    return None


def check_layers(contract: Layers, graph: Mapping[str, list[Import]]) -> list[Violation]:
    out = []
    for module, imports in graph.items():
        own = layer_of(module, contract.layers)
        if own is None:
            continue
        for imp in imports:
            if imp.target not in graph:
                continue
            other = layer_of(imp.target, contract.layers)
            if other is not None and other < own:
                out.append(Violation(contract.name, f"{module}:{imp.line} imports {imp.target}, a higher layer"))
    return _dedupe(out)


def _dedupe(violations: list[Violation]) -> list[Violation]:
    """`from pkg import name` yields two edges for one line; report the line once."""
    seen: dict[str, Violation] = {}
    for v in violations:
        seen.setdefault(v.detail.split(" imports ")[0], v)
    return list(seen.values())


def check_reachable(contract: Reachable, graph: Mapping[str, list[Import]]) -> list[Violation]:
    seen: set[str] = set()
    stack = [contract.entry]
    while stack:
        module = stack.pop()
        if module not in seen:
            seen.add(module)
            stack += _project_deps(module, graph)
    return [
        Violation(contract.name, f"{module} is not imported from {contract.entry}: move it to the bench or use it")
        for module in sorted(graph)
        if under(module, contract.package) and not _matches(module, contract.exempt) and module not in seen
    ]


def check(graph: Mapping[str, list[Import]], contracts: Sequence[Contract] = CONTRACTS) -> list[Violation]:
    out: list[Violation] = []
    for contract in contracts:
        if isinstance(contract, Forbidden):
            out += check_forbidden(contract, graph)
        elif isinstance(contract, Pure):
            out += check_pure(contract, graph)
        elif isinstance(contract, Layers):
            out += check_layers(contract, graph)
        else:
            out += check_reachable(contract, graph)
    return out


def package_dirs(root: Path) -> list[Path]:
    return [root / "dra_driver", root / "sandbox" / "dra_sandbox"]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    root = Path(args[0]) if args else Path.cwd()
    graph = collect(package_dirs(root))
    violations = check(graph)
    for v in violations:
        print(f"broken contract: {v.contract}: {v.detail}")
    print(f"layers: {len(CONTRACTS)} contracts, {len(graph)} modules, {len(violations)} broken")
    return 1 if violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
