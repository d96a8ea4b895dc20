"""`dra-driver explain` against an API server holding a published node: exit 0 and the node it fits on, or exit 2
and the allocator's reasons."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.deviceclasses import device_classes

OTHER_DRIVER = "nic.example.com"


def _spread_slice(name: str, node: str) -> dict[str, object]:
    """One of two slices of a pool that spans two nodes: `--node` must complete it from the other node."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": OTHER_DRIVER, "nodeName": node,
                     "pool": {"name": "spread", "generation": 1, "resourceSliceCount": 2},
                     "devices": [{"name": f"{name}-nic"}]}}


@dataclass(frozen=True)
class Server:
    api: ApiServer
    kubeconfig: Path


# Every supported minor's field-selector rules: the oldest and the newest (fieldlabels.SUPPORTED_MINORS).
@pytest.fixture(scope="module", params=["1.34.0", "1.37.0"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with ApiServer(garbage_collection=False, kube_version=request.param) as srv:
        rest = srv.rest()
        rest.request(
            "POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-l4"}}
        )
        for cls in device_classes(DRIVER_NAME):
            rest.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", body=cls)
        backend = open_backend("fake:l4x2")
        backend.init()
        inv = discover(backend)
        for obj in build_slices(inv.system, catalog(inv, MigOffering.DYNAMIC), SliceSettings(DRIVER_NAME, "node-l4"), 1):
            rest.request("POST", "/apis/resource.k8s.io/v1/resourceslices", body=obj)
        for name, count in (("fits", 2), ("too-big", 3)):
            rest.request(
                "POST",
                "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
                body={
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {
                        "devices": {
                            "requests": [{"name": "gpus", "exactly": {"deviceClassName": DRIVER_NAME, "count": count}}]
                        }
                    },
                },
            )
        for name, node in (("spread-0", "node-l4"), ("spread-1", "node-far")):
            rest.request("POST", "/apis/resource.k8s.io/v1/resourceslices", body=_spread_slice(name, node))
        path = tmp_path_factory.mktemp("explain") / "kubeconfig"
        srv.write_kubeconfig(path)
        yield Server(srv, path)


@pytest.fixture
def kubeconfig(server: Server) -> Path:
    return server.kubeconfig


def _explain(kubeconfig: Path, claim: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return _cli(kubeconfig, "explain", claim, *extra)


def _cli(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_driver.cli", *args, "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("read", [(), ("--watch-list",)], ids=["pages", "watch-list"])
def test_a_claim_that_fits(kubeconfig: Path, read: tuple[str, ...]) -> None:
    out = _explain(kubeconfig, "default/fits", *read)
    assert out.returncode == 0, out.stderr
    assert "claim default/fits: not allocated" in out.stdout
    assert "fits on: node-l4" in out.stdout
    assert "gpus -> gpu.dra.dev/node-l4/gpu-0" in out.stdout


def test_a_claim_that_does_not_fit_says_why(kubeconfig: Path) -> None:
    out = _explain(kubeconfig, "too-big")
    assert out.returncode == 2
    assert "fits on no node" in out.stdout
    # Counted before parsing (the node has fewer GPUs than asked for); --all-devices accounts device by device.
    assert "request 'gpus' cannot be satisfied: needs 3 devices, at most 2 on the node match its selectors" in out.stdout
    full = _explain(kubeconfig, "too-big", "--all-devices")
    assert full.returncode == 2 and "needs 3 devices, 2 available" in full.stdout


def test_a_missing_claim(kubeconfig: Path) -> None:
    out = _explain(kubeconfig, "default/nope")
    assert out.returncode == 1 and "not found" in out.stderr


def _slice_lists(srv: ApiServer) -> list[int]:
    return [r.code for r in srv.request_log.records() if r.verb == "list" and r.resource == "resourceslices"]


def test_explain_for_one_node_uses_only_selectors_every_supported_server_accepts(server: Server) -> None:
    """`--node`: the slices naming the node, those naming none, then the driver of the pool they leave incomplete
    (spec.driver, filtered to the pool here: no API server of 1.34-1.37 selects by spec.pool.name)."""
    server.api.request_log.reset()
    out = _explain(server.kubeconfig, "default/fits", "--node", "node-l4")
    assert out.returncode == 0, out.stderr
    assert "fits on: node-l4" in out.stdout
    assert _slice_lists(server.api) == [200, 200, 200]


def test_status_for_one_node_uses_only_selectors_every_supported_server_accepts(server: Server) -> None:
    server.api.request_log.reset()
    out = _cli(server.kubeconfig, "status", "--node", "node-l4", "-o", "json")
    assert out.returncode == 0, out.stderr
    assert "gpu-0" in out.stdout and "node-l4" in out.stdout
    # The node's slices, the slices naming no node; pool node-l4 is complete, so no whole-driver LIST.
    assert _slice_lists(server.api) == [200, 200]
    server.api.request_log.reset()
    out = _cli(server.kubeconfig, "status", "--node", "node-l4", "-o", "json", "--driver-name", OTHER_DRIVER)
    assert out.returncode == 0, out.stderr
    assert [n["name"] for n in json.loads(out.stdout)] == ["node-l4"]  # node-far's slice completes the pool only
    assert _slice_lists(server.api) == [200, 200, 200]  # pool spread is incomplete: the driver's list, once
