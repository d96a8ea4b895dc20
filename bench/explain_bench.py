"""`dra-driver explain NS/CLAIM` over every node of a fleet: wall time and peak RSS of the real command, and its
client side alone.

The fleet is bench/fleet_bench.py's (sandbox API server in its own process; N fake nodes of mixed presets, dynamic
MIG, the last node the only hgx-h200; GPU UUIDs unique per node). Two claims: one that fits nowhere
(`productName == 'NVIDIA B200'`) and one that fits only on the last node (`'NVIDIA H200'`). Measured:

- `cli`: the command as a user runs it, one process per run (`python -m dra_driver.cli explain ...`, interpreter
  start and imports included; `os.wait4` gives its own peak RSS), in the modes
  `default` (paged LIST, pools pruned before parsing), `watch_list` (`--watch-list`, pruned), `all_devices` (every
  device parsed and accounted for) and, with BEFORE_TREE=<a dra_driver tree> (e.g. `git archive <rev> dra_driver`),
  `before` (that tree's code, the same server and load);
- `client_only`: the bytes of the watch-list fetched once (`fetch_s`: the sandbox server's rendering and the
  transfer, nothing decoded), then decoding them, sieving and explaining in this process, GC off as the command
  runs (`decode_sieve_s`, `pass_s`): the client's own cost without the sandbox server's Python rendering, which a
  real kube-apiserver serves from its watch cache;
- `startup_s`: a process that only imports the command (the floor of every `cli` figure);
- the machine's load average (`uptime`) before and after.

    FLEET_NODES=300 .venv/bin/python -m bench.explain_bench
    BENCH_SHORT=1 .venv/bin/python -m bench.explain_bench          # 30 nodes
    EXPLAIN_OFFLINE=1 FLEET_NODES=1000 .venv/bin/python -m bench.explain_bench   # the client pass alone
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from bench.common import SHORT, emit
from bench.fleet_bench import LAST_PRESET, PRESETS, _claim, _inventories, _node_slices, _publish
from bench.prepare_bench import api_server_process
from dra_driver.allocation.prune import PoolSieve, claim_reach
from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.commands.explain import explain_claim
from dra_driver.commands.listing import list_all
from dra_driver.defaults import DRIVER_NAME
from dra_driver.k8s.client import KubeRest
from dra_driver.observability.logging import configure_logging
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.kubelet.nodestatus import ready_node

RESOURCE = "/apis/resource.k8s.io/v1"
CLAIMS = {"nowhere": ("fits-nowhere", "NVIDIA B200"), "last": ("fits-last", "NVIDIA H200")}
CLI = "import sys; from dra_driver.cli import main; sys.exit(main())"


class _Event(msgspec.Struct, frozen=True):
    type: str
    object: msgspec.Raw


_EVENT = msgspec.json.Decoder(_Event)


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _cli(kubeconfig: Path, claim: str, extra: list[str], python_path: str | None = None) -> dict[str, Any]:
    env = dict(os.environ)
    if python_path:
        env["PYTHONPATH"] = python_path
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, "explain", f"default/{claim}", "--kubeconfig", str(kubeconfig), *extra],
        stdout=subprocess.DEVNULL, env=env, cwd=kubeconfig.parent,  # not the checkout: `-c` puts the cwd first
    )
    _, status, usage = os.wait4(proc.pid, 0)
    return {"s": round(time.perf_counter() - start, 3), "rss_mib": round(usage.ru_maxrss / 1024, 1),
            "rc": os.waitstatus_to_exitcode(status)}


def _startup() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import dra_driver.commands.explain, dra_driver.allocation"],
                   check=True)
    return round(time.perf_counter() - start, 3)


def _client_only(rest: KubeRest, claims: dict[str, dict[str, Any]]) -> dict[str, Any]:
    query: dict[str, str | int | bool] = {"watch": "true", "sendInitialEvents": "true", "allowWatchBookmarks": "true",
             "resourceVersionMatch": "NotOlderThan", "resourceVersion": "", "timeoutSeconds": 300}
    start = time.perf_counter()
    response = rest.send_streaming("GET", f"{RESOURCE}/resourceslices", query=query, timeout=315)
    lines: list[bytes] = []
    pending = b""
    for chunk in response.stream(1 << 16):
        pending += chunk
        *whole, pending = pending.split(b"\n")
        lines.extend(whole)
        if whole and b"initial-events-end" in whole[-1]:
            break
    with contextlib.suppress(RuntimeError):  # already back in the pool when the server ended the stream
        response.shutdown()
    response.release_conn()
    fetch_s = time.perf_counter() - start
    nodes = list_all(rest, "/api/v1/nodes")
    classes = list_all(rest, f"{RESOURCE}/deviceclasses")
    return {"fetch_s": round(fetch_s, 3), **_client_pass(lines, nodes, classes, claims)}


def _client_pass(lines: list[bytes], nodes: list[dict[str, Any]], classes: list[dict[str, Any]],
                 claims: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Decode the watch-list event lines, sieve and explain, as the command does (GC off), per claim."""
    out: dict[str, Any] = {"mb": round(sum(map(len, lines)) / 1e6, 1)}
    runs = [(name, claim, True) for name, claim in claims.items()]
    runs += [(f"{name}_all_devices", claim, False) for name, claim in claims.items()]
    for name, claim, prune in runs:
        gc.collect()
        gc.disable()
        try:
            cel = DraCelEnvironment()
            start = time.perf_counter()
            sieve = PoolSieve(claim_reach(claim, classes, cel=cel) if prune else None)
            for line in lines:  # as k8s/liststream.py hands them to the command: the event's object undecoded
                event = _EVENT.decode(line)
                if event.type == "ADDED":
                    sieve.add_encoded(bytes(event.object))
            kept, pruned = sieve.result()
            sieved = time.perf_counter()
            fits, _ = explain_claim(claim, nodes=nodes, classes=classes, slices=kept, claims=[], namespace_labels={},
                                    prune=False, pruned_before=pruned, cel=cel)
            done = time.perf_counter()
        finally:
            gc.enable()
        out[name] = {"decode_sieve_s": round(sieved - start, 3), "pass_s": round(done - sieved, 3),
                     "total_s": round(done - start, 3), "kept_slices": len(kept), "pruned_slices": pruned.slices,
                     "fits": len(fits)}
    return out


