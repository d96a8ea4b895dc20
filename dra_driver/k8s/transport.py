"""HTTP to the API server from an `ApiConnection`: TLS, credentials, proxies, kept-alive connections.

`KubeRest` sends every request through an `HttpTransport`: a base URL, an `Auth` that gives each request its headers
(and kopf its credentials), and two ways to the server. A request whose answer is read whole (every GET, PATCH, PUT,
POST and DELETE of the kubelet plugin) goes over a `KeepAlivePool` of the stdlib's `http.client` connections, kept
open between requests: per request it costs about half the client CPU of urllib3's `urlopen`, which does more for
every request than one server needs (docs/benchmarks.md, "Issue 37, item 2", "Keep-alive transport"). Watches and
other streamed answers, a server behind a proxy, and a redirect's follow-up go through urllib3's pool manager.
The product's own `ConnectionAuth` serves kubeconfig and in-cluster connections; `fallback.py` builds the transport
from the `kubernetes` package's configuration for the kubeconfigs this loader does not implement (urllib3 only:
its TLS settings live in that package's pool manager).

Behaviour kept from the `kubernetes` client it replaces, on both ways: an idempotent request answered 413, 429 or
503 with `Retry-After` is repeated after that wait up to three times (urllib3's default `Retry`),
redirects are followed, one timeout per attempt, proxies from `HTTPS_PROXY`/`NO_PROXY` (as client-go), and at least
as many pooled connections. What the keep-alive pool repeats after a failed connection is in `KeepAlivePool`.
"""

from __future__ import annotations

import base64
import email.parser
import http.client
import io
import ipaddress
import logging
import os
import re
import select
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol, TypedDict, Unpack, overload
from urllib.parse import urlencode, urlsplit

import urllib3

from dra_driver.k8s.kubeconfig import ApiConnection, KubeconfigError, UnsupportedKubeconfig

# The kubelet plugin's 64 gRPC workers each GET their claim during a prepare, beside its background loops
# (publisher and its watch, events, health, usage, cleanup). The `kubernetes` client kept cpu_count * 5 per host:
# never fewer than that either.
MIN_POOL_SIZE = 80
# A projected service-account token is rotated by the kubelet (by default hourly, valid longer); client-go
# re-reads the file every minute. Here: whenever the file changes, and at least this often.
TOKEN_REREAD_S = 60.0
# A kept-alive connection idle this long is closed rather than reused: Go's http.DefaultTransport's IdleConnTimeout,
# which client-go's transports keep (k8s.io/apimachinery/pkg/util/net SetOldTransportDefaults). A load balancer may
# drop an idle connection without a FIN, and a request sent on it would wait for its whole timeout.
IDLE_TIMEOUT_S = 90.0
# urllib3's default retry policy, which the urllib3 way applies by itself and `KeepAlivePool` applies as it does:
# which methods are repeated, after which answers with Retry-After, how often, and how a Retry-After is read.
_URLLIB3_RETRY = urllib3.util.Retry.DEFAULT
IDEMPOTENT_METHODS = urllib3.util.Retry.DEFAULT_ALLOWED_METHODS  # HEAD, GET, PUT, DELETE, OPTIONS, TRACE
RETRY_AFTER_STATUSES = urllib3.util.Retry.RETRY_AFTER_STATUS_CODES  # 413, 429, 503
RETRY_AFTER_TRIES = 3  # Retry.DEFAULT's total
REDIRECT_STATUSES = frozenset(urllib3.HTTPResponse.REDIRECT_STATUSES)  # 301, 302, 303, 307, 308

log = logging.getLogger(__name__)


def pool_size() -> int:
    return max(MIN_POOL_SIZE, (os.cpu_count() or 1) * 5)


class Auth(Protocol):
    def headers(self) -> Mapping[str, str]:
        """Headers for the next request (a fresh token when it rotated)."""
        ...

    def credentials(self) -> ApiConnection:
        """The connection with the token current now (for kopf, which makes its own connections)."""
        ...


