"""HTTP endpoint for the chart's probes and for Prometheus: /healthz (and /livez, /readyz) is 200 only while
both kubelet sockets answer; /metrics serves the plugin's metrics."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from dra_driver import defaults

Probe = Callable[[], tuple[bool, str]]


class HealthEndpoint:
    def __init__(
        self,
        probe: Probe,
        host: str = "0.0.0.0",  # noqa: S104 - the pod network, where the kubelet's probes come from
        port: int = defaults.HEALTHZ_PORT,
        metrics: Callable[[], bytes] | None = None,
    ) -> None:
        self._probe = probe
        self._metrics = metrics
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="healthz", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever: forever if start() never ran
            self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        probe, metrics = self._probe, self._metrics

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the name http.server dispatches on
                path = self.path.split("?", 1)[0]
                if path == "/metrics" and metrics is not None:
                    self._reply(200, metrics(), "text/plain; version=0.0.4; charset=utf-8")
                    return
                if path not in ("/healthz", "/livez", "/readyz"):
                    self.send_error(404)
                    return
                ok, reason = probe()
                self._reply(200 if ok else 503, (reason + "\n").encode(), "text/plain; charset=utf-8")

            def _reply(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # probes would flood the logs
                return

        return Handler
