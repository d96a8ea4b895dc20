"""HTTP health endpoint for the chart's probes: /healthz is 200 only while both kubelet sockets answer."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Probe = Callable[[], tuple[bool, str]]


class HealthEndpoint:
    def __init__(self, probe: Probe, host: str = "0.0.0.0", port: int = 51515) -> None:  # noqa: S104 - pod network
        self._probe = probe
        handler = self._handler()
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="healthz", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        probe = self._probe

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] not in ("/healthz", "/livez", "/readyz"):
                    self.send_error(404)
                    return
                ok, reason = probe()
                body = (reason + "\n").encode()
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        return Handler
