"""ComputeDomain readiness in the two modes (issue 24 item 5; docs/compute-domains.md "The two readiness modes").

One sandbox per mode, shaped as the e2e compute-domain sandbox (two GB200 NVL72 trays, `compute_domain_cluster_config`;
containers are CDI-checked, not run under podman): Kubernetes 1.37 (KEP-5007 binding conditions: the pod waits in
PreBind until the controller sets `imex-ready`) and 1.35 (no binding conditions: the pod is bound at once and the
compute-domain plugin's prepare answers a retryable error until the node's IMEX daemon is Ready; the kubelet retries
with its back-off). Each run creates one ComputeDomain of 2 nodes and 2 worker pods using its channel claim template
(as e2e/scenarios/compute-domain-2node), waits for both workers Running, then deletes them and the domain and waits
until everything is gone (domain, claims, daemon pods, node labels, cliques) before the next run.

Per run: domain create → both workers Running; per worker: pod create → Running, claim allocated → `imex-ready` True
→ pod bound (binding mode: the PreBind wait), pod bound → Running (ContainerCreating) and the kubelet's failed
NodePrepareResources attempts (from the simulator's "NodePrepareResources failed (attempt N, ...)" status). Times are
when a 0.1 s poll of the API first saw each state.

    .venv/bin/python -m bench.compute_domain_bench          # 5 runs per mode; BENCH_SHORT=1: 3
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.common import emit, percentile, sized
from dra_driver.computedomain import names
from dra_sandbox.cluster import SandboxCluster
from dra_sandbox.computedomainplugin import COMPUTE_DOMAIN_NAMESPACE
from dra_sandbox.e2e.sandbox import compute_domain_cluster_config, compute_domain_support
from dra_sandbox.e2e.scenario import NODE_LABEL

JsonObject = dict[str, Any]
MODES: tuple[tuple[str, str], ...] = (("binding-conditions", "1.37.0"), ("prepare-check", "1.35.0"))
ALIASES = ("gb200-a", "gb200-b")
NAMESPACE = "default"
POLL_S = 0.1
RUN_TIMEOUT_S = 240.0
CLEANUP_TIMEOUT_S = 120.0
ATTEMPT = re.compile(r"NodePrepareResources failed \(attempt (\d+)")
CD_PATH = f"/apis/{names.API_GROUP}/{names.API_VERSION}/namespaces/{NAMESPACE}/{names.COMPUTE_DOMAIN_PLURAL}"
CLIQUE_PATH = f"/apis/{names.API_GROUP}/{names.API_VERSION}/namespaces/{{ns}}/{names.CLIQUE_PLURAL}"


def domain(name: str) -> JsonObject:
    return {
        "apiVersion": f"{names.API_GROUP}/{names.API_VERSION}", "kind": names.COMPUTE_DOMAIN_KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}},
    }


def worker(name: str, alias: str, template: str) -> JsonObject:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 1, "nodeSelector": {NODE_LABEL: alias},
            "containers": [{"name": "ctr", "image": "busybox:1.36", "command": ["sh", "-c", "sleep 3600"],
                            "resources": {"claims": [{"name": "channel"}]}}],
            "resourceClaims": [{"name": "channel", "resourceClaimTemplateName": template}],
        },
    }


@dataclass
class WorkerTimes:
    """Seconds since the domain was created at which a poll first saw each state of one worker."""

    created: float
    allocated: float | None = None
    imex_ready: float | None = None
    bound: float | None = None
    running: float | None = None
    failed_prepares: int = 0
    notes: list[str] = field(default_factory=list)

    def span(self, start: float | None, end: float | None) -> float | None:
        return None if start is None or end is None else end - start


@dataclass
class DaemonTimes:
    """When both IMEX daemon pods were first seen Running, then Ready (their readiness probe), and when the
    domain's clique first listed both daemons Ready (what the controller's `imex-ready` and the plugin wait for)."""

    running: float | None = None
    ready: float | None = None
    clique_ready: float | None = None

    def observe(self, cluster: SandboxCluster, now: float) -> None:
        pods = cluster.items(f"/api/v1/namespaces/{COMPUTE_DOMAIN_NAMESPACE}/pods")
        if self.running is None and len(pods) >= len(ALIASES) and all(
                (p.get("status") or {}).get("phase") == "Running" for p in pods):
            self.running = now
        if self.ready is None and len(pods) >= len(ALIASES) and all(_pod_ready(p) for p in pods):
            self.ready = now
        if self.clique_ready is None:
            namespaces = (NAMESPACE, COMPUTE_DOMAIN_NAMESPACE)
            cliques = [c for ns in namespaces for c in cluster.items(CLIQUE_PATH.format(ns=ns))]
            entries = [d for c in cliques for d in c.get("daemons") or []]
            if len(entries) >= len(ALIASES) and all(d.get("status") == names.STATUS_READY for d in entries):
                self.clique_ready = now


def _pod_ready(pod: JsonObject) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _owned_claim(claims: Sequence[JsonObject], pod: str) -> JsonObject | None:
    for claim in claims:
        if any(o.get("kind") == "Pod" and o.get("name") == pod for o in claim["metadata"].get("ownerReferences") or []):
            return claim
    return None


def _imex_ready(claim: JsonObject) -> bool:
    for entry in (claim.get("status") or {}).get("devices") or []:
        for cond in entry.get("conditions") or []:
            if cond.get("type") == names.READY_CONDITION and cond.get("status") == "True":
                return True
    return False


def _failed_prepares(pod: JsonObject) -> int:
    texts = [str(c.get("message") or "") for c in (pod.get("status") or {}).get("conditions") or []]
    found = [int(m.group(1)) for t in texts for m in [ATTEMPT.search(t)] if m]
    return max(found, default=0)


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:.0f} s")
        time.sleep(POLL_S)


def cleaned_up(cluster: SandboxCluster) -> bool:
    """Nothing of any domain is left: workers, their claims, domains, daemon pods, cliques, node labels."""
    if cluster.items(f"/api/v1/namespaces/{NAMESPACE}/pods") or cluster.items(CD_PATH):
        return False
    if cluster.items(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"):
        return False
    if cluster.items(f"/api/v1/namespaces/{COMPUTE_DOMAIN_NAMESPACE}/pods"):
        return False
    if any(cluster.items(CLIQUE_PATH.format(ns=ns)) for ns in (NAMESPACE, COMPUTE_DOMAIN_NAMESPACE)):
        return False
    return not any(names.DOMAIN_LABEL in (n["metadata"].get("labels") or {}) for n in cluster.items("/api/v1/nodes"))


def one_run(cluster: SandboxCluster, index: int) -> dict[str, Any]:
    name = f"cd-bench-{index}"
    t0 = time.monotonic()
    cluster.apply(domain(name))
    workers: dict[str, WorkerTimes] = {}
    daemons = DaemonTimes()
    for alias in ALIASES:
        pod_name = f"{name}-{alias}"
        cluster.apply(worker(pod_name, alias, f"{name}-channel"))
        workers[pod_name] = WorkerTimes(created=time.monotonic() - t0)
    deadline = t0 + RUN_TIMEOUT_S
    while any(w.running is None for w in workers.values()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name}: workers not Running within {RUN_TIMEOUT_S:.0f} s: {workers}")
        now = time.monotonic() - t0
        pods = {p["metadata"]["name"]: p for p in cluster.items(f"/api/v1/namespaces/{NAMESPACE}/pods")}
        claims = cluster.items(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims")
        daemons.observe(cluster, now)
        for pod_name, times in workers.items():
            pod = pods.get(pod_name)
            if pod is None:
                continue
            claim = _owned_claim(claims, pod_name)
            if claim is not None and times.allocated is None and (claim.get("status") or {}).get("allocation"):
                times.allocated = now
            if claim is not None and times.imex_ready is None and _imex_ready(claim):
                times.imex_ready = now
            if times.bound is None and (pod.get("spec") or {}).get("nodeName"):
                times.bound = now
            times.failed_prepares = max(times.failed_prepares, _failed_prepares(pod))
            if (pod.get("status") or {}).get("phase") == "Running":
                times.running = now
        time.sleep(POLL_S)
    ready = max(w.running or 0.0 for w in workers.values())
    for pod_name in workers:
        cluster.delete({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod_name, "namespace": NAMESPACE}})
    cluster.delete(domain(name))
    started = time.monotonic()
    _wait(lambda: cleaned_up(cluster), CLEANUP_TIMEOUT_S, f"{name}: cleanup")
    return {
        "domain_to_workers_running_s": ready,
        "cleanup_s": time.monotonic() - started,
        "daemons_running_s": daemons.running,
        "daemons_ready_s": daemons.ready,
        "clique_ready_s": daemons.clique_ready,
        "workers": [
            {
                "pod_to_running_s": w.span(w.created, w.running),
                "pod_to_allocated_s": w.span(w.created, w.allocated),
                "allocated_to_imex_ready_s": w.span(w.allocated, w.imex_ready),
                "imex_ready_to_bound_s": w.span(w.imex_ready, w.bound),
                "prebind_wait_s": w.span(w.allocated, w.bound),
                "container_creating_s": w.span(w.bound, w.running),
                "failed_prepares": w.failed_prepares,
            }
            for w in workers.values()
        ],
    }


def _stats(values: Sequence[float | int | None]) -> dict[str, float | int | None]:
    present = [float(v) for v in values if v is not None]
    if not present:
        return {"n": 0, "p50": None, "max": None}
    return {"n": len(present), "p50": round(percentile(present, 50), 2), "max": round(max(present), 2)}


def summarize(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    per_worker = [w for r in runs for w in r["workers"]]
    keys = ("pod_to_running_s", "pod_to_allocated_s", "allocated_to_imex_ready_s", "imex_ready_to_bound_s",
            "prebind_wait_s", "container_creating_s", "failed_prepares")
    return {
        "domain_to_workers_running_s": _stats([r["domain_to_workers_running_s"] for r in runs]),
        "cleanup_s": _stats([r["cleanup_s"] for r in runs]),
        **{key: _stats([r[key] for r in runs]) for key in ("daemons_running_s", "daemons_ready_s", "clique_ready_s")},
        **{key: _stats([w[key] for w in per_worker]) for key in keys},
    }


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def run_mode(kube_version: str, runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cd-bench-") as tmp:
        config = replace(compute_domain_cluster_config(Path(tmp), "cdi-check", aliases=ALIASES),
                         kube_version=kube_version)
        started = time.monotonic()
        with SandboxCluster(config) as cluster:
            start_s = time.monotonic() - started
            samples = [one_run(cluster, i) for i in range(runs)]
    return {"kube_version": kube_version, "sandbox_start_s": round(start_s, 1), "runs": runs,
            "summary": summarize(samples), "samples": samples}


def run() -> dict[str, Any]:
    missing = compute_domain_support()
    if missing:
        return {"skipped": missing}
    runs = sized(3, 5, 5)
    results: dict[str, Any] = {"load_before": load()}
    for mode, version in MODES:
        results[mode] = run_mode(version, runs)
    results["load_after"] = load()
    return results


def main() -> int:
    emit("ComputeDomain readiness: binding conditions (1.37) vs prepare-time check (1.35), 2 GB200 trays", run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
