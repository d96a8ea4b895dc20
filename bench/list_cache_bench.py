"""The sandbox API server's LIST of every ResourceSlice of N fake nodes: what the server spends serving it.

The server runs in its own process (`dra-sandbox apiserver`); this process publishes the fleet of
`bench/fleet_bench.py` (same presets, slices and unique GPU UUIDs), then GETs every slice, unpaged and in pages of
500, reading the bytes only (no JSON decode: the client's side is not measured here). Per LIST: wall time to the
last byte, the server process's CPU seconds over it (its rendering and writing; /proc/<pid>/stat), bytes; the
first LIST after publishing renders every object (a cold cache), the next ones are served from the per-object
encodings (`apiserver/encoding.py`). Also the server's RSS after publishing and after the LISTs, and the load.

    .venv/bin/python -m bench.list_cache_bench --nodes 300
    LIST_BENCH_SERVER_TREE=/work/main .venv/bin/python -m bench.list_cache_bench --nodes 300   # the server of
        # another checkout (its `sandbox` and root first on the server's PYTHONPATH): a before/after pair
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import SHORT, emit
from bench.fleet_bench import RESOURCE, _inventories, _publish
from bench.prepare_bench import api_server_subprocess
from dra_driver.defaults import DRIVER_NAME
from dra_driver.k8s.client import connect
from dra_driver.k8s.kubeconfig import load_connection
from dra_sandbox.deviceclasses import device_classes

SLICES = f"{RESOURCE}/resourceslices"
PAGE = 500
_CONTINUE = re.compile(rb'"continue":"([^"]+)"')
_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def _get(url: str) -> bytes:
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        data: bytes = resp.read()
        return data


def _list(base: str, pid: int, *, paged: bool) -> dict[str, Any]:
    start, cpu = time.perf_counter(), _cpu_s(pid)
    size = pages = 0
    token = ""
    while True:
        query = f"?limit={PAGE}" + (f"&continue={token}" if token else "") if paged else ""
        body = _get(base + SLICES + query)
        size, pages = size + len(body), pages + 1
        found = _CONTINUE.search(body[:2048])  # the list's metadata comes before its items
        if not paged or found is None:
            break
        token = found.group(1).decode()
    return {"wall_s": round(time.perf_counter() - start, 3), "server_cpu_s": round(_cpu_s(pid) - cpu, 3),
            "bytes": size, "pages": pages}


@contextlib.contextmanager
def _server_tree(tree: str | None) -> Iterator[None]:
    """PYTHONPATH for the server process only (api_server_subprocess passes this process's environment on)."""
    before = os.environ.get("PYTHONPATH")
    if tree:
        os.environ["PYTHONPATH"] = os.pathsep.join([f"{tree}/sandbox", tree, *([before] if before else [])])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


def run(n: int, tree: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"nodes": n, "server_tree": tree or "this checkout"}
    inventories = _inventories()
    with tempfile.TemporaryDirectory() as tmp, _server_tree(tree), api_server_subprocess(Path(tmp)) as server:
        rest = connect(str(server.kubeconfig), timeout=600)
        base = load_connection(str(server.kubeconfig)).server
        for cls in device_classes(DRIVER_NAME):
            rest.request("POST", f"{RESOURCE}/deviceclasses", body=cls)
        out["fleet"] = _publish(rest, inventories, n)
        out["server_rss_mib_after_publish"] = _rss_mib(server.pid)
        out["load_before"] = [round(x, 2) for x in os.getloadavg()]
        lists = {
            "unpaged_first": _list(base, server.pid, paged=False),
            "unpaged_again": _list(base, server.pid, paged=False),
            "paged_500": _list(base, server.pid, paged=True),
            "unpaged_third": _list(base, server.pid, paged=False),
        }
        out["list"] = lists
        out["server_rss_mib_after_lists"] = _rss_mib(server.pid)
        out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=50 if SHORT else 1000)
    args = parser.parse_args()
    tree = os.environ.get("LIST_BENCH_SERVER_TREE") or None
    emit(f"sandbox API server: LIST of every ResourceSlice of {args.nodes} fake nodes", run(args.nodes, tree))


if __name__ == "__main__":
    main()