@dataclass(eq=False, repr=False)  # no repr: `fallback` is a secret
class TokenSource:
    """A bearer token read from `path`: re-read when the file changes (the kubelet swaps a projected token's
    symlink, which changes the inode) and at least every `reread_s` seconds; while the file cannot be read, the
    last token read, else `fallback` (a kubeconfig's `token` beside its `tokenFile`)."""

    path: str
    fallback: str | None = None
    _: KW_ONLY
    clock: Callable[[], float] = time.monotonic
    reread_s: float = TOKEN_REREAD_S
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _value: str | None = field(default=None, init=False)
    _signature: tuple[int, int, int] | None = field(default=None, init=False)
    _read_at: float = field(default=0.0, init=False)

    def token(self) -> str | None:
        with self._lock:
            try:
                st = os.stat(self.path)
                signature: tuple[int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
            except OSError:
                signature = None
            now = self.clock()
            if self._value is None or signature != self._signature or now - self._read_at >= self.reread_s:
                try:
                    value = Path(self.path).read_text().strip()
                except OSError:
                    value = ""
                if value:
                    self._value = value
                self._signature, self._read_at = signature, now
            return self._value or self.fallback


class ConnectionAuth:
    """Bearer token (static or from its file), else basic auth; client certificates live in the TLS context."""

    def __init__(self, connection: ApiConnection, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._connection = connection
        self._tokens = (
            TokenSource(connection.token_file, connection.token, clock=clock) if connection.token_file else None
        )
        self._basic: Mapping[str, str] = {}
        if connection.username and connection.password is not None:
            pair = f"{connection.username}:{connection.password}".encode()
            self._basic = {"Authorization": "Basic " + base64.b64encode(pair).decode()}

    def _token(self) -> str | None:
        return self._tokens.token() if self._tokens is not None else self._connection.token

    def headers(self) -> Mapping[str, str]:
        token = self._token()
        return {"Authorization": f"Bearer {token}"} if token else self._basic

    def credentials(self) -> ApiConnection:
        return replace(self._connection, token=self._token())


class Reply(Protocol):
    """What a caller reads of an answer read whole: the keep-alive pool's `Answer`, or urllib3's response."""

    @property
    def status(self) -> int: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def data(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer read whole from a kept-alive connection."""

    status: int
    reason: str
    data: bytes
    headers: http.client.HTTPMessage


# http.client's limits on an answer's header block (its private _MAXLINE and _MAXHEADERS).
_MAX_HEADER_LINE = 65536
_MAX_HEADERS = 100
# A header line the fast parse takes as it is: a field name (RFC 9110 token), a colon, the value on this line. Any
# other line (folded, without a colon, a bare CR inside) sends the whole block to the email package, as the stdlib.
_HEADER_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*([^\r\n]*)\r?\n")


def _read_header_lines(fp: io.BufferedReader) -> list[bytes]:
    """The header lines up to the blank line (not included), within http.client's limits."""
    lines: list[bytes] = []
    while True:
        line = fp.readline(_MAX_HEADER_LINE + 1)
        if len(line) > _MAX_HEADER_LINE:
            raise http.client.LineTooLong("header line")
        if line in (b"\r\n", b"\n", b""):
            return lines
        lines.append(line)
        if len(lines) > _MAX_HEADERS:
            raise http.client.HTTPException(f"got more than {_MAX_HEADERS} headers")


def parse_header_lines(lines: Sequence[bytes]) -> http.client.HTTPMessage:
    """The `HTTPMessage` http.client's `parse_headers` makes of these lines (the same names, values and order), in
    a tenth of its CPU: the stdlib parses every answer's header block with the email package's feed parser, the
    largest part of a small request's client CPU (docs/benchmarks.md, "Keep-alive transport"). Lines it does not
    take as they are go to that parser, whole."""
    message = http.client.HTTPMessage()
    for line in lines:
        match = _HEADER_LINE.fullmatch(line)
        if match is None:
            text = b"".join(lines).decode("iso-8859-1") + "\r\n"
            return email.parser.Parser(_class=http.client.HTTPMessage).parsestr(text)
        message[match[1].decode("ascii")] = match[2].decode("iso-8859-1")
    return message


class _Response(http.client.HTTPResponse):
    """http.client's response, its header block parsed by `parse_header_lines`. `begin` is CPython 3.11's
    `HTTPResponse.begin` with only that changed (and its debug prints left out); a test holds the stdlib's `begin`
    to the one this copies, so a Python whose `begin` differs is checked before it is used."""

    def begin(self) -> None:
        stdlib: Any = self  # the stdlib's private parts that its begin uses: _read_status, _check_close, _method
        if stdlib.headers is not None:
            return  # already begun
        while True:
            version, status, reason = stdlib._read_status()
            if status != http.client.CONTINUE:
                break
            _read_header_lines(self.fp)  # a 100 Continue's headers, skipped
        stdlib.code = self.status = status
        self.reason = reason.strip()
        if version in ("HTTP/1.0", "HTTP/0.9"):
            self.version = 10
        elif version.startswith("HTTP/1."):
            self.version = 11
        else:
            raise http.client.UnknownProtocol(version)
        self.headers = self.msg = parse_header_lines(_read_header_lines(self.fp))
        transfer_encoding = self.headers.get("transfer-encoding")
        self.chunked = bool(transfer_encoding and transfer_encoding.lower() == "chunked")
        if self.chunked:
            self.chunk_left = None
        self.will_close = stdlib._check_close()
        self.length = None
        length = self.headers.get("content-length")
        if length and not self.chunked:
            try:
                self.length = int(length)
            except ValueError:
                self.length = None
            else:
                if self.length < 0:
                    self.length = None
        if status in (http.client.NO_CONTENT, http.client.NOT_MODIFIED) or 100 <= status < 200 \
                or stdlib._method == "HEAD":
            self.length = 0
        if not self.will_close and not self.chunked and self.length is None:
            self.will_close = True


class _Connection(http.client.HTTPConnection):
    """A request's header block and its body written in one `send` (http.client writes them apart: two system calls,
    and on loopback the second carries the receiver's TCP work into this process's CPU too)."""

    response_class = _Response
    _held: bytes | None = None

    def request_whole(self, method: str, target: str, body: bytes | None, headers: Mapping[str, str]) -> None:
        """`request` with the header block held back and sent with the body (the stdlib sends it, then the body)."""
        self._held = b"" if body else None
        try:
            self.request(method, target, body, headers)
        finally:
            held, self._held = self._held, None
        if held:  # no body came after the header block (not expected: it is sent as it would have been)
            super().send(held)

    def send(self, data: Any) -> None:
        held = self._held
        if held is None:
            super().send(data)
        elif not held:
            self._held = bytes(data)  # the header block
        else:
            self._held = None
            super().send(held + bytes(data))


class _TLSConnection(_Connection, http.client.HTTPSConnection):
    """`HTTPSConnection` that verifies (and names in SNI) `server_name` instead of the host it dials, as urllib3's
    `server_hostname` (a kubeconfig's `tls-server-name`)."""

    response_class = _Response

    def __init__(self, host: str, port: int | None, *, context: ssl.SSLContext, server_name: str | None) -> None:
        super().__init__(host, port, context=context)
        self._tls = context
        self._server_name = server_name or host

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)  # TCP, with TCP_NODELAY
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_name)


class _Failed(Exception):
    """An attempt that got no answer: `sent` when the whole request had been handed to the kernel."""

    def __init__(self, error: Exception, sent: bool) -> None:
        super().__init__(error)
        self.error = error
        self.sent = sent


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """An idle connection is readable only when the server closed it (EOF) or sent what nobody asked for: either
    way it cannot carry a request (urllib3's `is_connection_dropped` asks the same)."""
    sock = conn.sock
    if sock is None:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class KeepAlivePool:
    """Kept-alive `http.client` connections to one server (`scheme://host:port`), for requests whose answer is read
    whole. Thread-safe: each request takes an idle connection (the last one handed back) or opens one, and hands it
    back when the answer is read; at most `maxsize` are kept idle (more callers at once open more, closed when
    handed back, as urllib3's non-blocking pool). An idle connection is not reused once the server closed it or after
    IDLE_TIMEOUT_S; a connection that failed is closed, and so is every connection `close` finds (later ones when
    handed back).

    Repeated, as urllib3's default retries would (`RETRY_AFTER_*`): an idempotent request answered 413/429/503 with
    Retry-After, after that wait, up to three times (the fourth such answer is returned). Repeated once, on a new
    connection, where it cannot act twice: a request that failed before it was all written (the server never had
    the whole request), or an idempotent one that got no answer (a kept-alive connection the server closed as the
    request went out). Never repeated: a timeout (the caller would wait twice its timeout), and a PATCH or POST
    that was written but not answered (the server may have acted on it; the caller decides). urllib3 also repeated
    connection failures and timed-out reads of idempotent requests up to three times."""

    def __init__(
        self,
        scheme: str,
        host: str,
        port: int | None,
        *,
        context: ssl.SSLContext | None = None,
        server_name: str | None = None,
        maxsize: int = MIN_POOL_SIZE,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if scheme not in ("http", "https") or (scheme == "https") != (context is not None):
            raise ValueError(f"{scheme}: http, or https with a TLS context")
        self.host, self.port = host, port
        self._context, self._server_name = context, server_name
        self._maxsize, self._idle_timeout_s = maxsize, idle_timeout_s
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._idle: list[tuple[_Connection, int, float]] = []  # (conn, generation, idle since)
        self._generation = 0  # advanced by close: connections of an older one are not kept
        self.opened = 0  # connections opened so far

    def request(
        self, method: str, target: str, *, headers: Mapping[str, str], body: bytes | None, timeout: float
    ) -> Answer:
        """The answer, whatever its status. Raises OSError (a timeout is TimeoutError) or urllib3's ProtocolError
        (an answer that is not HTTP)."""
        idempotent = method in IDEMPOTENT_METHODS
        waits = 0
        fresh = False
        while True:
            conn, generation = self._checkout(fresh)
            try:
                answer, reusable = self._exchange(conn, method, target, headers, body, timeout)
            except _Failed as failed:
                conn.close()
                error = failed.error
                if not isinstance(error, (OSError, http.client.HTTPException)):
                    raise error from None  # not the connection's failure (a header http.client refuses)
                if fresh or isinstance(error, TimeoutError) or (failed.sent and not idempotent):
                    raise _transport_error(error) from error
                fresh = True  # one more try, on a connection of its own
                continue
            self._checkin(conn, generation, reusable)
            if not (idempotent and answer.status in RETRY_AFTER_STATUSES):
                return answer
            retry_after = answer.headers.get("Retry-After")
            if not retry_after or waits == RETRY_AFTER_TRIES:
                return answer
            try:
                seconds = _URLLIB3_RETRY.parse_retry_after(retry_after)
            except urllib3.exceptions.InvalidHeader:
                return answer  # not a wait this client can read: the answer as it is
            waits += 1
            if seconds > 0:
                self._sleep(seconds)

    def _exchange(
        self,
        conn: _Connection,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> tuple[Answer, bool]:
        """One attempt: the answer, and whether the connection may carry another request."""
        sent = False
        try:
            deadline = self._clock() + timeout
            if conn.sock is None:
                conn.timeout = timeout
                conn.connect()
            sock = conn.sock
            sock.settimeout(max(deadline - self._clock(), 0.001))
            # When a write of the headers or of the body fails, the server never had the whole request (a body
            # shorter than its Content-Length is not a request it acts on).
            conn.request_whole(method, target, body, headers)
            sent = True
            response = conn.getresponse()
            sock.settimeout(max(deadline - self._clock(), 0.001))  # the body's reads within the same deadline
            data = response.read()
        except Exception as exc:
            raise _Failed(exc, sent) from exc
        answer = Answer(response.status, response.reason, data, response.headers)
        return answer, not response.will_close and conn.sock is not None

    def _checkout(self, fresh: bool) -> tuple[_Connection, int]:
        """The most recently used idle connection that can still carry a request, else a new (unconnected) one."""
        while not fresh:
            with self._lock:
                if not self._idle:
                    break
                conn, generation, since = self._idle.pop()
            if self._clock() - since < self._idle_timeout_s and not _dropped(conn):
                return conn, generation
            conn.close()
        with self._lock:
            self.opened += 1
            generation = self._generation
        if self._context is None:
            return _Connection(self.host, self.port), generation
        return _TLSConnection(self.host, self.port, context=self._context, server_name=self._server_name), generation

    def _checkin(self, conn: _Connection, generation: int, reusable: bool) -> None:
        full = False
        if reusable:
            with self._lock:
                if generation == self._generation:
                    if len(self._idle) < self._maxsize:
                        self._idle.append((conn, generation, self._clock()))
                        return
                    full = True
        if full:
            log.warning("connection pool to %s is full (%d kept), closing a connection", self.host, self._maxsize)
        conn.close()

    def idle(self) -> int:
        """Connections kept open for the next requests."""
        with self._lock:
            return len(self._idle)

    def close(self) -> None:
        """Closes the idle connections now and those in use when they are handed back; later requests open new."""
        with self._lock:
            self._generation += 1
            idle, self._idle = self._idle, []
        for conn, _, _ in idle:
            conn.close()


def _transport_error(error: Exception) -> Exception:
    """OSError as it is; an answer that is not HTTP (http.client's HTTPException) as urllib3's ProtocolError."""
    if isinstance(error, http.client.HTTPException) and not isinstance(error, OSError):
        return urllib3.exceptions.ProtocolError("Connection aborted.", error)
    return error


class SendOptions(TypedDict, total=False):
    """The options of `HttpTransport.send` that its two forms share (the defaults are its: no query, no headers
    but the credentials', no body)."""

    query: Sequence[tuple[str, str]]
    headers: Mapping[str, str] | None
    body: bytes | None


class HttpTransport:
    """One API server: `send` a request; get its answer read whole (`Reply`), or urllib3's response unread for a
    stream (`stream=True`: a watch, a list decoded as it arrives)."""

    def __init__(
        self, server: str, pool: urllib3.PoolManager, auth: Auth, *, keepalive: KeepAlivePool | None = None
    ) -> None:
        self.server = server.rstrip("/")
        self.pool = pool
        self.auth = auth
        self.keepalive = keepalive
        # Every request goes to one server: its urllib3 connection pool is looked up once instead of per request
        # (the pool manager parses the URL and finds the pool on every call). A proxy needs the pool manager's
        # request forms, and a redirect its cross-host rules: both go through it.
        self._prefix = urlsplit(self.server).path
        self._direct: urllib3.HTTPConnectionPool | None = None
        self._direct_lock = threading.Lock()

    @classmethod
    def for_connection(
        cls,
        connection: ApiConnection,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        maxsize: int | None = None,
    ) -> HttpTransport:
        env = os.environ if environ is None else environ
        size = maxsize or pool_size()
        parts = urlsplit(connection.server)
        context = ssl_context(connection) if parts.scheme == "https" else None
        pool = connection_pool(connection, environ=env, maxsize=size, context=context)
        keepalive = None
        if not isinstance(pool, urllib3.ProxyManager) and parts.scheme in ("http", "https"):
            keepalive = KeepAlivePool(
                parts.scheme,
                parts.hostname or "localhost",
                parts.port,
                context=context,
                server_name=connection.tls_server_name,
                maxsize=size,
            )
        return cls(connection.server, pool, ConnectionAuth(connection, clock=clock), keepalive=keepalive)

    @overload
    def send(
        self, method: str, path: str, *, timeout: float, stream: Literal[False] = False, **options: Unpack[SendOptions]
    ) -> Reply: ...

    @overload
    def send(
        self, method: str, path: str, *, timeout: float, stream: Literal[True], **options: Unpack[SendOptions]
    ) -> urllib3.BaseHTTPResponse: ...

    def send(
        self, method: str, path: str, *, timeout: float, stream: bool = False, **options: Unpack[SendOptions]
    ) -> Reply | urllib3.BaseHTTPResponse:
        """Raises urllib3's errors (HTTPError) or OSError when the server is not reached; any status is returned."""
        query, headers, body = options.get("query", ()), options.get("headers"), options.get("body")
        if query:
            path += ("&" if "?" in path else "?") + urlencode(query)
        all_headers = {**(headers or {}), **self.auth.headers()}
        redirected = False
        if not stream and self.keepalive is not None:
            answer = self.keepalive.request(method, self._prefix + path, headers=all_headers, body=body,
                                            timeout=timeout)
            if answer.status not in REDIRECT_STATUSES or not answer.headers.get("Location"):
                return answer
            redirected = True
        # The same request either way below.
        request: dict[str, Any] = {
            "body": body,
            "headers": all_headers,
            "timeout": urllib3.Timeout(total=timeout),
            "preload_content": not stream,
        }
        direct = None if redirected else self._direct_pool()
        if direct is not None:
            response = direct.urlopen(method, self._prefix + path, redirect=False, assert_same_host=False, **request)
            if not response.get_redirect_location():
                return response
            response.drain_conn()
            response.release_conn()
        # A redirect (an API server does not send them, a front proxy might) is asked again through the pool
        # manager, which follows it as before (the server did not act on a request it redirected).
        return self.pool.request(method, self.server + path, **request)

    def _direct_pool(self) -> urllib3.HTTPConnectionPool | None:
        if isinstance(self.pool, urllib3.ProxyManager):
            return None
        direct = self._direct
        if direct is None:
            with self._direct_lock:
                direct = self._direct = self._direct or self.pool.connection_from_url(self.server)
        return direct

    def credentials(self) -> ApiConnection:
        return self.auth.credentials()

    def close(self) -> None:
        with self._direct_lock:
            self._direct = None
        if self.keepalive is not None:
            self.keepalive.close()
        self.pool.clear()


def connection_pool(
    connection: ApiConnection, *, environ: Mapping[str, str], maxsize: int, context: ssl.SSLContext | None = None
) -> urllib3.PoolManager:
    """urllib3's pool manager for the connection (through its proxy if it has one); `context`: its TLS context
    when already made (`ssl_context`), to share it with the keep-alive pool."""
    options: dict[str, object] = {"maxsize": maxsize}
    if urlsplit(connection.server).scheme == "https":
        options["ssl_context"] = context or ssl_context(connection)
        options["cert_reqs"] = ssl.CERT_NONE if connection.insecure else ssl.CERT_REQUIRED
        if connection.insecure:
            options["assert_hostname"] = False
        if connection.tls_server_name:
            options["server_hostname"] = connection.tls_server_name
    proxy = connection.proxy_url or environment_proxy(connection.server, environ)
    if proxy is None:
        return urllib3.PoolManager(**options)  # type: ignore[arg-type]
    if not proxy.startswith(("http://", "https://")):
        raise UnsupportedKubeconfig(f"{connection.source}: proxy {proxy!r} (only http/https proxies are implemented)")
    return urllib3.ProxyManager(proxy, **options)  # type: ignore[arg-type]


def ssl_context(connection: ApiConnection) -> ssl.SSLContext:
    """Server verification from the CA (file and/or data; the system's CAs when neither), the client certificate."""
    try:
        context = ssl.create_default_context(
            cafile=connection.ca_file, cadata=connection.ca_data.decode() if connection.ca_data else None
        )
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise KubeconfigError(f"{connection.source}: cannot load the certificate authority: {exc}") from exc
    if connection.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    has_cert = bool(connection.cert_file or connection.cert_data)
    has_key = bool(connection.key_file or connection.key_data)
    if has_cert != has_key:
        missing = "client-key" if has_cert else "client-certificate"
        raise KubeconfigError(f"{connection.source}: {missing} (or {missing}-data) is not set")
    if has_cert:
        try:
            _load_client_certificate(context, connection)
        except (OSError, ssl.SSLError) as exc:
            raise KubeconfigError(f"{connection.source}: cannot load the client certificate/key: {exc}") from exc
    return context


def _load_client_certificate(context: ssl.SSLContext, connection: ApiConnection) -> None:
    if connection.cert_file and connection.key_file:
        context.load_cert_chain(connection.cert_file, connection.key_file)
        return
    # Python's ssl loads a certificate chain only from files: the -data forms are written to a private (0700)
    # directory for the duration of the call, then removed; the context keeps what it loaded.
    with tempfile.TemporaryDirectory(prefix="dra-driver-tls-") as tmp:
        cert = connection.cert_file or _private_file(Path(tmp) / "tls.crt", connection.cert_data or b"")
        key = connection.key_file or _private_file(Path(tmp) / "tls.key", connection.key_data or b"")
        context.load_cert_chain(cert, key)


def _private_file(path: Path, data: bytes) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return str(path)


def environment_proxy(server: str, environ: Mapping[str, str]) -> str | None:
    """`<scheme>_proxy` / `<SCHEME>_PROXY` for the server's scheme unless `no_proxy` / `NO_PROXY` exempts it, as
    client-go (and the `kubernetes` client since 35) read them."""
    parts = urlsplit(server)
    scheme = parts.scheme.lower()
    proxy = environ.get(f"{scheme}_proxy") or environ.get(f"{scheme.upper()}_PROXY")
    if not proxy:
        return None
    exempt = environ.get("no_proxy") or environ.get("NO_PROXY") or ""
    return None if bypasses_proxy(parts.hostname or "", parts.port, exempt) else proxy


def bypasses_proxy(host: str, port: int | None, no_proxy: str) -> bool:
    """`*`, a host or domain suffix (`example.com`, `.example.com`), `host:port`, or a CIDR (for IP hosts)."""
    host = host.lower().strip("[]")
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        if ip is not None:
            try:
                if ip in ipaddress.ip_network(entry.strip("[]"), strict=False):
                    return True
                continue
            except ValueError:
                pass
        name, _, entry_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if entry_port and entry_port != str(port):
            continue
        name = name.lstrip(".")
        if host == name or host.endswith("." + name):
            return True
    return False
