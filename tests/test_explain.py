"""`dra-driver explain` against an API server holding a published node: exit 0 and the node it fits on, or exit 2
and the allocator's reasons."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigPolicy, catalog
from dra_driver.inventory.discover import discover
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.deviceclasses import device_classes


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with ApiServer(garbage_collection=False) as srv:
        rest = srv.rest()
        rest.request(
            "POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-l4"}}
        )
        for cls in device_classes(DRIVER_NAME):
            rest.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", body=cls)
        backend = open_backend("fake:l4x2")
        backend.init()
        inv = discover(backend)
        for obj in build_slices(inv.system, catalog(inv, MigPolicy.DYNAMIC), SliceSettings(DRIVER_NAME, "node-l4"), 1):
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
        path = tmp_path_factory.mktemp("explain") / "kubeconfig"
        srv.write_kubeconfig(path)
        yield path


def _explain(kubeconfig: Path, claim: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_driver.cli", "explain", claim, "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_claim_that_fits(kubeconfig: Path) -> None:
    out = _explain(kubeconfig, "default/fits")
    assert out.returncode == 0, out.stderr
    assert "claim default/fits: not allocated" in out.stdout
    assert "fits on: node-l4" in out.stdout
    assert "gpus -> gpu.dra.dev/node-l4/gpu-0" in out.stdout


def test_a_claim_that_does_not_fit_says_why(kubeconfig: Path) -> None:
    out = _explain(kubeconfig, "too-big")
    assert out.returncode == 2
    assert "fits on no node" in out.stdout
    assert "needs 3 devices, 2 available" in out.stdout


def test_a_missing_claim(kubeconfig: Path) -> None:
    out = _explain(kubeconfig, "default/nope")
    assert out.returncode == 1 and "not found" in out.stderr
