"""`KubeRest` over the product's transport, against the sandbox API server: JSON in and out, errors as
ApiError (status 0 when the server is not reached), watches that another thread can close, and a pool wide
enough for the kubelet plugin's 64 concurrent prepares."""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from dra_driver.k8s.client import ApiError, JsonObject, KubeRest, encode_json
from dra_driver.k8s.kubeconfig import ApiConnection
from dra_sandbox.apiserver import ApiServer

CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


@pytest.fixture
def server() -> Iterator[ApiServer]:
    with ApiServer() as srv:
        yield srv


def configmap(name: str, **data: str) -> JsonObject:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def test_json_in_and_out_and_errors_carry_the_servers_answer(server: ApiServer) -> None:
    with server.rest() as rest:
        created = rest.request("POST", CONFIGMAPS, body=configmap("a", k="v"))
        assert created["metadata"]["name"] == "a" and created["data"] == {"k": "v"}
        patched = rest.request(
            "PATCH", f"{CONFIGMAPS}/a", body={"data": {"k2": "v2"}}, content_type="application/merge-patch+json"
        )
        assert patched["data"] == {"k": "v", "k2": "v2"}
        assert rest.get(f"{CONFIGMAPS}/a") == patched
        assert rest.get(f"{CONFIGMAPS}/missing") is None
        with pytest.raises(ApiError) as conflict:
            rest.request("POST", CONFIGMAPS, body=configmap("a"))
        assert conflict.value.status == 409 and "already exists" in str(conflict.value)
        listed = rest.request("GET", CONFIGMAPS, query={"fieldSelector": "metadata.name=a", "limit": 5})
        assert [item["metadata"]["name"] for item in listed["items"]] == ["a"]
        assert server.request_log.count(verb="create", resource="configmaps") == 2


def test_a_server_that_is_not_reached_is_status_0() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    rest = KubeRest(ApiConnection(server=f"http://127.0.0.1:{port}"), timeout=5)
    with pytest.raises(ApiError) as err:
        rest.get("/version")
    assert err.value.status == 0 and "GET /version" in str(err.value)
    with pytest.raises(ApiError) as watch_err:
        rest.watch(CONFIGMAPS)
    assert watch_err.value.status == 0


def test_a_watch_streams_events_and_another_thread_closes_it(server: ApiServer) -> None:
    rest = server.rest()
    stream = rest.watch(CONFIGMAPS, timeout_seconds=300)
    first = threading.Event()
    seen: list[JsonObject] = []
    failed: list[BaseException] = []

    def consume() -> None:
        try:
            for event in stream:
                seen.append(event)
                first.set()
        except BaseException as exc:  # the test asserts there was none
            failed.append(exc)

    thread = threading.Thread(target=consume)
    thread.start()
    rest.request("POST", CONFIGMAPS, body=configmap("w"))
    assert first.wait(10), "no watch event"
    stream.close()  # the consumer is blocked in a read; close ends it without an error
    thread.join(10)
    assert not thread.is_alive() and failed == []
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in seen] == [("ADDED", "w")]


def test_a_refused_watch_is_an_api_error(server: ApiServer) -> None:
    with pytest.raises(ApiError) as err:
        server.rest().watch("/apis/nothing.example.com/v1/things")
    assert err.value.status == 404


