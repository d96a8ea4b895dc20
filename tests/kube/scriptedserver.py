"""Local servers for the transport's tests. `scripted_server`: an HTTP/1.1 (or HTTPS) server that keeps
connections alive and answers each request as a script says: 200 with what it saw, a status with Retry-After, no
answer at all (the connection closed or reset once the request is read), an answer held until the test releases it,
or an answer that closes the connection. It counts connections (opened, open now) and can close every open one, as a
server dropping its idle kept-alive connections does. `raw_server`: one that answers with given bytes, for the
exchange's parser."""

from __future__ import annotations

import json
import socket
import ssl
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.kube.tlsserver import Pki

OK = "ok"
VANISH = "vanish"  # the request read, the connection closed without an answer (FIN)
RESET = "reset"  # the request read, the connection reset (RST)
HOLD = "hold"  # answered once the test sets `release`
CLOSE = "close"  # answered with `Connection: close`


@dataclass(frozen=True)
class Seen:
    connection: int
    method: str
    path: str
    body: bytes
    authorization: str | None


@dataclass(frozen=True)
class Status:
    """Answer `code` (with `Retry-After: retry_after` unless None)."""

    code: int
    retry_after: str | None = None


@dataclass
class Script:
    steps: list[str | Status] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    held: threading.Event = field(default_factory=threading.Event)  # set when a HOLD request arrived
    lock: threading.Lock = field(default_factory=threading.Lock)
    opened: int = 0
    open_sockets: dict[int, socket.socket] = field(default_factory=dict)

    def next_step(self) -> str | Status:
        with self.lock:
            return self.steps.pop(0) if self.steps else OK

    def open_now(self) -> int:
        with self.lock:
            return len(self.open_sockets)

    def drop_all(self) -> None:
        """Closes every open connection from the server's side (each handler then sees EOF and ends)."""
        with self.lock:
            sockets = list(self.open_sockets.values())
        for sock in sockets:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    script: Script

    def setup(self) -> None:
        super().setup()
        with self.script.lock:
            self.script.opened += 1
            self.number = self.script.opened
            self.script.open_sockets[self.number] = self.connection

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.script.lock:
                self.script.open_sockets.pop(self.number, None)

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        step = self.script.next_step()
        with self.script.lock:
            self.script.seen.append(
                Seen(self.number, self.command, self.path, body, self.headers.get("Authorization"))
            )
        if step == VANISH:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if step == RESET:  # SO_LINGER 0: the close sends RST, not FIN
            self.close_connection = True
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            return
        if step == HOLD:
            self.script.held.set()
            self.script.release.wait(10)
        code = step.code if isinstance(step, Status) else 200
        answer = json.dumps(
            {"connection": self.number, "method": self.command, "path": self.path, "body": body.decode(),
             "authorization": self.headers.get("Authorization"), "client": self._client_cn()}
        ).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        if isinstance(step, Status) and step.retry_after is not None:
            self.send_header("Retry-After", step.retry_after)
        if step == CLOSE:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(answer)

    def _client_cn(self) -> str | None:
        if not isinstance(self.connection, ssl.SSLSocket):
            return None
        peer = self.connection.getpeercert()
        subject: Any = (peer or {}).get("subject", ())
        return {key: value for rdn in subject for key, value in rdn}.get("commonName")

    do_GET = do_PATCH = do_POST = do_PUT = do_DELETE = _serve

    def log_message(self, format: str, *args: object) -> None:
        return


@contextmanager
def scripted_server(pki: Pki | None = None) -> Iterator[tuple[str, Script]]:
    """Serves on 127.0.0.1 (a random port; HTTPS with `pki`'s server certificate, client certificates verified when
    sent) until the block ends; yields its URL and its script."""
    script = Script()

    class Handler(_Handler):
        pass

    Handler.script = script

    class Server(ThreadingHTTPServer):
        request_queue_size = 128  # 64 callers connect at once (the default backlog of 5 drops SYNs: 1 s retries)

    server = Server(("127.0.0.1", 0), Handler)
    scheme = "http"
    if pki is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki.path("server.crt"), pki.path("server.key"))
        context.load_verify_locations(pki.path("ca.crt"))
        context.verify_mode = ssl.CERT_OPTIONAL
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}", script
    finally:
        script.release.set()
        script.drop_all()
        server.shutdown()
        server.server_close()
        thread.join(10)


@dataclass
class RawServer:
    """A server that answers each request (read up to its empty line and its Content-Length) with the next of
    `answers`, byte for byte; `(bytes, True)` closes the connection once written (FIN). A connection whose next answer
    is missing stays open, unanswered (until the server stops). `received`: every request's bytes, in order."""

    port: int
    answers: list[bytes | tuple[bytes, bool]] = field(default_factory=list)
    received: list[bytes] = field(default_factory=list)
    connections: list[socket.socket] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _next(self) -> bytes | tuple[bytes, bool] | None:
        with self.lock:
            return self.answers.pop(0) if self.answers else None

    def serve(self, conn: socket.socket, stop: threading.Event) -> None:
        buf = b""
        with conn:
            while not stop.is_set():
                while b"\r\n\r\n" not in buf:
                    try:
                        more = conn.recv(65536)
                    except OSError:
                        return
                    if not more:
                        return
                    buf += more
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(buf) < length:
                    more = conn.recv(65536)
                    if not more:
                        return
                    buf += more
                with self.lock:
                    self.received.append(head + b"\r\n\r\n" + buf[:length])
                buf = buf[length:]
                answer = self._next()
                if answer is None:
                    stop.wait()  # held open, unanswered
                    return
                data, close = answer if isinstance(answer, tuple) else (answer, False)
                try:
                    conn.sendall(data)
                    if close:
                        conn.shutdown(socket.SHUT_RDWR)
                        return
                except OSError:
                    return  # the client closed first (it refused what it read so far)


@contextmanager
def raw_server() -> Iterator[RawServer]:
    """A `RawServer` on 127.0.0.1 (a random port), a thread per connection, until the block ends."""
    listener = socket.create_server(("127.0.0.1", 0))
    server = RawServer(listener.getsockname()[1])
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # the listener closed: the server stops
            with server.lock:
                server.connections.append(conn)
            thread = threading.Thread(target=server.serve, args=(conn, stop), daemon=True)
            thread.start()
            threads.append(thread)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield server
    finally:
        stop.set()
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        acceptor.join(10)
        with server.lock:
            connections = list(server.connections)
        for conn in connections:  # a connection the client kept open: its thread's read ends
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(10)
