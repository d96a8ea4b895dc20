"""HTTP to the API server from an `ApiConnection`: TLS, credentials, proxies, kept-alive connections.

`KubeRest` sends every request through an `HttpTransport`: a base URL, an `Auth` that gives each request its headers
(and kopf its credentials), and two ways to the server. A request whose answer is read whole (every GET, PATCH, PUT,
POST and DELETE of the kubelet plugin) goes over a `KeepAlivePool`: connections kept open between requests, each
carrying this module's own HTTP/1.1 exchange (`_Connection`, from RFC 9112: the request in one write, the answer
read whole). Per request it costs a fraction of the client CPU of urllib3's `urlopen`, which does more for every
request than one server needs (docs/benchmarks.md, "Issue 37, item 2", "Keep-alive transport"). Watches and
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
import http.client
import ipaddress
import logging
import os
import re
import select
import socket
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


# The limits on an answer's head that this client held before (http.client's): a line of at most 64 KiB, at most
# 100 header fields. RFC 9112 sets none; a server past them is not one this client talks to.
_MAX_HEADER_LINE = 65536
_MAX_HEADERS = 100
# Bytes asked of the socket per read: an API server's answer to a plugin's GET or PATCH (headers and a claim,
# ≈ 1-2 KiB) comes in one read.
_RECV_SIZE = 65536
# A chunk size of more hex digits than this is not one a server sends (16 digits: 2**64).
_MAX_CHUNK_SIZE_DIGITS = 16
# RFC 9110 5.6.2's token: a field name, a method.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# What a request target (RFC 9112 3.2, an origin-form path and query) never holds: controls, space, non-ASCII.
_NOT_IN_TARGET = re.compile(r"[^\x21-\x7e]")
# An answer's status line (RFC 9112 4): HTTP/1.0 or HTTP/1.1, three digits, a reason (the space before an empty
# reason is taken as optional, as servers leave it out); a bare LF ends a line too (RFC 9112 2.2).
_STATUS_LINE = re.compile(r"HTTP/1\.([01]) ([0-9]{3})(?: ([^\r\n\x00]*))?\r?\n")
# One field line (RFC 9112 5): a name, a colon with no space before it, the value without the whitespace around it;
# no CR, LF or NUL inside (RFC 9110 5.5). Found over the whole block at once: the block is well formed when every
# line is one of these.
_FIELD_LINE = re.compile(r"^([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*([^\r\n\x00]*?)[ \t]*\r?$", re.MULTILINE)
# obs-fold (RFC 9112 5.2): a line end followed by whitespace continues the field; a user agent reads it as a space.
_OBS_FOLD = re.compile(r"\r?\n[ \t]+")
_HEX = re.compile(rb"[0-9A-Fa-f]+")


class AnswerError(http.client.HTTPException):
    """An answer that is not HTTP/1.x as RFC 9112 writes it (or past this client's limits): the connection is
    closed, and `KeepAlivePool` raises it as urllib3's ProtocolError."""


class Disconnected(ConnectionResetError):
    """The server closed the connection before the answer began (a kept-alive connection it closed as the request
    went out; an OSError, as a reset is)."""


@dataclass(frozen=True, slots=True)
class Headers:
    """An answer's header fields: in the order they came (`fields`), and by name in any case (`get`). A name that
    came more than once reads as its values joined by ", " (RFC 9110 5.3)."""

    fields: tuple[tuple[str, str], ...]
    by_name: Mapping[str, str]  # lower-case name: value

    def get(self, name: str, default: str | None = None) -> str | None:
        return self.by_name.get(name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return self.by_name[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self.by_name

    def items(self) -> list[tuple[str, str]]:
        return list(self.fields)


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer read whole from a kept-alive connection."""

    status: int
    reason: str
    data: bytes
    headers: Headers


def parse_fields(block: str) -> Headers:
    """The header fields of `block`: field lines (each ended by CRLF or LF, RFC 9112 2.2) decoded as Latin-1.
    Raises AnswerError naming the first line that is not a field line."""
    pairs = _FIELD_LINE.findall(block)
    if len(pairs) != block.count("\n"):
        unfolded = _OBS_FOLD.sub(" ", block)
        pairs = _FIELD_LINE.findall(unfolded)
        if len(pairs) != unfolded.count("\n"):
            bad = [line for line in unfolded.split("\n")[:-1] if _FIELD_LINE.fullmatch(line) is None]
            raise AnswerError(f"not a header field line: {(bad or [block])[0][:80]!r}")
    by_name: dict[str, str] = {}
    for name, value in pairs:
        key = name.lower()
        if key in by_name:
            by_name[key] += ", " + value
        else:
            by_name[key] = value
    return Headers(tuple(pairs), by_name)


def _tokens(value: str | None) -> set[str]:
    """The comma-separated tokens of a field such as Connection, in lower case."""
    return {token.strip().lower() for token in value.split(",")} if value else set()


def _content_length(value: str) -> int:
    """RFC 9112 6.3: digits only; a list of one length repeated is that length (RFC 9110 8.6); anything else is
    framing this client cannot trust."""
    if value.isascii() and value.isdigit() and len(value) <= 18:  # the one length, as servers send it
        return int(value)
    lengths = {part.strip() for part in value.split(",")}
    if len(lengths) == 1:
        (length,) = lengths
        if length.isascii() and length.isdigit() and len(length) <= 18:
            return int(length)
    raise AnswerError(f"Content-Length {value[:40]!r}")


def request_bytes(
    method: str, target: str, host: str, headers: Mapping[str, str], body: bytes | None
) -> bytes:
    """A request as RFC 9112 writes it: the request line, Host, `headers`, Content-Length (with a body, or 0 for a
    method that carries one, RFC 9110 8.6), then the body; one buffer, so that it goes out in one write. Refuses
    (ValueError, naming it) a method or header name that is not a token, a target with a control, space or
    non-ASCII character, and a header value holding CR, LF or NUL: each would let a caller's text end the line and
    write another header or request (request smuggling)."""
    if _TOKEN.fullmatch(method) is None:
        raise ValueError(f"method {method!r} is not an HTTP token")
    if _NOT_IN_TARGET.search(target) is not None:
        raise ValueError(f"request target {target!r} holds a control, space or non-ASCII character")
    # Accept-Encoding: identity: the answer's bytes are the content (this client decodes no content coding).
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Accept-Encoding: identity"]
    for name, value in headers.items():
        if _TOKEN.fullmatch(name) is None:
            raise ValueError(f"header name {name!r} is not an HTTP token")
        lines.append(f"{name}: {value}")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    elif method in ("POST", "PUT", "PATCH"):
        lines.append("Content-Length: 0")
    lines += ("", "")
    text = "\r\n".join(lines)
    # Every CR and LF is one this function wrote (names are tokens, the target has none): one count for all values.
    if text.count("\n") != len(lines) - 1 or text.count("\r") != len(lines) - 1 or "\0" in text:
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\0" in value:
                raise ValueError(f"header {name!r}: its value holds CR, LF or NUL")
        raise ValueError(f"Host {host!r} holds CR, LF or NUL")
    try:
        head = text.encode("latin-1")
    except UnicodeEncodeError:
        for name, value in headers.items():
            if not value.isascii() and any(ord(c) > 0xFF for c in value):
                raise ValueError(f"header {name!r}: its value is not Latin-1") from None
        raise
    return head + body if body else head


def _authority(host: str, port: int | None, default_port: int) -> str:
    """The Host header's value (RFC 9110 7.2): the host, in brackets if an IPv6 literal (RFC 3986 3.2.2), and the
    port unless the scheme's default."""
    name = host if host.isascii() else host.encode("idna").decode("ascii")
    name = f"[{name}]" if ":" in name else name
    return name if port in (None, default_port) else f"{name}:{port}"


class _Connection:
    """One connection to the server (TCP, TCP_NODELAY) and the HTTP/1.1 exchanges on it, one after the other:
    `send` a request's bytes, `read_answer` its answer (RFC 9112). `sock` is None until connected and once closed."""

    default_port = 80

    def __init__(self, host: str, port: int | None, clock: Callable[[], float]) -> None:
        self.host, self.port = host, port or self.default_port
        self.sock: socket.socket | None = None
        self._clock = clock
        self._deadline = 0.0
        self._buf = b""  # read from the socket, not yet taken

    def connect(self, deadline: float) -> None:
        sock = socket.create_connection((self.host, self.port), self._left(deadline))
        try:
            # A request is one write and waits for its answer: nothing to gain from Nagle's delay.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self._left(deadline))
            sock = self._secure(sock)
        except BaseException:
            sock.close()
            raise
        self.sock, self._buf = sock, b""

    def _secure(self, sock: socket.socket) -> socket.socket:
        return sock

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()

    def _left(self, deadline: float) -> float:
        left = deadline - self._clock()
        if left <= 0:
            raise TimeoutError("timed out")
        return left

    def _live(self) -> socket.socket:
        if self.sock is None:
            raise ConnectionError("the connection is closed")
        return self.sock

    def send(self, data: bytes, deadline: float) -> None:
        """The whole request, within the deadline (sendall's timeout bounds all of its writes together)."""
        self._deadline = deadline
        sock = self._live()
        sock.settimeout(self._left(deadline))
        sock.sendall(data)

    def _recv(self) -> bytes:
        sock = self._live()
        sock.settimeout(self._left(self._deadline))
        more: bytes = sock.recv(_RECV_SIZE)
        return more

    def read_answer(self, head_only: bool) -> tuple[Answer, bool]:
        """The answer to the request sent, read whole (its deadline the request's), and whether the connection can
        carry another request. `head_only`: the answer to a HEAD (no body, whatever its header fields say)."""
        while True:
            minor, status, reason, headers = self._read_head()
            if status >= 200:
                break
            if status == 101:  # this client asks for no protocol switch
                raise AnswerError("101 Switching Protocols to a request that asked for no upgrade")
            # 1xx: an interim answer (100 Continue, 103 Early Hints); the final one follows (RFC 9110 15.2).
        # HTTP/1.1 keeps the connection unless told to close it; HTTP/1.0 closes it unless told to keep it.
        connection = _tokens(headers.by_name.get("connection"))
        keep = "close" not in connection if minor else "keep-alive" in connection
        transfer = headers.by_name.get("transfer-encoding")
        length = headers.by_name.get("content-length")
        if head_only or status in (204, 304):  # no content, whatever the fields say (RFC 9112 6.3)
            data = b""
        elif transfer is not None:
            if length is not None:  # RFC 9112 6.3: a sign of request smuggling or response splitting
                raise AnswerError("both Transfer-Encoding and Content-Length")
            if transfer.strip().lower() != "chunked":  # this client sends no TE: chunked is the only coding
                raise AnswerError(f"Transfer-Encoding {transfer[:40]!r}")
            data = self._read_chunked()
            keep = keep and minor == 1  # chunked in HTTP/1.0: faulty framing, close after it (RFC 9112 6.1)
        elif length is not None:
            data = self._take(_content_length(length))
        else:
            data, keep = self._read_to_close(), False  # the body ends where the connection does
        if self._buf:  # bytes after the answer that nobody asked for: the connection's framing is lost
            keep = False
        return Answer(status, reason, data, headers), keep and self.sock is not None

    def _read_head(self) -> tuple[int, int, str, Headers]:
        """The status line and header section (HTTP minor version, status, reason, headers); the buffer then holds
        what follows the empty line."""
        buf = self._buf
        while True:
            crlf, lf = buf.find(b"\n\r\n"), buf.find(b"\n\n")
            if crlf >= 0 and (lf < 0 or crlf < lf):
                end, rest = crlf + 1, crlf + 3
                break
            if lf >= 0:
                end, rest = lf + 1, lf + 2
                break
            # No empty line yet: the limits hold for what came so far (the line being read, the lines before it).
            if len(buf) - buf.rfind(b"\n") - 1 >= _MAX_HEADER_LINE:  # its line end would take it past
                raise AnswerError(f"a header line longer than {_MAX_HEADER_LINE} bytes")
            if buf.count(b"\n") > _MAX_HEADERS + 1:
                raise AnswerError(f"more than {_MAX_HEADERS} header fields")
            more = self._recv()
            if not more:
                if buf:
                    raise AnswerError(f"the connection closed inside the answer's head after {len(buf)} bytes")
                raise Disconnected("the server closed the connection without an answer")
            buf += more
        head, self._buf = buf[:end].decode("latin-1"), buf[rest:]
        # (A head within the limit holds no line past it; a line's length counts its line end.)
        if len(head) > _MAX_HEADER_LINE and max(map(len, head.split("\n"))) >= _MAX_HEADER_LINE:
            raise AnswerError(f"a header line longer than {_MAX_HEADER_LINE} bytes")
        if head.count("\n") > _MAX_HEADERS + 1:
            raise AnswerError(f"more than {_MAX_HEADERS} header fields")
        first = head.find("\n") + 1
        status = _STATUS_LINE.fullmatch(head, 0, first)
        if status is None:
            raise AnswerError(f"not an HTTP/1.0 or HTTP/1.1 status line: {head[:min(first, 80)]!r}")
        minor, code, reason = status.groups("")
        return int(minor), int(code), reason.strip(), parse_fields(head[first:])

    def _take(self, size: int) -> bytes:
        """The next `size` bytes of the answer; AnswerError if the connection ends first."""
        buf = self._buf
        if len(buf) >= size:
            self._buf = buf[size:]
            return buf[:size]
        # Read into the body's own buffer, no further than its end: nothing of a next answer is read with it.
        whole = bytearray(size)
        whole[: len(buf)] = buf
        got, self._buf = len(buf), b""
        view = memoryview(whole)
        sock = self._live()
        while got < size:
            sock.settimeout(self._left(self._deadline))
            count = sock.recv_into(view[got:])
            if not count:
                raise AnswerError(f"the connection closed {size - got} bytes before the body's end ({size})")
            got += count
        return bytes(whole)

    def _line(self) -> bytes:
        """The next line of a chunked body (a chunk's size line, the end of its data, a trailer field), without its
        line end; within the header line limit."""
        buf = self._buf
        while (end := buf.find(b"\n")) < 0:
            if len(buf) > _MAX_HEADER_LINE:
                raise AnswerError(f"a chunked body's line longer than {_MAX_HEADER_LINE} bytes")
            more = self._recv()
            if not more:
                raise AnswerError("the connection closed inside a chunked body")
            buf += more
        if end > _MAX_HEADER_LINE:
            raise AnswerError(f"a chunked body's line longer than {_MAX_HEADER_LINE} bytes")
        self._buf = buf[end + 1:]
        return buf[:end - 1] if end and buf[end - 1] == 0x0D else buf[:end]

    def _read_chunked(self) -> bytes:
        """RFC 9112 7.1: chunks, each a hex size (extensions after ';' ignored), its data and a line end, until the
        chunk of size 0; then the trailer section, skipped (nothing here reads trailer fields)."""
        chunks = []
        while True:
            line = self._line()
            size = line.split(b";", 1)[0].strip(b" \t")
            if len(size) > _MAX_CHUNK_SIZE_DIGITS or _HEX.fullmatch(size) is None:
                raise AnswerError(f"not a chunk size: {line[:40]!r}")
            if not (length := int(size, 16)):
                break
            chunks.append(self._take(length))
            if self._line():
                raise AnswerError("no line end after a chunk's data")
        for _ in range(_MAX_HEADERS + 1):
            if not self._line():
                return b"".join(chunks)
        raise AnswerError(f"more than {_MAX_HEADERS} trailer fields")

    def _read_to_close(self) -> bytes:
        parts = [self._buf]
        self._buf = b""
        while more := self._recv():
            parts.append(more)
        self.close()
        return b"".join(parts)


class _TLSConnection(_Connection):
    """TLS over the connection with `context`, verifying (and naming in SNI) `server_name` instead of the host it
    dials, as urllib3's `server_hostname` (a kubeconfig's `tls-server-name`)."""

    default_port = 443

    def __init__(
        self,
        host: str,
        port: int | None,
        clock: Callable[[], float],
        *,
        context: ssl.SSLContext,
        server_name: str | None,
    ) -> None:
        super().__init__(host, port, clock)
        self._tls = context
        self._server_name = server_name or host

    def _secure(self, sock: socket.socket) -> socket.socket:
        return self._tls.wrap_socket(sock, server_hostname=self._server_name)


class _Failed(Exception):
    """An attempt that got no answer: `sent` when the whole request had been handed to the kernel."""

    def __init__(self, error: Exception, sent: bool) -> None:
        super().__init__(error)
        self.error = error
        self.sent = sent


def _dropped(conn: _Connection) -> bool:
    """An idle connection is readable only when the server closed it (EOF) or sent what nobody asked for: either
    way it cannot carry a request (urllib3's `is_connection_dropped` asks the same)."""
    sock = conn.sock
    if sock is None:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class KeepAlivePool:
    """Kept-alive connections to one server (`scheme://host:port`), each carrying this module's HTTP/1.1 exchange
    (`_Connection`), for requests whose answer is read whole. Thread-safe: each request takes an idle connection
    (the last one handed back) or opens one, and hands it back when the answer is read; at most `maxsize` are kept
    idle (more callers at once open more, closed when handed back, as urllib3's non-blocking pool). An idle
    connection is not reused once the server closed it or after IDLE_TIMEOUT_S; a connection that failed is
    closed, and so is every connection `close` finds (later ones when handed back).

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
        self._authority = _authority(host, port, 443 if context is not None else 80)

    def request(
        self, method: str, target: str, *, headers: Mapping[str, str], body: bytes | None, timeout: float
    ) -> Answer:
        """The answer, whatever its status. Raises OSError (a timeout is TimeoutError) or urllib3's ProtocolError
        (an answer that is not HTTP); ValueError, before anything is sent, for a request that cannot be written
        (`request_bytes`)."""
        idempotent = method in IDEMPOTENT_METHODS
        data = request_bytes(method, target, self._authority, headers, body)
        head_only = method == "HEAD"
        waits = 0
        fresh = False
        while True:
            conn, generation = self._checkout(fresh)
            try:
                answer, reusable = self._exchange(conn, data, head_only, timeout)
            except _Failed as failed:
                conn.close()
                error = failed.error
                if not isinstance(error, (OSError, http.client.HTTPException)):
                    raise error from None  # not the connection's failure
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

    def _exchange(self, conn: _Connection, data: bytes, head_only: bool, timeout: float) -> tuple[Answer, bool]:
        """One attempt, connect, send and read within one deadline: the answer, and whether the connection may carry
        another request."""
        sent = False
        try:
            deadline = self._clock() + timeout
            if conn.sock is None:
                conn.connect(deadline)
            # When the write fails, the server never had the whole request (a body shorter than its Content-Length
            # is not a request it acts on).
            conn.send(data, deadline)
            sent = True
            return conn.read_answer(head_only)
        except Exception as exc:
            raise _Failed(exc, sent) from exc

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
            return _Connection(self.host, self.port, self._clock), generation
        tls = _TLSConnection(self.host, self.port, self._clock, context=self._context, server_name=self._server_name)
        return tls, generation

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
    """OSError as it is; an answer that is not HTTP (AnswerError, an HTTPException) as urllib3's ProtocolError."""
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
