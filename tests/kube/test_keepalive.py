"""The transport's kept-alive connections (`transport.KeepAlivePool`, over its own HTTP/1.1 exchange) against a real
local HTTP(S) server (`scriptedserver.py`): connections reused and bounded, a kept-alive connection the server
dropped (repeated on a new connection only where the request cannot act twice), 429/503 with Retry-After handled as
urllib3 handled them (each such test runs over both ways of the transport), TLS with a self-signed CA, client
certificates, tokens re-read, timeouts, concurrent callers and no connection left open. Then the exchange itself
against a server that writes given bytes: RFC 9112's body rules (chunked, HEAD, 204, 304, 1xx, HTTP/1.0, read to
the close), the answers it refuses, and the requests it will not write."""

from __future__ import annotations

import http.client
import io
import json
import os
import re
import socket
import string
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import urllib3
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_driver.k8s import transport as transport_module
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_driver.k8s.kubeconfig import ApiConnection
from dra_driver.k8s.transport import (
    IDLE_TIMEOUT_S,
    Answer,
    ConnectionAuth,
    HttpTransport,
    KeepAlivePool,
    connection_pool,
)
from tests.kube.scriptedserver import CLOSE, HOLD, RESET, VANISH, RawServer, Script, Status, raw_server, scripted_server
from tests.kube.tlsserver import Pki, make_pki
from tests.polling import wait_for

MERGE = "application/merge-patch+json"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def served() -> Iterator[tuple[str, Script]]:
    with scripted_server() as found:
        yield found


def rest_over(url: str, way: str, *, maxsize: int = 8, timeout: float = 10.0) -> KubeRest:
    """A client over the keep-alive pool (the product's way) or over urllib3 alone (the way before it)."""
    connection = ApiConnection(server=url, token="t-1")
    if way == "keepalive":
        return KubeRest(HttpTransport.for_connection(connection, environ={}, maxsize=maxsize), timeout)
    pool = connection_pool(connection, environ={}, maxsize=maxsize)
    return KubeRest(HttpTransport(url, pool, ConnectionAuth(connection)), timeout)


def keepalive_of(rest: KubeRest) -> KeepAlivePool:
    pool = rest.transport.keepalive
    assert pool is not None
    return pool


def get(rest: KubeRest, path: str) -> JsonObject:
    return rest.request("GET", path)


def patch(rest: KubeRest, path: str = "/claims/a") -> Any:
    return rest.request("PATCH", path, body={"status": {"devices": []}}, content_type=MERGE)


def test_requests_share_one_kept_alive_connection(served: tuple[str, Script]) -> None:
    url, script = served
    with rest_over(url, "keepalive") as rest:
        answers = [rest.request("GET", "/a", query={"q": "1"}), patch(rest), get(rest, "/b")]
        assert answers[0]["path"] == "/a?q=1" and answers[1]["body"] == '{"status":{"devices":[]}}'
        assert {a["connection"] for a in answers} == {1} and script.opened == 1
        assert all(a["authorization"] == "Bearer t-1" for a in answers)
        assert keepalive_of(rest).idle() == 1 and keepalive_of(rest).opened == 1
    wait_for(lambda: script.open_now() == 0, 5, "close to end the kept-alive connection")


def test_a_server_url_with_a_path_prefixes_every_request(served: tuple[str, Script]) -> None:
    url, _script = served
    with KubeRest(ApiConnection(server=url + "/k8s/clusters/c-1/")) as rest:
        assert rest.request("GET", "/version")["path"] == "/k8s/clusters/c-1/version"
        assert rest.transport.keepalive is not None


def test_an_idle_connection_the_server_closed_is_not_used_for_a_patch(served: tuple[str, Script]) -> None:
    """The server closes its idle kept-alive connection (its keep-alive timeout): the next PATCH, which must not
    be sent twice, goes out once on a new connection."""
    url, script = served
    with rest_over(url, "keepalive") as rest:
        assert get(rest, "/a")["connection"] == 1
        script.drop_all()
        wait_for(lambda: script.open_now() == 0, 5, "the server to close its connection")
        assert patch(rest)["connection"] == 2
    assert [(s.connection, s.method) for s in script.seen] == [(1, "GET"), (2, "PATCH")]