def test_64_concurrent_requests_keep_their_connections(server: ApiServer, caplog: pytest.LogCaptureFixture) -> None:
    """The plugin's 64 gRPC workers each GET their claim: the transport must not throw connections away ("pool is
    full") and open new ones for the next wave."""
    rest = server.rest()
    rest.request("POST", CONFIGMAPS, body=configmap("shared"))
    start = threading.Barrier(64)

    def get(_: int) -> Any:
        start.wait(10)
        return rest.get(f"{CONFIGMAPS}/shared")

    with caplog.at_level(logging.WARNING, logger="dra_driver.k8s.transport"), ThreadPoolExecutor(64) as pool:
        for _ in range(2):
            assert all(r is not None for r in pool.map(get, range(64)))
    assert not [r for r in caplog.records if "full" in r.getMessage()]
    keepalive = rest.transport.keepalive
    assert keepalive is not None and keepalive.idle() == keepalive.opened <= 64


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every GET with its own path as JSON, or a 307 to `redirect_to` for paths under /moved/."""

    redirect_to = ""
    seen: list[str] = []

    def do_GET(self) -> None:
        self.seen.append(self.path)
        if self.path.startswith("/moved/") and self.redirect_to:
            self.send_response(307)
            self.send_header("Location", self.redirect_to + self.path.removeprefix("/moved"))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


@contextlib.contextmanager
def _recording_server(redirect_to: str = "") -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []

    class Handler(_Recorder):
        pass

    Handler.redirect_to, Handler.seen = redirect_to, seen
    handler = Handler
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_server_url_with_a_path_keeps_it_and_a_redirect_to_another_host_is_followed() -> None:
    with _recording_server() as (target, target_seen), _recording_server(redirect_to=target) as (front, front_seen):
        with KubeRest(ApiConnection(server=front + "/k8s/clusters/c-1/")) as rest:
            assert rest.request("GET", "/version", query={"a": "b"}) == {"path": "/k8s/clusters/c-1/version?a=b"}
        with KubeRest(ApiConnection(server=front)) as rest:
            # The direct pool sees the 307 and asks again through the pool manager, which follows it to the other
            # host (as the transport did before it kept the one server's pool).
            assert rest.request("GET", "/moved/api/v1/pods") == {"path": "/api/v1/pods"}
            assert rest.request("GET", "/api/v1/nodes") == {"path": "/api/v1/nodes"}
    assert front_seen == ["/k8s/clusters/c-1/version?a=b", "/moved/api/v1/pods", "/moved/api/v1/pods", "/api/v1/nodes"]
    assert target_seen == ["/api/v1/pods"]


def test_streams_reuse_the_one_servers_urllib3_pool_and_close_drops_it() -> None:
    """Streamed answers go over urllib3 (answers read whole over the keep-alive pool: test_keepalive.py)."""

    def streamed(rest: KubeRest) -> Any:
        response = rest.send_streaming("GET", "/version")
        try:
            return json.loads(response.read())
        finally:
            response.release_conn()

    with _recording_server() as (url, seen), KubeRest(ApiConnection(server=url)) as rest:
        for _ in range(3):
            assert streamed(rest) == {"path": "/version"}
        direct = rest.transport._direct
        assert direct is not None and direct.num_requests == 3
        rest.close()
        assert rest.transport._direct is None
        assert streamed(rest) == {"path": "/version"}  # a later request opens a new pool
        assert rest.transport._direct is not direct and len(seen) == 4
        assert rest.transport.keepalive is not None and rest.transport.keepalive.opened == 0


def test_bodies_go_on_the_wire_as_gos_encoding_json_writes_them() -> None:
    """kube-apiserver keeps an opaque config's `parameters` as the bytes sent and re-encodes them the Go way on
    every patch: bytes Go would write differently (spaces, an unescaped `<`) later read as a change of
    `status.allocation` and a status write is refused (tests/upstream/test_controlplane.py proves it)."""
    body = {"spec": {"parameters": {"kind": "GpuConfig", "apiVersion": "gpu.dra.dev/v1beta1",
                                    "note": "a<b>&c \u2028 é", "n": [1, 2.5, None, True]}}}
    # What Go's json.Marshal writes for the same map in this order (keys as given: RawExtension keeps them).
    go = ('{"spec":{"parameters":{"kind":"GpuConfig","apiVersion":"gpu.dra.dev/v1beta1",'
          '"note":"a\\u003cb\\u003e\\u0026c \\u2028 é","n":[1,2.5,null,true]}}}').encode()
    assert encode_json(body) == go
    bodies: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_PATCH(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, format: str, *args: Any) -> None:
            return

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        with KubeRest(ApiConnection(server=f"http://127.0.0.1:{httpd.server_address[1]}")) as rest:
            rest.request("PATCH", "/x", body=body, content_type="application/merge-patch+json")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert bodies == [go]
