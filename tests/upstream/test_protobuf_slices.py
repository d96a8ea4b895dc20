"""ResourceSlices as kube-apiserver 1.37 encodes them in protobuf, read by the product's own subset of the messages
(k8s/sliceproto.py): every object of a real protobuf LIST converts to what the same LIST says in JSON, and
`dra-driver explain` and `dra-driver status` answer the same from protobuf as from JSON (`--no-protobuf`).

The first test also records the server's bytes for one small slice (tests/kube/fixtures/, with its JSON), which
tests/kube/test_sliceproto.py decodes on every run without the upstream binaries; RECORD_PROTOBUF_FIXTURE=1
rewrites them. Skips with the upstream banner where the binaries are not built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import fleet_bench
from bench.fleet_upstream_bench import CLAIMS, claim, fleet
from dra_driver.defaults import DRIVER_NAME
from dra_driver.k8s import sliceproto
from dra_driver.k8s.client import KubeRest
from dra_driver.k8s.liststream import stream_pages
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.upstream.controlplane import ControlPlane, ControlPlaneConfig
from tests.upstream.conftest import release_binaries

pytestmark = pytest.mark.xdist_group("upstream")
RESOURCE = "/apis/resource.k8s.io/v1"
SLICES = f"{RESOURCE}/resourceslices"
FIXTURES = Path(__file__).parents[1] / "kube" / "fixtures"
# A slice with what the fleet's lack: a node selector instead of a node, an empty string and an int 0 attribute.
ODD = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "odd", "labels": {"a": "b"}},
       "spec": {"driver": "nic.example.com", "pool": {"name": "odd", "generation": 1, "resourceSliceCount": 1},
                "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kind", "operator": "In", "values": ["x"]}]}]},
                "devices": [{"name": "nic-0", "attributes": {"empty": {"string": ""}, "zero": {"int": 0},
                                                             "off": {"bool": False}, "v": {"version": "1.2.3"}},
                             "capacity": {"lanes": {"value": "4"}}}]}}


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    config = ControlPlaneConfig(tmp_path_factory.mktemp("protobuf"), release_binaries())
    with ControlPlane(config) as started:
        rest = started.admin()
        for cls in device_classes(DRIVER_NAME):
            rest.request("POST", f"{RESOURCE}/deviceclasses", body=cls)
        for name in CLAIMS:
            rest.request("POST", f"{RESOURCE}/namespaces/default/resourceclaims", body=claim(name))
        inventories = fleet_bench._inventories()
        for node in fleet(6):  # the last one the only H200 node
            built = fleet_bench._node_slices(inventories, node.name, node.preset, node.salt)
            fleet_bench._publish_node(rest, node.name, node.preset, built)
        rest.request("POST", SLICES, body=ODD)
        yield started


def _comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """The JSON object less what the subset does not hold (managedFields), and the protobuf conversion's object
    less what protobuf writes and JSON leaves out: a value field's zero (Go's protobuf writes `generation: 0` and
    a zero `creationTimestamp` where JSON's `omitempty` writes nothing)."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items()
            if k != "managedFields" and v not in (0, "1970-01-01T00:00:00Z")}
    return {**obj, "metadata": meta}


def test_a_real_protobuf_list_converts_to_what_its_json_says(plane: ControlPlane) -> None:
    rest = plane.admin()
    items = list(stream_pages(rest, SLICES, page=5))
    assert items and all(item.protobuf for item in items)  # kube-apiserver answers protobuf; 5 per page: pages
    from_json = rest.request("GET", SLICES)["items"]
    assert len(items) == len(from_json)
    for item, expected in zip(items, from_json, strict=True):
        assert _comparable(sliceproto.resource_slice(item.data)) == _comparable(expected)
    if os.environ.get("RECORD_PROTOBUF_FIXTURE") == "1":
        _record(rest)


def _record(rest: KubeRest) -> None:
    """One small slice's LIST (the odd one) in both encodings, as the server sent them."""
    from dra_driver.k8s.liststream import _get

    query = {"fieldSelector": "spec.driver=nic.example.com"}
    FIXTURES.mkdir(exist_ok=True)
    (FIXTURES / "resourceslices-1.37.pb").write_bytes(_get(rest, SLICES, query, sliceproto.ACCEPT))
    (FIXTURES / "resourceslices-1.37.json").write_bytes(_get(rest, SLICES, query, "application/json"))


def _cli(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")}
    return subprocess.run([sys.executable, "-m", "dra_driver.cli", *args, "--kubeconfig", str(plane.admin_kubeconfig)],
                          capture_output=True, text=True, timeout=120, check=False, env=env)


@pytest.mark.parametrize("name", list(CLAIMS))
def test_explain_answers_the_same_from_protobuf_as_from_json(plane: ControlPlane, name: str) -> None:
    ref = f"default/{claim(name)['metadata']['name']}"
    from_protobuf = _cli(plane, "explain", ref)
    from_json = _cli(plane, "explain", ref, "--no-protobuf")
    assert from_protobuf.returncode == CLAIMS[name], from_protobuf.stderr
    assert (from_protobuf.returncode, from_protobuf.stdout) == (from_json.returncode, from_json.stdout)


def test_status_answers_the_same_from_protobuf_as_from_json(plane: ControlPlane) -> None:
    shown = _cli(plane, "status", "-o", "json")
    from_json = _cli(plane, "status", "-o", "json", "--no-protobuf")
    assert shown.returncode == from_json.returncode == 0, shown.stderr
    assert sorted(n["name"] for n in json.loads(shown.stdout)) == sorted(n.name for n in fleet(6))
    assert json.loads(shown.stdout) == json.loads(from_json.stdout)