def test_an_idle_connection_the_server_closed_reads_as_dropped(served: tuple[str, Script]) -> None:
    url, script = served
    pool = KeepAlivePool("http", "127.0.0.1", int(url.rsplit(":", 1)[1]))
    pool.request("GET", "/a", headers={}, body=None, timeout=5)
    (conn, _, _), = pool._idle
    assert not transport_module._dropped(conn)
    script.drop_all()
    wait_for(lambda: transport_module._dropped(conn), 5, "the closed connection to read as dropped")
    assert json.loads(pool.request("GET", "/b", headers={}, body=None, timeout=5).data)["connection"] == 2
    assert [s.connection for s in script.seen] == [1, 2]  # the closed one was not tried
    pool.close()


@pytest.mark.parametrize("way", ["keepalive", "urllib3"])
@pytest.mark.parametrize("fault", [VANISH, RESET])
def test_a_get_the_connection_dropped_is_sent_again(served: tuple[str, Script], way: str, fault: str) -> None:
    """The server closes (or resets) the kept-alive connection as the request arrives, unanswered: a GET cannot act
    twice and is sent again, on a new connection."""
    url, script = served
    with rest_over(url, way) as rest:
        get(rest, "/warm")
        script.steps.append(fault)
        assert get(rest, "/a")["path"] == "/a"
    assert [s.path for s in script.seen] == ["/warm", "/a", "/a"]
    assert script.seen[2].connection != script.seen[1].connection


@pytest.mark.parametrize("way", ["keepalive", "urllib3"])
def test_a_patch_written_but_unanswered_is_not_sent_again(served: tuple[str, Script], way: str) -> None:
    """The server may have acted on a PATCH it read: the caller gets the failure (status 0), the server saw it once."""
    url, script = served
    with rest_over(url, way) as rest:
        get(rest, "/warm")
        script.steps.append(VANISH)
        with pytest.raises(ApiError) as err:
            patch(rest)
        assert err.value.status == 0 and "PATCH /claims/a" in str(err.value)
        assert patch(rest)["method"] == "PATCH"  # the next request opens a new connection
    assert [s.method for s in script.seen] == ["GET", "PATCH", "PATCH"]


