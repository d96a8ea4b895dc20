"""The import contracts (import-linter, `[tool.importlinter]` in pyproject.toml; `make lint` and
`python -m dra_sandbox.layers`): the real tree keeps them, and each contract fails when it is broken on purpose,
in the graph and in an edited copy of the tree."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from grimp import ImportGraph

from dra_sandbox import importcontracts, layers

REPO = Path(__file__).resolve().parents[1]


@cache
def contracts() -> layers.Contracts:
    return layers.read_contracts(REPO)


@cache
def _real_graph() -> ImportGraph:
    return layers.build_graph(contracts())


def real_graph() -> ImportGraph:
    return copy.deepcopy(_real_graph())


def with_import(module: str, target: str, graph: ImportGraph | None = None) -> ImportGraph:
    """The real graph plus one import `module -> target` on line 9999 (a third-party `target` is added
    squashed, as grimp keeps external packages)."""
    graph = graph if graph is not None else real_graph()
    assert module in graph.modules, module
    if target not in graph.modules and target.split(".")[0] not in {"dra_driver", "dra_sandbox"}:
        target = target.split(".")[0]
        graph.add_module(target, is_squashed=True)
    graph.add_import(importer=module, imported=target, line_number=9999, line_contents=f"import {target}")
    return graph


def broken(graph: ImportGraph) -> list[str]:
    return [f"{b.contract}: {d}" for b in layers.check(graph, contracts()) for d in b.details or ("",)]


def test_the_tree_keeps_every_contract() -> None:
    assert broken(real_graph()) == []


def test_every_contract_is_proven_to_fail_here() -> None:
    """Each contract in pyproject.toml has a test below that breaks it (a new contract needs one too)."""
    proven = {
        "no-bench", "plugin-no-cel", "plugin-no-kubernetes", "pure-core", "layers", "reachable",
        "kubeletplugin-no-gpu", "kubeletplugin-layers", "kubeletplugin-grpc-edge", "drivers-independent",
        "effect-kinds-independent", "acyclic",
    }
    assert {options["id"] for _, options in contracts().contracts} == proven


def test_function_level_imports_are_in_the_graph() -> None:
    """Lazy imports count: dra_driver.k8s.client imports k8s.fallback only inside a function."""
    details = _real_graph().get_import_details(importer="dra_driver.k8s.client", imported="dra_driver.k8s.fallback")
    assert details, "grimp did not see the lazy import"


def test_product_importing_the_bench_is_refused() -> None:
    found = broken(with_import("dra_driver.plugin.engine", "dra_sandbox.cluster"))
    assert any("never imports the bench" in f and "dra_driver.plugin.engine -> dra_sandbox.cluster (l.9999)" in f
               for f in found), found
    found = broken(with_import("dra_driver.plugin.engine", "tests.polling"))
    assert any("never imports the bench" in f and "dra_driver.plugin.engine -> tests (l.9999)" in f
               for f in found), found


def test_plugin_importing_cel_is_refused() -> None:
    found = broken(with_import("dra_driver.claimconfig.decode", "dra_driver.cel.environment"))
    assert any("neither CEL nor the allocator" in f and "dra_driver.claimconfig.decode -> dra_driver.cel.environment"
               in f for f in found), found
    found = broken(with_import("dra_driver.plugin.engine", "celpy"))
    assert any("neither CEL nor the allocator" in f and "dra_driver.plugin.engine -> celpy" in f for f in found), found


def test_plugin_reaching_cel_indirectly_is_refused() -> None:
    # plugin.engine -> (new) k8s.semver -> (new) allocation.context: the forbidden contract follows chains too.
    graph = with_import("dra_driver.plugin.engine", "dra_driver.k8s.semver")
    graph = with_import("dra_driver.k8s.semver", "dra_driver.allocation.context", graph)
    found = broken(graph)
    assert any("neither CEL nor the allocator" in f and "dra_driver.k8s.semver -> dra_driver.allocation.context"
               in f for f in found), found


@pytest.mark.parametrize("target", ["grpc", "kubernetes.client", "pynvml", "os", "socket", "dra_driver.fsutil"])
def test_io_in_the_pure_core_is_refused_with_its_chain(target: str) -> None:
    found = broken(with_import("dra_driver.inventory.model", target))
    shown = target.split(".")[0] if target != "dra_driver.fsutil" else target
    assert any("pure core" in f and f"dra_driver.inventory.model imports {shown} (line 9999)" in f
               for f in found), found


def test_k8s_names_is_pure_in_its_own_right() -> None:
    # The name formats are shared by the product and the bench's rule book; they must stay I/O-free even if
    # no other pure module imported them, so the edges to it are cut before the injection.
    graph = with_import("dra_driver.k8s.names", "os")
    for importer in graph.find_modules_that_directly_import("dra_driver.k8s.names"):
        graph.remove_import(importer=importer, imported="dra_driver.k8s.names")
    found = broken(graph)
    assert any("pure core" in f and f.endswith(": dra_driver.k8s.names imports os (line 9999)") for f in found), found


def test_io_reached_transitively_is_refused() -> None:
    # slices.builder -> slices.counters -> (new) k8s.client -> kubernetes: the chain is reported.
    found = broken(with_import("dra_driver.slices.counters", "dra_driver.k8s.client"))
    assert any("dra_driver.slices.builder -> dra_driver.slices.counters -> dra_driver.k8s.client" in f
               for f in found), found


def test_io_in_a_parent_package_is_refused() -> None:
    """Importing `a.b.c` runs `a/b/__init__`: I/O there breaks the pure core although no module imports the
    package itself (the edge grimp's graph lacks, which the built-in `forbidden` contract would miss)."""
    graph = with_import("dra_driver.slices.counters", "dra_driver.observability.metrics")
    graph.remove_import(importer="dra_driver.slices.counters", imported="dra_driver.observability.metrics")
    graph = with_import("dra_driver.slices.counters", "dra_driver.k8s.quantity", graph)
    graph = with_import("dra_driver.k8s", "socket", graph)
    found = broken(graph)
    assert any("pure core" in f and "-> dra_driver.k8s imports socket (line 9999)" in f for f in found), found


def test_upward_import_is_refused() -> None:
    found = broken(with_import("dra_driver.k8s.quantity", "dra_driver.slices.builder"))
    assert any("nothing imports upward" in f and "dra_driver.k8s.quantity -> dra_driver.slices.builder (l.9999)"
               in f for f in found), found


def test_checker_reads_files_and_fails_the_command(tmp_path: Path) -> None:
    """End to end on a copy of the tree: a lazy forbidden import in a file makes the command exit 1, naming it."""
    shutil.copytree(REPO / "dra_driver", tmp_path / "dra_driver", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(
        REPO / "sandbox" / "dra_sandbox", tmp_path / "sandbox" / "dra_sandbox", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    run = [sys.executable, "-m", "dra_sandbox.layers", str(tmp_path)]
    clean = subprocess.run(run, capture_output=True, text=True, check=False)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "0 broken" in clean.stdout, clean.stdout
    with (tmp_path / "dra_driver" / "inventory" / "catalog.py").open("a") as f:
        f.write("\n\ndef _late() -> None:\n    import subprocess  # noqa\n")
    dirty = subprocess.run(run, capture_output=True, text=True, check=False)
    assert dirty.returncode == 1, dirty.stdout + dirty.stderr
    assert "dra_driver.inventory.catalog imports subprocess" in " ".join(dirty.stdout.split()), dirty.stdout


def test_plugin_importing_kubernetes_is_refused() -> None:
    found = broken(with_import("dra_driver.kubeletplugin.claims", "kubernetes.client"))
    assert any("no `kubernetes` package" in f and "dra_driver.kubeletplugin.claims -> kubernetes (l.9999)" in f
               for f in found), found
    found = broken(with_import("dra_driver.k8s.client", "kubernetes.config"))
    assert any("no `kubernetes` package" in f and "dra_driver.k8s.client -> kubernetes (l.9999)" in f
               for f in found), found


def test_only_the_named_fallback_edge_may_reach_kubernetes() -> None:
    # The exception is one import (k8s.client -> k8s.fallback); another way to fallback is refused.
    found = broken(with_import("dra_driver.k8s.transport", "dra_driver.k8s.fallback"))
    assert any("no `kubernetes` package" in f and "dra_driver.k8s.transport -> dra_driver.k8s.fallback" in f
               for f in found), found


def test_importing_the_plugin_pulls_in_no_cel_no_kubernetes_and_no_bench(tmp_path: Path) -> None:
    """What the kubelet plugin process really loads (a fresh interpreter, not this test process), including
    making its API client from a kubeconfig as `dra-driver kubelet-plugin --kubeconfig` does."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    code = (
        "import json, sys\n"
        "import dra_driver.cli, dra_driver.commands.kubelet_plugin, dra_driver.plugin.app, dra_driver.nvml.factory\n"
        "from dra_driver.k8s.client import connect\n"
        f"connect({str(kubeconfig)!r})\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = {m.split(".")[0] for m in json.loads(out)}
    assert "dra_driver" in loaded and "grpc" in loaded and "urllib3" in loaded  # the probe really ran
    # pydantic: the claim config models load with the first claim that carries config, the fake NVML's with the
    # fake; neither on the plugin's start path with real GPUs.
    unwanted = {"celpy", "lark", "aiohttp", "kopf", "kubernetes", "pydantic", "dra_sandbox", "tests", "bench"}
    assert not loaded & unwanted, sorted(loaded & unwanted)


def test_a_product_module_only_the_bench_uses_is_refused() -> None:
    graph = real_graph()  # the bench imports it; the product does not
    graph.add_module("dra_driver.only_for_tests")
    graph.add_import(importer="dra_sandbox.cluster", imported="dra_driver.only_for_tests", line_number=1,
                     line_contents="import dra_driver.only_for_tests")
    found = broken(graph)
    assert any("dra_driver.only_for_tests is not imported from dra_driver.cli" in f for f in found), found


# ---- the kubelet-plugin layer (dra_driver.kubeletplugin) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "target"),
    [
        ("dra_driver.kubeletplugin.services", "dra_driver.plugin.engine"),
        ("dra_driver.kubeletplugin.checkpoint", "dra_driver.plugin.checkpoint"),
        ("dra_driver.kubeletplugin.server", "dra_driver.inventory.catalog"),
        ("dra_driver.kubeletplugin.claims", "dra_driver.slices.builder"),
        ("dra_driver.kubeletplugin.statedirs", "dra_driver.cdi.writer"),
        ("dra_driver.kubeletplugin.driver", "dra_driver.claimconfig.api"),
        ("dra_driver.kubeletplugin.names", "pynvml"),
    ],
)
def test_the_kubelet_plugin_layer_importing_the_gpu_driver_is_refused(module: str, target: str) -> None:
    found = broken(with_import(module, target))
    assert any("knows nothing of GPUs" in f and f"{module} imports {target} (line 9999)" in f for f in found), found


def test_the_kubelet_plugin_layer_reaching_the_gpu_driver_through_another_module_is_refused() -> None:
    # kubeletplugin.claims -> k8s.client -> (new) nvml.backend: the layer would load the GPU driver all the same.
    found = broken(with_import("dra_driver.k8s.client", "dra_driver.nvml.backend"))
    assert any("knows nothing of GPUs" in f and "dra_driver.k8s.client imports dra_driver.nvml.backend" in f
               for f in found), found


@pytest.mark.parametrize(
    ("module", "target"),
    [
        ("dra_driver.kubeletplugin.checkpoint", "dra_driver.kubeletplugin.services"),  # the store under the servicers
        ("dra_driver.kubeletplugin.services", "dra_driver.kubeletplugin.server"),
        ("dra_driver.kubeletplugin.driver", "dra_driver.kubeletplugin.checkpoint"),
        ("dra_driver.kubeletplugin.claims", "dra_driver.kubeletplugin.server"),
    ],
)
def test_an_upward_import_inside_the_kubelet_plugin_layer_is_refused(module: str, target: str) -> None:
    found = broken(with_import(module, target))
    assert any("inside the kubelet-plugin layer: the server" in f and f"{module} -> {target} (l.9999)" in f
               for f in found), found


def test_the_servicers_may_import_the_store() -> None:
    assert broken(with_import("dra_driver.kubeletplugin.services", "dra_driver.kubeletplugin.checkpoint")) == []


@pytest.mark.parametrize("target", ["grpc", "dra_driver._gen.dra_v1_pb2"])
def test_grpc_below_the_servicers_of_the_kubelet_plugin_layer_is_refused(target: str) -> None:
    found = broken(with_import("dra_driver.kubeletplugin.checkpoint", target))
    assert any("only the server and the servicers speak gRPC" in f and "dra_driver.kubeletplugin.checkpoint" in f
               for f in found), found


def test_the_layer_is_below_the_gpu_driver_in_the_product_layers() -> None:
    found = broken(with_import("dra_driver.kubeletplugin.sockets", "dra_driver.plugin.app"))
    assert any("nothing imports upward" in f and "dra_driver.kubeletplugin.sockets -> dra_driver.plugin.app" in f
               for f in found), found


def test_the_gpu_driver_importing_the_compute_domain_driver_is_refused() -> None:
    found = broken(with_import("dra_driver.plugin.app", "dra_driver.computedomain.plugin.engine"))
    assert any("do not import each other" in f and "dra_driver.plugin.app" in f
               and "dra_driver.computedomain.plugin.engine" in f for f in found), found


@pytest.mark.parametrize(
    ("module", "target"),
    [("dra_driver.plugin.effects.time_slice", "dra_driver.plugin.effects.mig_partition"),
     ("dra_driver.plugin.effects.vfio_passthrough", "dra_driver.plugin.effects.cdi_spec")],
)
def test_an_effect_kind_importing_another_is_refused(module: str, target: str) -> None:
    found = broken(with_import(module, target))
    assert any("effect kinds do not import each other" in f and module in f and target in f for f in found), found


# Import circles (a module reaching itself through imports, lazy ones included) between the modules of one root
# package: the `acyclic` contract (dra_sandbox.importcontracts.find_circles).


def test_no_import_circle_in_the_product_or_the_bench() -> None:
    graph = real_graph()
    assert importcontracts.find_circles(graph, ["dra_driver", "dra_sandbox"]) == []


def test_an_import_circle_is_found() -> None:
    graph = with_import("dra_driver.k8s.names", "dra_driver.k8s.quantity")
    graph = with_import("dra_driver.k8s.quantity", "dra_driver.k8s.names", graph)
    assert importcontracts.find_circles(graph, ["dra_driver"]) == [("dra_driver.k8s.names", "dra_driver.k8s.quantity")]
    found = broken(graph)
    assert any("no import circle" in f and "dra_driver.k8s.names <-> dra_driver.k8s.quantity" in f for f in found), found
    three = with_import("dra_sandbox.polling", "dra_sandbox.signals")
    three = with_import("dra_sandbox.signals", "dra_sandbox.objects", three)
    three = with_import("dra_sandbox.objects", "dra_sandbox.polling", three)
    assert ("dra_sandbox.objects", "dra_sandbox.polling", "dra_sandbox.signals") in importcontracts.find_circles(
        three, ["dra_sandbox"])
    found = broken(three)
    assert any("dra_sandbox.objects <-> dra_sandbox.polling <-> dra_sandbox.signals" in f for f in found), found


def test_a_lazy_import_closing_a_circle_counts() -> None:
    """The circle this contract was written for: `nvidia-driver` read the state dir through `up`, which reaches
    the e2e runner, which imports `nvidia-driver` (both edges lazy, inside functions)."""
    found = broken(with_import("dra_sandbox.nvidiadriver", "dra_sandbox.up"))
    assert any("import circle" in f and "dra_sandbox.nvidiadriver" in f and "dra_sandbox.up" in f for f in found), found
