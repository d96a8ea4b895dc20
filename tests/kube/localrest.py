"""A KubeRest client on a local threaded HTTP server whose answers a test writes as a request handler (for what the
sandbox API server does not do on its own: scripted pages, protobuf, dropped streams)."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from typing import Any

from dra_driver.k8s.client import KubeRest
from dra_driver.k8s.kubeconfig import ApiConnection


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """A handler that keeps the test's output free of the server's access log."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def rest_serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[KubeRest]:
    """A client of a server answering with `handler`; the server is shut down and closed afterwards."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        with KubeRest(ApiConnection(server=f"http://127.0.0.1:{httpd.server_address[1]}"), timeout=5) as rest:
            yield rest
    finally:
        httpd.shutdown()
        httpd.server_close()
