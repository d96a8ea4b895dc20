"""CPU of one API request from the plugin's side: the product's client beside http.client and the socket floor.

The kubelet plugin sends three requests per whole-GPU claim (the claim GET on the call path, the `status.devices`
PATCH after a prepare and after an unprepare). The in-process profile (`bench.prepare_profile`) puts them at
≈ 0.6-0.8 ms of CPU each, on cProfile's clock, which inflates many small calls. This measures the same request
without a profiler: the client's own CPU (`time.process_time`, one thread, nothing else running in it) per GET of
a ResourceClaim-sized object and per merge PATCH, from the sandbox API server in its own process, four ways:

- `product`: `dra_driver.k8s.client.KubeRest` as the plugin sends (the transport's keep-alive pool and its own
  HTTP/1.1 exchange, `dra_driver.k8s.transport.KeepAlivePool`);
- `urllib3`: the same `KubeRest` over urllib3 alone, the transport before the keep-alive pool (what it still uses
  for streams, proxies and redirects), over a kept-alive connection too;
- `http.client`: the stdlib's kept-alive `HTTPConnection` with the same headers, the body decoded as the product
  decodes it (the transport's pool ran on it before its own exchange; no pool, no retries);
- `socket floor`: the request's bytes written and the answer read on a raw socket, the body decoded: the
  kernel's and the decoder's share, which no HTTP client takes off.

Medians of ROUNDS rounds of N requests each; the server's CPU is not counted (it is another process).

    .venv/bin/python -m bench.http_bench
"""

from __future__ import annotations

import http.client
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.common import SHORT, emit
from bench.prepare_bench import api_server_subprocess
from dra_driver.k8s.client import KubeRest, connect, decode_json, encode_json
from dra_driver.k8s.kubeconfig import load_connection
from dra_driver.k8s.transport import ConnectionAuth, HttpTransport, connection_pool

ROUNDS = 3 if SHORT else 7
N = 200 if SHORT else 1000
NAMESPACE = "http-bench"
CLAIM = "claim-0"
PATH = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/{CLAIM}"


def _claim() -> dict[str, Any]:
    """A claim as the plugin reads it at prepare: one whole GPU allocated, reserved for one pod."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": CLAIM, "namespace": NAMESPACE, "labels": {"app": "bench"}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
    }


def _status() -> dict[str, Any]:
    results = [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-0", "device": "gpu-0"}]
    return {
        "allocation": {
            "devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["node-0"]}]}]},
        },
        "reservedFor": [{"resource": "pods", "name": "pod-0", "uid": "4f6c2a1e-0d7b-4c3e-9a55-2b8f1e0c7d11"}],
    }


def _cpu_us(request: Callable[[], object]) -> float:
    for _ in range(N // 10):  # connection made, caches warm
        request()
    rounds = []
    for _ in range(ROUNDS):
        start = time.process_time()
        for _ in range(N):
            request()
        rounds.append((time.process_time() - start) / N * 1e6)
    return round(statistics.median(rounds), 1)


def _urllib3_rest(kubeconfig: Path) -> KubeRest:
    """`KubeRest` over urllib3 alone (no keep-alive pool): the product's transport before it."""
    connection = load_connection(str(kubeconfig))
    pool = connection_pool(connection, environ={}, maxsize=8)
    return KubeRest(HttpTransport(connection.server, pool, ConnectionAuth(connection)))


def _http_client(rest: KubeRest) -> Callable[[], object]:
    parts = urlsplit(rest.transport.server)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port)
    headers = {"Accept": "application/json", "User-Agent": rest.user_agent, **rest.transport.auth.headers()}

    def get() -> object:
        conn.request("GET", PATH, headers=headers)
        response = conn.getresponse()
        return decode_json(response.read())

    return get


def _socket_floor(rest: KubeRest) -> Callable[[], object]:
    parts = urlsplit(rest.transport.server)
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    lines = [f"GET {PATH} HTTP/1.1", f"Host: {parts.netloc}", "Accept: application/json"]
    lines += [f"{k}: {v}" for k, v in rest.transport.auth.headers().items()]
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode()

    def get() -> object:
        sock.sendall(raw)
        buf = sock.recv(1 << 16)
        head, _, body = buf.partition(b"\r\n\r\n")
        length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")).split(b":")[1])
        while len(body) < length:
            body += sock.recv(1 << 16)
        return decode_json(body)

    return get


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="http-bench-") as tmp, api_server_subprocess(Path(tmp)) as server:
        rest = connect(str(server.kubeconfig))
        rest.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": NAMESPACE}})
        rest.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims", body=_claim())
        claim = rest.request("GET", PATH)
        claim["status"] = _status()
        rest.request("PUT", PATH + "/status", body=claim)
        size = len(encode_json(rest.request("GET", PATH)))
        patch = {"metadata": {"annotations": {"bench": "x"}}}
        out: dict[str, Any] = {"claim_bytes": size, "requests_per_round": N, "rounds": ROUNDS}
        legacy = _urllib3_rest(server.kubeconfig)
        for name, client in (("product", rest), ("urllib3", legacy)):
            out[f"{name} GET cpu_us"] = _cpu_us(partial(client.get, PATH))
            out[f"{name} merge PATCH cpu_us"] = _cpu_us(
                partial(client.request, "PATCH", PATH, body=patch, content_type="application/merge-patch+json"))
        legacy.close()
        out["http.client GET cpu_us"] = _cpu_us(_http_client(rest))
        out["socket floor GET cpu_us"] = _cpu_us(_socket_floor(rest))
        rest.close()
        return out


if __name__ == "__main__":
    emit("one API request's CPU in the client (sandbox API server in its own process)", run())
