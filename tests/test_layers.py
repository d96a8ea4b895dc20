"""The import contracts (`python -m dra_sandbox.layers`, run by `make lint`): the real tree keeps them,
and each contract fails when it is broken on purpose, in a copy of the tree and in the graph."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from dra_sandbox import layers

REPO = Path(__file__).resolve().parents[1]


@cache
def _collected() -> dict[str, list[layers.Import]]:
    return layers.collect(layers.package_dirs(REPO))


def real_graph() -> dict[str, list[layers.Import]]:
    """The tree's import graph, read once per session; a copy, so a test may change it."""
    return dict(_collected())


def with_import(module: str, target: str) -> dict[str, list[layers.Import]]:
    graph = real_graph()
    assert module in graph, module
    graph[module] = [*graph[module], layers.Import(module, target, 9999)]
    return graph


def broken(graph: dict[str, list[layers.Import]]) -> list[str]:
    return [f"{v.contract}: {v.detail}" for v in layers.check(graph)]


def test_the_tree_keeps_every_contract() -> None:
    assert broken(real_graph()) == []


def test_product_importing_the_bench_is_refused() -> None:
    found = broken(with_import("dra_driver.plugin.engine", "dra_sandbox.cluster"))
    assert any("never imports the bench" in f and "dra_driver.plugin.engine:9999" in f for f in found), found


def test_plugin_importing_cel_is_refused() -> None:
    found = broken(with_import("dra_driver.claimconfig.decode", "dra_driver.cel.environment"))
    assert any("neither CEL nor the allocator" in f for f in found), found
    found = broken(with_import("dra_driver.plugin.engine", "celpy"))
    assert any("neither CEL nor the allocator" in f and "celpy" in f for f in found), found


@pytest.mark.parametrize("target", ["grpc", "kubernetes.client", "pynvml", "os", "socket", "dra_driver.fsutil"])
def test_io_in_the_pure_core_is_refused_with_its_chain(target: str) -> None:
    found = broken(with_import("dra_driver.inventory.model", target))
    assert any("pure core" in f and f"dra_driver.inventory.model imports {target}" in f for f in found), found


def test_k8s_names_is_pure_in_its_own_right() -> None:
    # The name formats are shared by the product and the bench's rule book; they must stay I/O-free even if
    # no other pure module imported them, so the edge from cdi.names is cut before the injection.
    graph = with_import("dra_driver.k8s.names", "os")
    cdi_names = graph["dra_driver.cdi.names"]
    graph["dra_driver.cdi.names"] = [i for i in cdi_names if not i.target.startswith("dra_driver.k8s.names")]
    found = broken(graph)
    assert any("pure core" in f and "dra_driver.k8s.names imports os" in f for f in found), found


def test_io_reached_transitively_is_refused() -> None:
    # slices.builder -> slices.counters -> (new) k8s.client -> kubernetes: the chain is reported.
    found = broken(with_import("dra_driver.slices.counters", "dra_driver.k8s.client"))
    assert any("dra_driver.slices.builder -> dra_driver.slices.counters -> dra_driver.k8s.client" in f for f in found)


def test_upward_import_is_refused() -> None:
    found = broken(with_import("dra_driver.k8s.quantity", "dra_driver.slices.builder"))
    assert any("nothing imports upward" in f and "dra_driver.k8s.quantity:9999" in f for f in found), found


def test_checker_reads_files_and_fails_the_command(tmp_path: Path) -> None:
    """End to end on a copy of the tree: a forbidden import in a file makes the command exit 1."""
    shutil.copytree(REPO / "dra_driver", tmp_path / "dra_driver", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(
        REPO / "sandbox" / "dra_sandbox", tmp_path / "sandbox" / "dra_sandbox", ignore=shutil.ignore_patterns("__pycache__")
    )
    run = [sys.executable, "-m", "dra_sandbox.layers", str(tmp_path)]
    clean = subprocess.run(run, capture_output=True, text=True, check=False)
    assert clean.returncode == 0, clean.stdout
    with (tmp_path / "dra_driver" / "inventory" / "catalog.py").open("a") as f:
        f.write("\n\ndef _late() -> None:\n    import subprocess  # noqa\n")
    dirty = subprocess.run(run, capture_output=True, text=True, check=False)
    assert dirty.returncode == 1
    assert "dra_driver.inventory.catalog imports subprocess" in dirty.stdout


def test_plugin_importing_kubernetes_is_refused() -> None:
    found = broken(with_import("dra_driver.kubeletplugin.claims", "kubernetes.client"))
    assert any("no `kubernetes` package" in f and "dra_driver.kubeletplugin.claims:9999" in f for f in found), found
    found = broken(with_import("dra_driver.k8s.client", "kubernetes.config"))
    assert any("no `kubernetes` package" in f and "dra_driver.k8s.client:9999" in f for f in found), found


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
    graph = real_graph()
    graph["dra_driver.only_for_tests"] = []
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
    assert any("knows nothing of GPUs" in f and f"{module} imports {target}" in f for f in found), found


def test_the_kubelet_plugin_layer_reaching_the_gpu_driver_through_another_module_is_refused() -> None:
    # kubeletplugin.claims -> k8s.client -> (new) nvml.backend: the layer would load the GPU driver all the same.
    found = broken(with_import("dra_driver.k8s.client", "dra_driver.nvml.backend"))
    assert any(
        "knows nothing of GPUs" in f and "dra_driver.kubeletplugin.claims -> dra_driver.k8s.client imports" in f
        for f in found
    ), found


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
    assert any("inside the kubelet-plugin layer: the server" in f and f"{module}:9999 imports {target}" in f
               for f in found), found


def test_the_servicers_may_import_the_store() -> None:
    assert broken(with_import("dra_driver.kubeletplugin.services", "dra_driver.kubeletplugin.checkpoint")) == []


@pytest.mark.parametrize("target", ["grpc", "dra_driver._gen.dra_v1_pb2"])
def test_grpc_below_the_servicers_of_the_kubelet_plugin_layer_is_refused(target: str) -> None:
    found = broken(with_import("dra_driver.kubeletplugin.checkpoint", target))
    assert any("only the server and the servicers speak gRPC" in f for f in found), found


def test_the_layer_is_below_the_gpu_driver_in_the_product_layers() -> None:
    found = broken(with_import("dra_driver.kubeletplugin.sockets", "dra_driver.plugin.app"))
    assert any("nothing imports upward" in f and "dra_driver.kubeletplugin.sockets:9999" in f for f in found), found
