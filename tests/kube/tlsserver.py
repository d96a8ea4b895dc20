"""A small HTTPS server for the connection tests: a throwaway CA (openssl, EC keys: fast), a serving certificate
for 127.0.0.1 and `kube.test`, a client certificate, and a handler that answers what it saw of the caller (the
Authorization header, the verified client certificate's CN)."""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Pki:
    directory: Path

    def path(self, name: str) -> Path:
        return self.directory / name


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(directory: Path) -> Pki:
    """ca.crt/ca.key, server.crt/.key (SAN IP:127.0.0.1, DNS:kube.test), client.crt/.key (CN node-agent)."""
    directory.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=test-ca",
             cwd=directory)
    (directory / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:kube.test\n")
    (directory / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subject in (("server", "/CN=kube-apiserver"), ("client", "/CN=node-agent")):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=directory)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=directory)
    return Pki(directory)


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        peer = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
        client = None
        if peer:
            subject: Any = peer.get("subject", ())  # ((("commonName", "node-agent"),), ...)
            fields = {key: value for rdn in subject for key, value in rdn}
            client = fields.get("commonName")
        body = json.dumps({"authorization": self.headers.get("Authorization"), "client": client}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


@contextmanager
def https_server(pki: Pki) -> Iterator[str]:
    """Serves on 127.0.0.1 (a random port) until the block ends; yields its URL. Client certificates signed by
    the CA are verified when sent (optional)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.path("server.crt"), pki.path("server.key"))
    context.load_verify_locations(pki.path("ca.crt"))
    context.verify_mode = ssl.CERT_OPTIONAL
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
