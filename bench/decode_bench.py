"""The JSON decoder for LIST bodies: stdlib `json` vs orjson vs msgspec on the fleet's real ResourceSlice LIST.

Builds the slices of N fake nodes exactly as `bench/fleet_bench.py` publishes them (the plugin's own
`build_slices`, GPU UUIDs unique per node), encodes them as pages of PAGE slices and as the objects of watch-list
events (one decode per slice), and times each decoder over the same bytes (best of RUNS, GC off as
`dra-driver explain` runs). Decoders that are not installed are skipped. What the product uses is
`dra_driver.k8s.client.decode_json`, and for slices it may leave out the light view of `allocation/prune.py`
(docs/benchmarks.md, "Explain over the fleet").

    .venv/bin/python -m bench.decode_bench              # 100 nodes
    FLEET_NODES=300 .venv/bin/python -m bench.decode_bench
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

from bench.common import SHORT, emit
from bench.fleet_bench import LAST_PRESET, PRESETS, _inventories, _node_slices
from dra_driver.allocation.prune import _LIGHT
from dra_driver.k8s.client import decode_json

RUNS = 3
PAGE = 500


def _decoders() -> dict[str, Callable[[bytes], Any]]:
    out: dict[str, Callable[[bytes], Any]] = {"stdlib json": json.loads}
    try:
        orjson = importlib.import_module("orjson")
        out["orjson"] = orjson.loads
    except ImportError:
        pass
    try:
        msgspec_json = importlib.import_module("msgspec.json")
        out["msgspec"] = msgspec_json.Decoder().decode
    except ImportError:
        pass
    out["product (decode_json)"] = decode_json
    # What `explain` decodes of a slice whose pool it may leave out: pool and attributes, values left encoded.
    out["msgspec light view (prune.py)"] = _LIGHT.decode
    return out


def _best(fn: Callable[[], object]) -> float:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(min(times), 4)


def run() -> dict[str, Any]:
    n = int(os.environ.get("FLEET_NODES") or (20 if SHORT else 100))
    inventories = _inventories()
    slices = []
    for i in range(n):
        preset = LAST_PRESET if i == n - 1 else PRESETS[i % len(PRESETS)]
        slices.extend(_node_slices(inventories, f"fleet-{i:04d}", preset, i))
    pages = [
        json.dumps({"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1", "metadata": {},
                    "items": slices[i:i + PAGE]}, separators=(",", ":")).encode()
        for i in range(0, len(slices), PAGE)
    ]
    lines = [json.dumps(s, separators=(",", ":")).encode() for s in slices]  # each event's object
    size = sum(len(p) for p in pages)
    out: dict[str, Any] = {"nodes": n, "slices": len(slices), "list_mb": round(size / 1e6, 1)}
    gc.disable()
    try:
        for name, decode in _decoders().items():
            if name.startswith("msgspec light"):
                out[name] = {"events_s": _best(lambda decode=decode: [decode(line) for line in lines])}  # type: ignore[misc]
                continue
            pages_s = _best(lambda decode=decode: [decode(p) for p in pages])  # type: ignore[misc]
            lines_s = _best(lambda decode=decode: [decode(line) for line in lines])  # type: ignore[misc]
            out[name] = {"pages_s": pages_s, "events_s": lines_s, "mb_per_s": round(size / 1e6 / pages_s)}
            gc.collect()
    finally:
        gc.enable()
    return out


if __name__ == "__main__":
    emit("decoders: the fleet's ResourceSlice LIST body (pages of 500 and watch-list events)", run())
