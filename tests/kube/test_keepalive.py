"""The transport's kept-alive `http.client` connections (`transport.KeepAlivePool`) against a real local HTTP(S)
server (`scriptedserver.py`): connections reused and bounded, a kept-alive connection the server dropped (repeated
on a new connection only where the request cannot act twice), 429/503 with Retry-After handled as urllib3 handled
them (each such test runs over both ways of the transport), TLS with a self-signed CA, client certificates, tokens
re-read, timeouts, concurrent callers and no connection left open."""

from __future__ import annotations

import hashlib
import http.client
import inspect
import io
import json
import os
import socket
import string
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_driver.k8s import transport as transport_module
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_driver.k8s.kubeconfig import ApiConnection
from dra_driver.k8s.transport import (
    IDLE_TIMEOUT_S,
    ConnectionAuth,
    HttpTransport,
    KeepAlivePool,
    connection_pool,
)
from tests.kube.scriptedserver import CLOSE, HOLD, RESET, VANISH, Script, Status, scripted_server
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
    """The header block and the body go in one `send` (the stdlib's two: headers, then body), and arrive whole."""
    url, script = served
    writes: list[bytes] = []
    stdlib_send = http.client.HTTPConnection.send

    def recorded(conn: http.client.HTTPConnection, data: Any) -> None:
        writes.append(bytes(data))
        stdlib_send(conn, data)

    monkeypatch.setattr(http.client.HTTPConnection, "send", recorded)
    value = "x" * size
    with rest_over(url, "keepalive") as rest:
        answer = rest.request("PATCH", "/claims/a", body={"v": value}, content_type=MERGE)
        assert answer["body"] == json.dumps({"v": value}, separators=(",", ":")) == script.seen[0].body.decode()
        assert len(writes) == 1 and writes[0].startswith(b"PATCH /claims/a HTTP/1.1\r\n")
        assert writes[0].endswith(b"\r\n\r\n" + json.dumps({"v": value}, separators=(",", ":")).encode())
        writes.clear()
        assert get(rest, "/b")["path"] == "/b"  # no body: the header block alone, as before
        assert len(writes) == 1 and writes[0].endswith(b"\r\n\r\n")


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


# The answer's header block


def stdlib_parse(block: bytes) -> list[tuple[str, str]]:
    return http.client.parse_headers(io.BytesIO(block + b"\r\n")).items()


@pytest.mark.parametrize(
    "block",
    [
        b"Content-Type: application/json\r\nContent-Length: 739\r\nAudit-Id: 4f6c\r\n",
        b"X-Empty:\r\nX-Spaces:   a b  \r\nx-lower: v\r\nX-Dup: 1\r\nX-Dup: 2\r\n",
        b"Bare-Newline: v\nX: caf\xe9\r\n",  # LF only; a latin-1 byte
        b"Folded: a\r\n b\r\nNext: c\r\n",  # obs-fold: the stdlib's parser
        b"No colon here\r\nX: y\r\n",
        b"Bad Name: v\r\n",
        b"X: a\rb\r\n",  # a bare CR inside
        b":empty-name\r\n",
        b"",
    ],
)
def test_the_header_parse_equals_the_stdlibs(block: bytes) -> None:
    lines = block.splitlines(keepends=True)
    assert transport_module.parse_header_lines(lines).items() == stdlib_parse(block)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.text(alphabet=string.printable + "\xe9", max_size=12),
                          st.text(alphabet=string.printable + "\xe9", max_size=20)), max_size=6))
def test_the_header_parse_equals_the_stdlibs_for_any_block(fields: list[tuple[str, str]]) -> None:
    block = b"".join(f"{name}:{value}".encode("iso-8859-1") + b"\r\n" for name, value in fields)
    lines = []
    reader = io.BytesIO(block + b"\r\n")
    while (line := reader.readline()) not in (b"\r\n", b"\n", b""):
        lines.append(line)
    assert transport_module.parse_header_lines(lines).items() == stdlib_parse(block)


def test_the_stdlib_begin_is_the_one_the_response_copies() -> None:
    """`transport._Response.begin` is CPython 3.11's `HTTPResponse.begin` with the header parse replaced: another
    Python's begin must be compared with the copy (and this hash updated) before the copy is trusted."""
    source = inspect.getsource(http.client.HTTPResponse.begin).encode()
    assert hashlib.sha256(source).hexdigest() == "e06ec06b086c7ea0b9857657c435786fe031fdb272ec4080256e40ff04559a0e"


def test_answers_chunked_to_a_head_or_without_length_are_read_as_the_stdlib_reads_them() -> None:
    """The copied begin's body rules: chunked, HEAD, 204, HTTP/1.0 without a length (read to the close)."""
    answers = {
        "/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        "/head": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
        "/none": b"HTTP/1.1 204 No Content\r\n\r\n",
        "/continue": b"HTTP/1.1 100 Continue\r\nX: y\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        "/old": b"HTTP/1.0 200 OK\r\n\r\nuntil close",
    }
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            while True:
                conn, _ = listener.accept()
                with conn:
                    request = conn.recv(65536)
                    if not request:
                        return
                    path = request.split(b" ")[1].decode()
                    conn.sendall(answers[path])
                    if path == "/old":
                        continue
                    conn.recv(65536)  # the client's close (each answer on its own connection below)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        for path, method in (("/chunked", "GET"), ("/head", "HEAD"), ("/none", "GET"), ("/continue", "GET"),
                             ("/old", "GET")):
            pool = KeepAlivePool("http", "127.0.0.1", port)
            ours = pool.request(method, path, headers={}, body=None, timeout=5)
            assert (ours.status, ours.data) == {
                "/chunked": (200, b"abcde"), "/head": (200, b""), "/none": (204, b""), "/continue": (200, b"ok"),
                "/old": (200, b"until close"),
            }[path]
            assert pool.idle() == (0 if path == "/old" else 1)  # read to its end, the connection is reusable
            pool.close()
        with socket.create_connection(("127.0.0.1", port)):
            pass  # ends the server loop
        thread.join(5)
