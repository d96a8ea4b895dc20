"""ResourceSlice publishing under API errors: time until the API holds exactly the desired slices.

The publisher runs as in the plugin (its loop and watch threads) against the sandbox API server, for a fake
dgx-h100 in dynamic MIG mode (208 devices in 5 slices). Two phases per run:
  initial  publisher start, empty pool → the 5 slices at generation 1;
  change   one GPU disappears → the new content at generation 2 (written beside generation 1, which is then
           deleted).
Converged = the API holds exactly the desired slices: one generation, nothing else (read from the server's
store, not over HTTP, so the measurement itself is never faulted). Conditions:
  clean          no faults;
  faults_20pct   each request of the publisher (list/get/create/update/delete) fails with probability 0.2,
                 answering 500 or 409 (seeded; one seed per repetition);
  outage_503     every request fails with 503 (+ Retry-After: 1, which urllib3 honours by itself) for
                 OUTAGE seconds from the start of each phase, then the API recovers;
  outage_500     the same with 500 (no Retry-After: only the publisher's own backoff).
Figures are printed, never asserted. `generations_written` comes from the API server's watch history: every
generation any slice was ever written at (a pass that failed must not add one).

    .venv/bin/python -m bench.publish_convergence_bench
    BENCH_SHORT=1 .venv/bin/python -m bench.publish_convergence_bench
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.common import SHORT, emit
from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.k8s.client import JsonObject
from dra_driver.nvml.factory import open_backend
from dra_driver.observability.logging import configure_logging
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_driver.slices.publisher import SLICES_PATH, SlicePublisher
from dra_sandbox.apiserver import ApiServer, ChaosFaults

DRIVER, NODE = DRIVER_NAME, "bench-node"
OUTAGE_S = 3.0 if SHORT else 30.0
REPEATS = 2 if SHORT else 7
PUBLISHER_VERBS = ("list", "get", "create", "update", "delete")


class Desired:
    def __init__(self) -> None:
        backend = open_backend("fake:dgx-h100")
        backend.init()
        self.inventory = discover(backend)
        self.devices = catalog(self.inventory, MigOffering.DYNAMIC)
        self.settings = SliceSettings(DRIVER, NODE)

    def __call__(self, generation: int) -> list[JsonObject]:
        return build_slices(self.inventory.system, self.devices, self.settings, generation)


def _spec(obj: JsonObject) -> str:
    import json

    spec = dict(obj["spec"])
    spec["pool"] = {k: v for k, v in spec["pool"].items() if k != "generation"}
    return json.dumps(spec, sort_keys=True)


def _exact(srv: ApiServer, desired: Desired) -> Callable[[], bool]:
    want = sorted(_spec(d) for d in desired(1))

    def check() -> bool:
        slices = srv.snapshot("resource.k8s.io", "resourceslices")
        return len({s["spec"]["pool"]["generation"] for s in slices}) == 1 and sorted(map(_spec, slices)) == want

    return check


def _time_until(predicate: Callable[[], bool], start: float, timeout: float) -> float:
    while not predicate():
        if time.monotonic() - start > timeout:
            return float("nan")
        time.sleep(0.01)  # polling interval of the measurement, not synchronisation
    return round(time.monotonic() - start, 3)


def _generations_written(srv: ApiServer, since: str) -> list[int]:
    stream = srv.rest().watch(SLICES_PATH, query={"resourceVersion": since}, timeout_seconds=1)
    return sorted({e["object"]["spec"]["pool"]["generation"] for e in stream if e.get("type") in ("ADDED", "MODIFIED")})


def run_once(condition: str, seed: int) -> dict[str, Any]:
    faults = ChaosFaults(seed=seed)
    with ApiServer(faults=faults) as srv:
        rest = srv.rest()
        rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        since = str(srv.resource_version)
        srv.request_log.reset()
        desired = Desired()

        def disturb() -> None:
            if condition == "faults_20pct":
                for verb in PUBLISHER_VERBS:
                    faults.fail_randomly(0.2, (500, 409), verb=verb)
            elif condition.startswith("outage_"):
                faults.outage(int(condition.removeprefix("outage_")), seconds=OUTAGE_S)

        publisher = SlicePublisher(rest, driver_name=DRIVER, node_name=NODE, desired=desired)
        disturb()
        start = time.monotonic()
        publisher.start()
        try:
            initial = _time_until(_exact(srv, desired), start, OUTAGE_S + 120)
            faults.clear()
            disturb()
            desired.devices = {k: v for k, v in desired.devices.items() if not k.startswith("gpu-7")}
            start = time.monotonic()
            publisher.trigger()
            change = _time_until(_exact(srv, desired), start, OUTAGE_S + 120)
        finally:
            publisher.stop()
            faults.clear()
        log = srv.request_log
        return {
            "initial_s": initial,
            "change_s": change,
            "requests": sum(1 for r in log.records() if r.resource == "resourceslices" or r.resource == "nodes"),
            "failed_requests": sum(1 for r in log.records() if r.code >= 400),
            "retries_inside_passes": publisher.retries,
            "rollbacks": publisher.rollbacks,
            "generations_written": _generations_written(srv, since),
        }


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": len(runs)}
    for key in ("initial_s", "change_s"):
        values = [r[key] for r in runs]
        out[key] = {"median": round(statistics.median(values), 3), "min": min(values), "max": max(values)}
    for key in ("requests", "failed_requests", "retries_inside_passes", "rollbacks"):
        out[f"{key}_per_run"] = [r[key] for r in runs]
    out["generations_written"] = sorted({tuple(r["generations_written"]) for r in runs})
    return out


def run() -> dict[str, Any]:
    configure_logging("error", "text")
    out: dict[str, Any] = {"outage_s": OUTAGE_S}
    # Clean and faulty runs alternate, so that load from elsewhere on the machine hits both alike.
    runs: dict[str, list[dict[str, Any]]] = {"clean": [], "faults_20pct": []}
    for seed in range(1, REPEATS + 1):
        for condition, results in runs.items():
            results.append(run_once(condition, seed))
    for condition, results in runs.items():
        out[condition] = _summary(results)
    for condition in ("outage_503", "outage_500"):
        out[condition] = _summary([run_once(condition, 1)])
    clean, faulty = out["clean"], out["faults_20pct"]
    out["faults_vs_clean_median"] = {
        k: round(faulty[k]["median"] / clean[k]["median"], 2) for k in ("initial_s", "change_s")
    }
    return out


if __name__ == "__main__":
    emit("ResourceSlice convergence under API errors (publisher loop vs sandbox API server, dgx-h100)", run())