@pytest.mark.parametrize("size", [10, 300_000])
def test_a_request_with_a_body_is_one_write(
    served: tuple[str, Script], monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """The header block and the body go in one `sendall` (no other write), and arrive whole."""
    url, script = served
    writes: list[bytes] = []
    real_sendall, real_send = socket.socket.sendall, socket.socket.send
    client: list[socket.socket] = []  # the client's socket (the server's writes, in this process too, are not counted)

    def recorded_sendall(sock: socket.socket, data: Any, *args: Any) -> None:
        if sock in client:
            writes.append(bytes(data))
        real_sendall(sock, data, *args)

    def recorded_send(sock: socket.socket, data: Any, *args: Any) -> int:
        if sock in client:
            writes.append(bytes(data))
        return real_send(sock, data, *args)

    value = "x" * size
    with rest_over(url, "keepalive") as rest:
        get(rest, "/warm")  # connected before the writes are counted
        (conn, _, _), = keepalive_of(rest)._idle
        assert conn.sock is not None
        client.append(conn.sock)
        monkeypatch.setattr(socket.socket, "sendall", recorded_sendall)
        monkeypatch.setattr(socket.socket, "send", recorded_send)
        answer = rest.request("PATCH", "/claims/a", body={"v": value}, content_type=MERGE)
        encoded = json.dumps({"v": value}, separators=(",", ":")).encode()
        assert answer["body"] == encoded.decode() == script.seen[1].body.decode()
        assert len(writes) == 1 and writes[0].startswith(b"PATCH /claims/a HTTP/1.1\r\n")
        assert writes[0].endswith(b"\r\nContent-Length: %d\r\n\r\n" % len(encoded) + encoded)
        writes.clear()
        assert get(rest, "/b")["path"] == "/b"  # no body: the header block alone, no Content-Length
        assert len(writes) == 1 and writes[0].endswith(b"\r\n\r\n") and b"Content-Length" not in writes[0]


def test_a_patch_that_could_not_be_written_goes_out_once_on_a_new_connection(
    served: tuple[str, Script], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kept-alive connection cannot carry the request (here its sending side is shut, as one the server
    reset whose RST came after the idle check): the server never had the PATCH, so it is sent on a new
    connection, once."""
    url, script = served
    with rest_over(url, "keepalive") as rest:
        get(rest, "/warm")
        pool = keepalive_of(rest)
        (conn, _, _), = pool._idle
        assert conn.sock is not None
        conn.sock.shutdown(socket.SHUT_WR)
        monkeypatch.setattr(transport_module, "_dropped", lambda conn: False)  # the check ran before the close
        assert patch(rest)["connection"] == 2
    assert [(s.connection, s.method) for s in script.seen] == [(1, "GET"), (2, "PATCH")]


def test_a_get_is_sent_again_once_only(served: tuple[str, Script]) -> None:
    url, script = served
    with rest_over(url, "keepalive") as rest:
        get(rest, "/warm")
        script.steps += [VANISH, VANISH]
        with pytest.raises(ApiError) as err:
            get(rest, "/a")
        assert err.value.status == 0
    assert [s.path for s in script.seen] == ["/warm", "/a", "/a"]


@pytest.mark.parametrize("way", ["keepalive", "urllib3"])
@pytest.mark.parametrize("code", [429, 503])
def test_retry_after_on_a_get_waits_and_repeats_it(served: tuple[str, Script], way: str, code: int) -> None:
    url, script = served
    script.steps += [Status(code, "0"), Status(code, "0"), Status(code, "0")]
    with rest_over(url, way) as rest:
        assert get(rest, "/a")["path"] == "/a"
    assert len(script.seen) == 4


@pytest.mark.parametrize("way", ["keepalive", "urllib3"])
def test_retry_after_four_times_is_the_answer(served: tuple[str, Script], way: str) -> None:
    """As urllib3's default Retry: three repeats, then the fourth answer as it is."""
    url, script = served
    script.steps += [Status(503, "0")] * 4
    with rest_over(url, way) as rest:
        with pytest.raises(ApiError) as err:
            get(rest, "/a")
        assert err.value.status == 503
    assert len(script.seen) == 4


@pytest.mark.parametrize("way", ["keepalive", "urllib3"])
def test_what_is_not_repeated_for_retry_after(served: tuple[str, Script], way: str) -> None:
    """A PATCH answered 429 with Retry-After (not idempotent), a GET answered 503 without it or 500 with it: the
    answer as it is."""
    url, script = served
    script.steps += [Status(429, "0"), Status(503), Status(500, "0")]
    with rest_over(url, way) as rest:
        for expected, send in ((429, lambda: patch(rest)), (503, lambda: get(rest, "/a")), (500, lambda: get(rest, "/b"))):
            with pytest.raises(ApiError) as err:
                send()
            assert err.value.status == expected
    assert len(script.seen) == 3


def test_retry_after_seconds_are_waited(served: tuple[str, Script]) -> None:
    url, script = served
    waits: list[float] = []
    pool = KeepAlivePool("http", "127.0.0.1", int(url.rsplit(":", 1)[1]), sleep=waits.append)
    script.steps += [Status(429, "2"), Status(503, "1")]
    answer = pool.request("GET", "/a", headers={}, body=None, timeout=5)
    assert answer.status == 200 and waits == [2, 1]
    script.steps += [Status(503, "soon")]  # not a wait this client can read: the answer as it is
    assert pool.request("GET", "/a", headers={}, body=None, timeout=5).status == 503
    script.steps += [Status(503, "3")] * 4
    assert pool.request("GET", "/a", headers={}, body=None, timeout=5).status == 503
    assert waits == [2, 1, 3, 3, 3] and len(script.seen) == 3 + 1 + 4
    pool.close()


def test_retry_after_waits_with_the_default_clock(served: tuple[str, Script]) -> None:
    url, script = served
    script.steps.append(Status(429, "1"))
    with rest_over(url, "keepalive") as rest:
        started = time.monotonic()
        assert get(rest, "/a")["path"] == "/a"
        assert time.monotonic() - started >= 0.9


def test_a_timeout_fails_once_and_closes_its_connection(served: tuple[str, Script]) -> None:
    url, script = served
    script.steps.append(HOLD)
    with rest_over(url, "keepalive", timeout=0.3) as rest:
        started = time.monotonic()
        with pytest.raises(ApiError) as err:
            get(rest, "/slow")
        elapsed = time.monotonic() - started
        assert err.value.status == 0 and "timed out" in str(err.value) and elapsed < 3
        assert keepalive_of(rest).idle() == 0
        script.release.set()
        wait_for(lambda: script.open_now() == 0, 5, "the timed-out connection to be closed")
    assert [s.path for s in script.seen] == ["/slow"]  # not repeated


def test_an_answer_that_closes_the_connection_is_not_kept(served: tuple[str, Script]) -> None:
    url, script = served
    script.steps.append(CLOSE)
    with rest_over(url, "keepalive") as rest:
        assert get(rest, "/a")["connection"] == 1
        assert keepalive_of(rest).idle() == 0
        assert get(rest, "/b")["connection"] == 2


def test_a_connection_idle_past_the_idle_timeout_is_closed_not_used(served: tuple[str, Script]) -> None:
    url, script = served
    now = [1000.0]
    pool = KeepAlivePool("http", "127.0.0.1", int(url.rsplit(":", 1)[1]), clock=lambda: now[0])
    assert json.loads(pool.request("GET", "/a", headers={}, body=None, timeout=5).data)["connection"] == 1
    now[0] += IDLE_TIMEOUT_S - 1
    assert json.loads(pool.request("GET", "/b", headers={}, body=None, timeout=5).data)["connection"] == 1
    now[0] += IDLE_TIMEOUT_S
    assert json.loads(pool.request("GET", "/c", headers={}, body=None, timeout=5).data)["connection"] == 2
    wait_for(lambda: script.open_now() == 1, 5, "the expired connection to be closed")
    pool.close()
    wait_for(lambda: script.open_now() == 0, 5, "close to end the last connection")


def test_concurrent_callers_get_their_own_answers_and_no_connection_is_left_open(
    served: tuple[str, Script], caplog: pytest.LogCaptureFixture
) -> None:
    """64 threads over a pool that keeps 8: every answer is the caller's own, the extra connections are closed when
    handed back, and at the end the server holds exactly the connections the pool keeps."""
    url, script = served
    rest = rest_over(url, "keepalive", maxsize=8)
    start = threading.Barrier(64)

    def calls(n: int) -> list[str]:
        start.wait(10)
        return [get(rest, f"/t{n}/{i}")["path"] for i in range(20)]

    with ThreadPoolExecutor(64) as threads:
        results = list(threads.map(calls, range(64)))
    assert results == [[f"/t{n}/{i}" for i in range(20)] for n in range(64)]
    pool = keepalive_of(rest)
    # (more than 64 opened when a caller found all 8 taken after its own was closed as beyond the 8)
    assert pool.idle() == 8 and len(script.seen) == 64 * 20 and script.opened == pool.opened
    wait_for(lambda: script.open_now() == 8, 5, "the connections beyond the 8 kept to be closed")
    rest.close()
    wait_for(lambda: script.open_now() == 0, 5, "close to end the kept connections")
    assert get(rest, "/after")["connection"] == script.opened  # a later request opens a new one


def test_64_callers_keep_their_connections_in_the_default_pool(
    served: tuple[str, Script], caplog: pytest.LogCaptureFixture
) -> None:
    """The plugin's 64 gRPC workers each GET their claim: the default pool keeps every connection for the next
    wave (none closed as "full")."""
    url, script = served
    rest = KubeRest(ApiConnection(server=url))
    start = threading.Barrier(64)

    def claim(_: int) -> JsonObject:
        start.wait(10)
        return get(rest, "/claim")

    with caplog.at_level("WARNING", logger="dra_driver.k8s.transport"), ThreadPoolExecutor(64) as threads:
        for _ in range(3):
            assert all(r["path"] == "/claim" for r in threads.map(claim, range(64)))
    assert not [r for r in caplog.records if "full" in r.getMessage()]
    assert script.opened <= 64 and keepalive_of(rest).idle() == script.opened
    rest.close()


def test_close_while_a_request_is_in_flight_closes_its_connection_when_it_is_done(served: tuple[str, Script]) -> None:
    url, script = served
    rest = rest_over(url, "keepalive")
    script.steps.append(HOLD)
    with ThreadPoolExecutor(1) as thread:
        pending = thread.submit(get, rest, "/held")
        assert script.held.wait(5)
        rest.close()
        script.release.set()
        assert pending.result(10)["path"] == "/held"
    assert keepalive_of(rest).idle() == 0
    wait_for(lambda: script.open_now() == 0, 5, "the in-flight connection to be closed")


def test_streams_still_go_through_urllib3(served: tuple[str, Script]) -> None:
    url, _script = served
    with rest_over(url, "keepalive") as rest:
        response = rest.send_streaming("GET", "/stream")
        try:
            assert json.loads(response.read())["path"] == "/stream"
        finally:
            response.release_conn()
        assert keepalive_of(rest).opened == 0  # the keep-alive pool was not used


# TLS


def tls_connection(url: str, pki: Pki, **fields: Any) -> ApiConnection:
    """The server at `url`, verified with `pki`'s CA (the cluster CA of a kubeconfig or a service account)."""
    return ApiConnection(server=url, ca_file=str(pki.path("ca.crt")), **fields)


def tls_rest(url: str, pki: Pki, **fields: Any) -> KubeRest:
    return KubeRest(HttpTransport.for_connection(tls_connection(url, pki, **fields), environ={}))


def test_tls_with_the_cluster_ca_a_client_certificate_and_one_connection(pki: Pki) -> None:
    with scripted_server(pki) as (url, _script):
        connection = tls_connection(
            url, pki, cert_file=str(pki.path("client.crt")), key_file=str(pki.path("client.key"))
        )
        with KubeRest(HttpTransport.for_connection(connection, environ={})) as rest:
            answers = [get(rest, "/a"), patch(rest), get(rest, "/b")]
            assert {a["client"] for a in answers} == {"node-agent"} and {a["connection"] for a in answers} == {1}
            assert all(a["authorization"] is None for a in answers)
            assert keepalive_of(rest).opened == 1


def test_tls_refuses_a_server_its_ca_did_not_sign(tmp_path: Path, pki: Pki) -> None:
    other = make_pki(tmp_path / "other")
    with scripted_server(pki) as (url, script), tls_rest(url, other) as rest:
        with pytest.raises(ApiError) as err:
            get(rest, "/a")
        assert err.value.status == 0 and "CERTIFICATE_VERIFY_FAILED" in str(err.value)
    assert script.seen == []


def test_tls_server_name_is_the_name_verified(pki: Pki) -> None:
    """The certificate names 127.0.0.1 and kube.test: `tls-server-name: kube.test` passes, another name fails."""
    with scripted_server(pki) as (url, script):
        good = tls_connection(url, pki, tls_server_name="kube.test", token="t")
        with KubeRest(HttpTransport.for_connection(good, environ={})) as rest:
            assert get(rest, "/a")["authorization"] == "Bearer t"
        bad = tls_connection(url, pki, tls_server_name="other.test")
        with KubeRest(HttpTransport.for_connection(bad, environ={})) as rest:
            with pytest.raises(ApiError) as err:
                get(rest, "/a")
            assert "CERTIFICATE_VERIFY_FAILED" in str(err.value) or "match" in str(err.value)
    assert len(script.seen) == 1


def test_insecure_skips_verification(tmp_path: Path, pki: Pki) -> None:
    with scripted_server(pki) as (url, _script):
        connection = ApiConnection(server=url, insecure=True)
        with KubeRest(HttpTransport.for_connection(connection, environ={})) as rest:
            assert get(rest, "/a")["path"] == "/a"


def test_a_rotated_token_file_is_sent_on_the_same_kept_alive_connection(tmp_path: Path, pki: Pki) -> None:
    """The kubelet swaps a projected token's file (a new inode): the next request carries the new token, over the
    connection already open."""
    token = tmp_path / "token"
    token.write_text("first\n")
    with scripted_server(pki) as (url, _script):
        connection = tls_connection(url, pki, token_file=str(token))
        with KubeRest(HttpTransport.for_connection(connection, environ={})) as rest:
            assert get(rest, "/a")["authorization"] == "Bearer first"
            fresh = tmp_path / "token.new"
            fresh.write_text("second\n")
            os.replace(fresh, token)
            answer = get(rest, "/b")
            assert answer["authorization"] == "Bearer second" and answer["connection"] == 1


def test_a_dropped_tls_connection_is_replaced(pki: Pki) -> None:
    with scripted_server(pki) as (url, script), tls_rest(url, pki) as rest:
        assert get(rest, "/a")["connection"] == 1
        script.steps.append(VANISH)
        assert get(rest, "/b")["connection"] == 2  # the GET sent again on a new connection
        script.drop_all()
        wait_for(lambda: script.open_now() == 0, 5, "the server to close its connection")
        assert patch(rest)["connection"] == 3
    assert [s.method for s in script.seen] == ["GET", "GET", "GET", "PATCH"]


# The exchange itself (RFC 9112), against a server that writes given bytes


def over(server: RawServer, method: str = "GET", timeout: float = 5, **headers: str) -> tuple[Answer, int]:
    """One request on a pool of its own: the answer, and the connections the pool kept after it."""
    pool = KeepAlivePool("http", "127.0.0.1", server.port)
    try:
        answer = pool.request(method, "/x", headers=headers, body=None, timeout=timeout)
        return answer, pool.idle()
    finally:
        pool.close()


JSON_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@pytest.mark.parametrize(
    ("method", "written", "expected", "kept"),
    [
        ("GET", JSON_OK, (200, "OK", b"{}"), True),
        ("GET", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
         (200, "OK", b"abcde"), True),
        ("GET", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\nA \r\n0123456789\r\n0\r\nX-T: 1\r\nY: 2\r\n\r\n",
         (200, "OK", b"0123456789"), True),  # BWS after the size; trailer fields skipped
        ("HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", (200, "OK", b""), True),
        ("GET", b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", (204, "No Content", b""), True),
        ("GET", b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n", (304, "Not Modified", b""), True),
        ("GET", b"HTTP/1.1 100 Continue\r\nX: y\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + JSON_OK,
         (200, "OK", b"{}"), True),  # interim answers skipped
        ("GET", (b"HTTP/1.0 200 OK\r\n\r\nuntil close", True), (200, "OK", b"until close"), False),
        ("GET", (b"HTTP/1.1 200 OK\r\n\r\nuntil close", True), (200, "OK", b"until close"), False),
        ("GET", b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok", (200, "OK", b"ok"), True),
        ("GET", b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", (200, "OK", b"ok"), False),
        ("GET", b"HTTP/1.1 200 OK\r\nConnection: Upgrade, Close\r\nContent-Length: 2\r\n\r\nok", (200, "OK", b"ok"),
         False),
        ("GET", b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", (200, "OK", b"ok"), True),  # LF line ends
        ("GET", b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", (200, "", b""), True),  # no reason
        ("GET", b"HTTP/1.1 404 Not  Found \r\nContent-Length: 2, 2\r\n\r\nno", (404, "Not  Found", b"no"), True),
        ("GET", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA", (200, "OK", b"ok"), False),  # unasked bytes
    ],
)
def test_the_body_rules(method: str, written: bytes | tuple[bytes, bool], expected: tuple[int, str, bytes],
                        kept: bool) -> None:
    with raw_server() as server:
        server.answers.append(written)
        answer, idle = over(server, method)
        assert (answer.status, answer.reason, answer.data) == expected
        assert idle == (1 if kept else 0)
    assert len(server.received) == 1


def test_a_large_body_in_many_reads_and_many_chunks() -> None:
    body = bytes(range(256)) * 4096  # 1 MiB
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:70_000], body[70_000:], b""))
    with raw_server() as server:
        server.answers += [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
                           b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked]
        pool = KeepAlivePool("http", "127.0.0.1", server.port)
        assert pool.request("GET", "/a", headers={}, body=None, timeout=5).data == body
        assert pool.request("GET", "/b", headers={}, body=None, timeout=5).data == body
        assert pool.opened == 1 and pool.idle() == 1
        pool.close()


def test_header_fields_by_name_in_order_and_joined() -> None:
    written = (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Dup: 1\r\nx-dup: 2\r\nX-Empty:\r\nX-Spaces: \t a b \t\r\n"
               b"Folded: a\r\n  b\r\nX-Latin: caf\xe9\r\n\r\n")
    with raw_server() as server:
        server.answers.append(written)
        headers = over(server)[0].headers
    assert headers.get("X-DUP") == headers["x-dup"] == "1, 2" and "x-empty" in headers and "nope" not in headers
    assert headers.get("X-Empty") == "" and headers.get("x-spaces") == "a b" and headers.get("folded") == "a b"
    assert headers.get("missing") is None and headers.get("missing", "d") == "d"
    assert headers.items() == [("Content-Length", "0"), ("X-Dup", "1"), ("x-dup", "2"), ("X-Empty", ""),
                               ("X-Spaces", "a b"), ("Folded", "a b"), ("X-Latin", "café")]


_NAME = st.text(alphabet=string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~", min_size=1, max_size=12)
_VALUE = st.text(alphabet=string.ascii_letters + string.digits + string.punctuation + " \t\xe9", max_size=20).map(
    lambda value: value.strip(" \t"))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_NAME, _VALUE), max_size=8))
def test_well_formed_fields_read_as_the_stdlib_reads_them(fields: list[tuple[str, str]]) -> None:
    """Held to another reader of the same RFC (http.client's) on what both must agree on."""
    block = b"".join(f"{name}: {value}".encode("iso-8859-1") + b"\r\n" for name, value in fields)
    ours = transport_module.parse_fields(block.decode("iso-8859-1"))
    assert ours.items() == http.client.parse_headers(io.BytesIO(block + b"\r\n")).items() == fields


LONG = b"X-Long: " + b"v" * (65536 - len(b"X-Long: \r\n")) + b"\r\n"  # 65,536 bytes with its line end: the limit


@pytest.mark.parametrize(
    ("written", "says"),
    [
        (b"HTTP/1.1 200 OK\r\n" + LONG[:-2] + b"v\r\nContent-Length: 0\r\n\r\n", "longer than 65536"),
        (b"HTTP/1.1 200 OK\r\n" + LONG[:-2] + b"v" * 70_000, "longer than 65536"),  # no line end in sight
        (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 100 + b"Content-Length: 0\r\n\r\n", "more than 100 header fields"),
        (b"HTTP/2 200 OK\r\nContent-Length: 0\r\n\r\n", "status line"),
        (b"HTTP/1.2 200 OK\r\nContent-Length: 0\r\n\r\n", "status line"),
        (b"ICY 200 OK\r\nContent-Length: 0\r\n\r\n", "status line"),
        (b"HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n", "status line"),
        (b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n", "status line"),
        (b"\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "status line"),
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", "101"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nab\r\n0\r\n\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-2\r\nab\r\n0\r\n\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\nab\r\n0\r\n\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1" + b"0" * 16 + b"\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n", "line end after a chunk"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", "Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n0\r\n\r\n", "both"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\nabc", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nab", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\nab", "Content-Length"),  # a digit, not an ASCII one
        (b"HTTP/1.1 200 OK\r\nNo colon here\r\nContent-Length: 0\r\n\r\n", "not a header field line"),
        (b"HTTP/1.1 200 OK\r\nBad Name: v\r\nContent-Length: 0\r\n\r\n", "not a header field line"),
        (b"HTTP/1.1 200 OK\r\nX : v\r\nContent-Length: 0\r\n\r\n", "not a header field line"),
        (b"HTTP/1.1 200 OK\r\n:v\r\nContent-Length: 0\r\n\r\n", "not a header field line"),
        (b"HTTP/1.1 200 OK\r\nX: a\rb\r\nContent-Length: 0\r\n\r\n", "not a header field line"),  # a bare CR
        (b"HTTP/1.1 200 OK\r\nX: a\x00b\r\nContent-Length: 0\r\n\r\n", "not a header field line"),
        (b"HTTP/1.1 200 OK\r\n Folded: first\r\nContent-Length: 0\r\n\r\n", "not a header field line"),
    ],
)
def test_answers_refused(written: bytes, says: str) -> None:
    """Each is urllib3's ProtocolError naming what is wrong; a GET is tried once more on a new connection (the same
    answer again: then the error), and the connection is closed, not kept."""
    with raw_server() as server:
        server.answers += [(written, True), (written, True)]
        with pytest.raises(urllib3.exceptions.ProtocolError) as err:
            over(server)
        assert says in str(err.value.args[1])
    assert len(server.received) == 2


def test_a_header_line_of_the_limit_and_100_fields_are_read() -> None:
    written = b"HTTP/1.1 200 OK\r\n" + LONG + b"X: y\r\n" * 98 + b"Content-Length: 0\r\n\r\n"
    with raw_server() as server:
        server.answers.append(written)
        answer = over(server)[0]
    assert len(answer.headers.items()) == 100 and len(answer.headers["x-long"]) == 65536 - len(b"X-Long: \r\n")


@pytest.mark.parametrize(
    ("written", "says"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabcde", "5 bytes before the body's end"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", "the body's end"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n", "inside a chunked body"),
        (b"HTTP/1.1 200 OK\r\nContent-Le", "inside the answer's head"),
    ],
)
def test_an_answer_cut_short_is_an_error(written: bytes, says: str) -> None:
    """The connection closes before the answer's end: not an answer (the part read is not returned)."""
    with raw_server() as server:
        server.answers += [(written, True), (written, True)]
        with pytest.raises(urllib3.exceptions.ProtocolError) as err:
            over(server)
        assert says in str(err.value.args[1])


def test_a_connection_closed_before_the_answer_is_an_oserror() -> None:
    with raw_server() as server:
        server.answers += [(b"", True), (b"", True)]
        with pytest.raises(ConnectionResetError, match="without an answer"):
            over(server)
    assert len(server.received) == 2


def test_a_body_that_stops_coming_times_out_within_the_attempts_deadline() -> None:
    """One deadline for the whole attempt: the head came, the body stops (the connection stays open); not
    repeated."""
    with raw_server() as server:
        server.answers.append(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            over(server, timeout=0.3)
        assert time.monotonic() - started < 3
    assert len(server.received) == 1


def test_the_request_as_written() -> None:
    """The request line, Host (with the port), Accept-Encoding: identity, the caller's headers in order; a PATCH's
    body with its Content-Length, a POST without one with Content-Length: 0."""
    with raw_server() as server:
        server.answers += [JSON_OK, JSON_OK, JSON_OK]
        pool = KeepAlivePool("http", "127.0.0.1", server.port)
        pool.request("GET", "/a?b=c", headers={"Accept": "application/json", "X-Y": "z"}, body=None, timeout=5)
        pool.request("PATCH", "/p", headers={"Content-Type": MERGE}, body=b'{"a":1}', timeout=5)
        pool.request("POST", "/q", headers={}, body=None, timeout=5)
        pool.close()
    host = b"Host: 127.0.0.1:%d\r\n" % server.port
    assert server.received == [
        b"GET /a?b=c HTTP/1.1\r\n" + host + b"Accept-Encoding: identity\r\nAccept: application/json\r\nX-Y: z\r\n\r\n",
        b"PATCH /p HTTP/1.1\r\n" + host + b"Accept-Encoding: identity\r\nContent-Type: " + MERGE.encode()
        + b"\r\nContent-Length: 7\r\n\r\n" + b'{"a":1}',
        b"POST /q HTTP/1.1\r\n" + host + b"Accept-Encoding: identity\r\nContent-Length: 0\r\n\r\n",
    ]


@pytest.mark.parametrize(
    ("host", "port", "default", "authority"),
    [("127.0.0.1", 6443, 443, "127.0.0.1:6443"), ("kube.test", None, 443, "kube.test"),
     ("kube.test", 443, 443, "kube.test"), ("::1", 6443, 443, "[::1]:6443"), ("bücher.test", 80, 80, "xn--bcher-kva.test")],
)
def test_the_host_header(host: str, port: int | None, default: int, authority: str) -> None:
    assert transport_module._authority(host, port, default) == authority


@pytest.mark.parametrize(
    ("target", "headers", "says"),
    [
        ("/a", {"X-Token": "t\r\nX-Admin: yes"}, "header 'X-Token'"),
        ("/a", {"Authorization": "Bearer t\nGET /b HTTP/1.1"}, "header 'Authorization'"),
        ("/a", {"X-Cr": "a\rb"}, "header 'X-Cr'"),
        ("/a", {"X-Nul": "a\x00b"}, "header 'X-Nul'"),
        ("/a", {"X-Wide": "\u2028"}, "header 'X-Wide'"),
        ("/a", {"X\r\nY": "v"}, "header name 'X\\r\\nY'"),
        ("/a", {"X Y": "v"}, "header name 'X Y'"),
        ("/a", {"X:Y": "v"}, "header name 'X:Y'"),
        ("/a HTTP/1.1\r\nX: y\r\n\r\nGET /b", {}, "request target"),
        ("/a b", {}, "request target"),
        ("/a\x00", {}, "request target"),
        ("/caf\xe9", {}, "request target"),
    ],
)
def test_a_request_that_would_smuggle_is_refused_unsent(target: str, headers: dict[str, str], says: str) -> None:
    with raw_server() as server:
        pool = KeepAlivePool("http", "127.0.0.1", server.port)
        with pytest.raises(ValueError, match=re.escape(says)):
            pool.request("GET", target, headers=headers, body=None, timeout=5)
        assert pool.opened == 0
    assert server.received == []


def test_a_method_that_is_not_a_token_is_refused() -> None:
    with pytest.raises(ValueError, match="method"):
        transport_module.request_bytes("GET /x HTTP/1.1\r\n", "/", "h", {}, None)
