"""A load-generating client for `bench.prepare_bench`, run as its own process (`python -m bench.prepare_load`).

Why a process of its own: callers in the benchmark's process (or the plugin's) would share a GIL with whatever
else runs there, and the time they wait for it would be counted as the plugin's. The benchmark starts a few of
these, each with its own gRPC channel and HTTP connection pool, and hands each a share of every round.

Protocol: JSON lines. The process prints `{"ready": true}` once its channel is connected and its threads exist,
then reads one command per line from stdin and answers each with one line on stdout:

    {"op": "prepare" | "unprepare", "claims": [[namespace, name, uid], ...]}
        -> {"calls": [[start, end], ...], "errors": [...]}   one single-claim call per claim, all at once
    {"op": "grpc_get", "path": "/apis/...", "calls": N}
        -> {"calls": [[start, end], ...], "errors": []}      N times (empty NodePrepareResources + GET of path;
                                                            an empty path: the gRPC call alone)

`start`/`end` are `time.monotonic()` readings: CLOCK_MONOTONIC, one clock for every process of the machine, so
the benchmark takes a round's wall time across its clients as max(end) - min(start).

    python -m bench.prepare_load --socket PATH --kubeconfig PATH --threads N
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from dra_driver._gen import dra_v1_pb2 as pb
from dra_driver._gen import dra_v1_pb2_grpc as pb_grpc
from dra_driver.k8s.client import KubeRest
from dra_driver.k8s.kubeconfig import load_connection
from dra_driver.k8s.transport import HttpTransport


def rest_client(kubeconfig: str, pool_size: int) -> KubeRest:
    """A client whose urllib3 pool keeps a connection per caller thread: the floor's GETs pay no reconnects (at least
    `pool_size` connections, whatever the product's default)."""
    return KubeRest(HttpTransport.for_connection(load_connection(kubeconfig), maxsize=pool_size))


class Client:
    def __init__(self, socket: str, kubeconfig: str, threads: int) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.stub = pb_grpc.DRAPluginStub(self.channel)
        self.rest = rest_client(kubeconfig, threads)
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="load")
        # Every thread exists before the first timed round (the pool starts threads lazily, one per submit while
        # none is idle): each task waits at the barrier until all `threads` of them run at once.
        barrier = threading.Barrier(threads)
        list(self.pool.map(lambda _: barrier.wait(), range(threads)))
        self.stub.NodePrepareResources(pb.NodePrepareResourcesRequest(), timeout=30)

    def timed(self, calls: list[Callable[[], None]]) -> dict[str, Any]:
        def one(call: Callable[[], None]) -> tuple[float, float, str]:
            start = time.monotonic()
            try:
                call()
                error = ""
            except Exception as exc:  # reported to the benchmark, which aborts on it
                error = repr(exc)
            return start, time.monotonic(), error

        done = list(self.pool.map(one, calls))
        return {"calls": [[s, e] for s, e, _ in done], "errors": [err for _, _, err in done if err]}

    def claim_call(self, op: str, ref: list[str]) -> Callable[[], None]:
        claim = pb.Claim(namespace=ref[0], name=ref[1], uid=ref[2])

        def call() -> None:
            if op == "prepare":
                resp = self.stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[claim]), timeout=60)
            else:
                resp = self.stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=[claim]), timeout=60)
            if resp.claims[claim.uid].error:
                raise RuntimeError(resp.claims[claim.uid].error)

        return call

    def grpc_get(self, path: str) -> Callable[[], None]:
        def call() -> None:
            self.stub.NodePrepareResources(pb.NodePrepareResourcesRequest(), timeout=30)
            if path:
                self.rest.get(path)

        return call

    def handle(self, command: dict[str, Any]) -> dict[str, Any]:
        op = command["op"]
        if op in ("prepare", "unprepare"):
            return self.timed([self.claim_call(op, ref) for ref in command["claims"]])
        if op == "grpc_get":
            return self.timed([self.grpc_get(command["path"])] * int(command["calls"]))
        raise ValueError(f"unknown op {op!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--threads", type=int, required=True)
    args = parser.parse_args()
    client = Client(args.socket, args.kubeconfig, args.threads)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(client.handle(json.loads(line))), flush=True)
    client.pool.shutdown()
    client.channel.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
