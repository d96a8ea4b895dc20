"""The product's one HTTP server for Prometheus and the probes, on prometheus_client's WSGI app.

`GET /metrics` is prometheus_client's `make_wsgi_app` (Prometheus text or OpenMetrics as the scraper's Accept
asks, gzip when accepted, `name[]` filters); with a probe, `GET /healthz`, `/livez` and `/readyz` answer 200 or
503 with the probe's one-line reason (a separate liveness probe, where given, answers `/livez`: a kubelet plugin
waiting for its GPU driver is alive but not ready); any other path is 404. Served by the standard library's WSGI
server in prometheus_client's threading variant (one thread per request, so a slow scrape never holds up a probe).

Used by the kubelet plugin and the compute-domain kubelet plugin (`--healthz-port`: probes and metrics;
`--metrics-port`: metrics) and by the controller (`--metrics-port`; its `/healthz` is kopf's own, answered inside
kopf's event loop: docs/architecture.md "HTTP endpoints").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

# (healthy, reason): the reason is the body, one line.
Probe = Callable[[], tuple[bool, str]]
PROBE_PATHS = frozenset({"/healthz", "/livez", "/readyz"})
StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # scrapes and probes would flood the logs
        return


def _text(start_response: StartResponse, status: str, body: str) -> list[bytes]:
    data = body.encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(data)))])
    return [data]


def application(registry: CollectorRegistry | None, probe: Probe | None, liveness: Probe | None = None) -> WsgiApp:
    """The WSGI app: /metrics when `registry` is given, the probe paths when `probe` is (`/livez` asks `liveness`
    where given)."""
    metrics = make_wsgi_app(registry) if registry is not None else None

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics" and metrics is not None:
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        if path in PROBE_PATHS and probe is not None:
            if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
                return _text(start_response, "405 Method Not Allowed", "use GET\n")
            ok, reason = liveness() if path == "/livez" and liveness is not None else probe()
            return _text(start_response, "200 OK" if ok else "503 Service Unavailable", reason + "\n")
        return _text(start_response, "404 Not Found", f"no such path: {path}\n")

    return app


class HttpEndpoint:
    """One listening port serving `application(registry, probe)` from a daemon thread; `port=0` picks a free
    port (`.port` says which). Binding happens in the constructor, so a taken port fails there (wrap it in
    `dra_driver.ports.listening` to name the flag)."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        probe: Probe | None = None,
        liveness: Probe | None = None,
        host: str = "0.0.0.0",  # noqa: S104 - scraped and probed over the pod network
        port: int = 0,
        name: str = "http",
    ) -> None:
        self._server = make_server(
            host,
            port,
            application(registry, probe, liveness),
            server_class=ThreadingWSGIServer,
            handler_class=_QuietHandler,
        )
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever: forever if start() never ran
            self._server.shutdown()
        self._server.server_close()