def offline(n: int) -> dict[str, Any]:
    """The client pass alone, on watch-list lines rendered here (no API server): for fleets whose publishing
    through the sandbox server would take too long on a shared machine (EXPLAIN_OFFLINE=1)."""
    inventories = _inventories()
    lines: list[bytes] = []
    nodes = []
    for i in range(n):
        preset = LAST_PRESET if i == n - 1 else PRESETS[i % len(PRESETS)]
        node = f"fleet-{i:04d}"
        nodes.append(ready_node(node, {"preset": preset}))
        for raw in _node_slices(inventories, node, preset, i):
            raw["metadata"].update(uid=f"uid-{len(lines)}", resourceVersion=str(len(lines) + 1))
            lines.append(json.dumps({"type": "ADDED", "object": raw}, separators=(",", ":")).encode())
    claims = {key: _claim(name, product) for key, (name, product) in CLAIMS.items()}
    return {"load_at_start": _load(), "nodes": n, "slices": len(lines),
            **_client_pass(lines, nodes, device_classes(DRIVER_NAME), claims), "load_at_end": _load()}


def run() -> dict[str, Any]:
    configure_logging("critical", "text")
    n = int(os.environ.get("FLEET_NODES") or (30 if SHORT else 300))
    before_tree = os.environ.get("BEFORE_TREE")
    out: dict[str, Any] = {"load_at_start": _load()}
    with tempfile.TemporaryDirectory() as tmp, api_server_process(Path(tmp)) as rest:
        kubeconfig = Path(tmp) / "kubeconfig"
        for cls in device_classes(DRIVER_NAME):
            rest.request("POST", f"{RESOURCE}/deviceclasses", body=cls)
        out["fleet"] = _publish(rest, _inventories(), n)
        claims = {key: _claim(name, product) for key, (name, product) in CLAIMS.items()}
        for claim in claims.values():
            rest.request("POST", f"{RESOURCE}/namespaces/default/resourceclaims", body=claim)
        out["load_after_publish"] = _load()
        # The sandbox server renders each object on its first LIST and serves cached bytes afterwards; a real
        # kube-apiserver serves from its watch cache all along. One unmeasured LIST first, so no mode pays it.
        start = time.perf_counter()
        rest.request_bytes("GET", f"{RESOURCE}/resourceslices")
        out["server_first_list_s"] = round(time.perf_counter() - start, 3)
        out["startup_s"] = _startup()
        modes: dict[str, tuple[list[str], str | None]] = {
            "default": ([], None), "watch_list": (["--watch-list"], None), "all_devices": (["--all-devices"], None),
        }
        if before_tree:
            modes["before"] = ([], before_tree)
        wanted = os.environ.get("EXPLAIN_MODES")  # e.g. "default,before"
        if wanted:
            modes = {k: v for k, v in modes.items() if k in wanted.split(",")}
        cli: dict[str, Any] = {}
        for mode, (extra, tree) in modes.items():
            for key, (name, _) in CLAIMS.items():
                cli[f"{mode}/{key}"] = _cli(kubeconfig, name, extra, tree)
        out["cli"] = cli
        out["client_only"] = _client_only(rest, claims)
    out["load_at_end"] = _load()
    return out


if __name__ == "__main__":
    count = int(os.environ.get("FLEET_NODES") or (30 if SHORT else 300))
    if os.environ.get("EXPLAIN_OFFLINE") == "1":
        emit(f"explain's client pass over {count} nodes (no API server)", offline(count))
    else:
        emit(f"explain over all {count} nodes", run())
