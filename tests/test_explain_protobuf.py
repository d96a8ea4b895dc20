"""`dra-driver explain` and `dra-driver status` read the slices as kube-apiserver's protobuf where the server sends
it, and answer exactly what they answer from JSON. The sandbox API server speaks JSON only (docs/sandbox.md), so a
small proxy in front of it answers the slices' LIST in protobuf when asked (our own encoder of the subset,
tests/kube/protoencode.py); the same against kube-apiserver: tests/upstream/test_protobuf_slices.py."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from bench import fleet_bench
from bench.fleet_upstream_bench import CLAIMS, claim, fleet
from dra_driver.defaults import DRIVER_NAME
from dra_driver.k8s import sliceproto
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.deviceclasses import device_classes
from tests.kube.protoencode import slice_list

RESOURCE = "/apis/resource.k8s.io/v1"


@dataclass(frozen=True)
class Proxied:
    direct: Path  # kubeconfig of the sandbox API server
    proxied: Path  # kubeconfig of the proxy that answers the slices' LIST in protobuf
    answered: list[str]  # per slices LIST through the proxy: "protobuf" or "json"


def _proxy(upstream: str, answered: list[str]) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            request = urllib.request.Request(upstream + self.path, headers={"Accept": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    status, body = response.status, response.read()
            except urllib.error.HTTPError as exc:
                status, body = exc.code, exc.read()
            media = "application/json"
            path = urlsplit(self.path).path
            if (status == 200 and path == f"{RESOURCE}/resourceslices" and "watch=" not in self.path
                    and self.headers.get("Accept", "").startswith(sliceproto.MEDIA_TYPE)):
                listed = json.loads(body)
                meta = listed.get("metadata") or {}
                body = slice_list(listed.get("items") or [], continue_token=meta.get("continue") or "",
                                  resource_version=meta.get("resourceVersion") or "", strict=False)
                media = sliceproto.MEDIA_TYPE
            if path == f"{RESOURCE}/resourceslices":
                answered.append("protobuf" if media != "application/json" else "json")
            self.send_response(status)
            self.send_header("Content-Type", media)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    """A fleet of 12 nodes of bench/fleet_upstream_bench.py (the last one the only H200 node) and its claims."""
    with ApiServer(garbage_collection=False, kube_version="1.37.0") as srv, srv.rest() as rest:
        for cls in device_classes(DRIVER_NAME):
            rest.request("POST", f"{RESOURCE}/deviceclasses", body=cls)
        for name in CLAIMS:
            rest.request("POST", f"{RESOURCE}/namespaces/default/resourceclaims", body=claim(name))
        inventories = fleet_bench._inventories()
        for node in fleet(12):
            built = fleet_bench._node_slices(inventories, node.name, node.preset, node.salt)
            fleet_bench._publish_node(rest, node.name, node.preset, built)
        answered: list[str] = []
        proxy = _proxy(srv.url, answered)
        thread = threading.Thread(target=proxy.serve_forever, daemon=True)
        thread.start()
        try:
            tmp = tmp_path_factory.mktemp("explain-protobuf")
            direct = srv.write_kubeconfig(tmp / "direct")
            proxied = tmp / "proxied"
            doc = direct.read_text().replace(srv.url, f"http://127.0.0.1:{proxy.server_address[1]}")
            proxied.write_text(doc)
            yield Proxied(direct, proxied, answered)
        finally:
            proxy.shutdown()
            proxy.server_close()


def _cli(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dra_driver.cli", *args, "--kubeconfig", str(kubeconfig)],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("name", list(CLAIMS))
def test_explain_answers_the_same_from_protobuf_as_from_json(cluster: Proxied, name: str) -> None:
    ref = f"default/{claim(name)['metadata']['name']}"
    before = len(cluster.answered)
    from_protobuf = _cli(cluster.proxied, "explain", ref)
    assert cluster.answered[before:] and set(cluster.answered[before:]) == {"protobuf"}
    from_json = _cli(cluster.direct, "explain", ref)
    asked_json = _cli(cluster.proxied, "explain", ref, "--no-protobuf")
    assert from_protobuf.returncode == CLAIMS[name], from_protobuf.stderr
    assert (from_protobuf.returncode, from_protobuf.stdout) == (from_json.returncode, from_json.stdout)
    assert (asked_json.returncode, asked_json.stdout) == (from_json.returncode, from_json.stdout)
    assert set(cluster.answered[before:]) == {"protobuf", "json"}
    assert from_protobuf.stderr == from_json.stderr == ""


def test_status_answers_the_same_from_protobuf_as_from_json(cluster: Proxied) -> None:
    before = len(cluster.answered)
    from_protobuf = _cli(cluster.proxied, "status", "-o", "json")
    assert cluster.answered[before:] and set(cluster.answered[before:]) == {"protobuf"}
    from_json = _cli(cluster.direct, "status", "-o", "json")
    asked_json = _cli(cluster.proxied, "status", "-o", "json", "--no-protobuf")
    assert from_protobuf.returncode == from_json.returncode == asked_json.returncode == 0, from_protobuf.stderr
    assert json.loads(from_protobuf.stdout) == json.loads(from_json.stdout) == json.loads(asked_json.stdout)
    assert cluster.answered[-1] == "json"
    assert len(json.loads(from_json.stdout)) == 12


def test_the_sandbox_answers_json_to_an_accept_that_lists_protobuf_first(cluster: Proxied) -> None:
    """The sandbox's gap (docs/sandbox.md "Fidelity"): kube-apiserver would answer protobuf; JSON, listed second,
    is what a server without protobuf for the resource answers, and the product reads it as such."""
    from dra_driver.k8s.client import connect
    from dra_driver.k8s.liststream import _get, stream_pages

    with connect(str(cluster.direct)) as rest:
        body = _get(rest, f"{RESOURCE}/resourceslices", {"limit": 2}, sliceproto.ACCEPT)
        assert body.startswith(b"{") and not sliceproto.is_protobuf(body)
        items = list(stream_pages(rest, f"{RESOURCE}/resourceslices", page=7))
    assert items and not any(item.protobuf for item in items)


def test_a_claim_the_sieve_cannot_judge_restarts_the_list_in_json(cluster: Proxied) -> None:
    """explain asks for the slices' pages in protobuf before it has read the claim (the LIST is started first); a
    claim whose reach does not prune (allocationMode All: pool problems fail it, so every pool is kept) would need
    every message converted whole, so the LIST starts over in JSON, with the same answer as from JSON alone."""
    from dra_driver.k8s.client import connect

    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "every-gpu", "namespace": "default"},
            "spec": {"devices": {"requests": [
                {"name": "gpus", "exactly": {"deviceClassName": DRIVER_NAME, "allocationMode": "All"}}]}}}
    with connect(str(cluster.direct)) as rest:
        rest.request("POST", f"{RESOURCE}/namespaces/default/resourceclaims", body=body)
    try:
        before = len(cluster.answered)
        proxied = _cli(cluster.proxied, "explain", "default/every-gpu")
        answered = cluster.answered[before:]
        direct = _cli(cluster.direct, "explain", "default/every-gpu")
    finally:
        with connect(str(cluster.direct)) as rest:
            rest.request("DELETE", f"{RESOURCE}/namespaces/default/resourceclaims/every-gpu")
    assert proxied.stderr == direct.stderr == ""
    assert (proxied.returncode, proxied.stdout) == (direct.returncode, direct.stdout)
    assert "fits on" in proxied.stdout
    # The protobuf LIST was started (at most a page or two fetched before the claim was judged, none where it was
    # closed before its thread ran; the proxy records concurrent requests in either order), then read in JSON.
    assert answered and set(answered) <= {"protobuf", "json"} and answered.count("json") >= 1
    assert answered.count("protobuf") <= 3, answered
