"""The measuring half of `bench.peer_bench` (its doc says what is measured): the two plugins as processes, the claims,
the rounds. Separate from the pure half so that the table and the skip path load neither the product's plugin nor the
sandbox."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench.common import IMAGE_ENV, filesystem, image_like_pythonpath, many_gpus_node, runtime_dir, work_dir
from bench.peer_bench import (
    CONCURRENCY,
    EXAMPLE,
    OURS,
    Settings,
    figures_of,
    format_table,
    goal_lines,
    markdown_table,
    ms,
    requests_per_claim,
    table_rows,
)
from bench.prepare_bench import LoadClients, api_server_subprocess, load_procs, proc_cpu_s, proc_rss_mib, settled_cpu_s
from dra_driver import defaults
from dra_driver._gen import pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc
from dra_driver.inventory.catalog import MigOffering
from dra_driver.k8s.client import KubeRest, connect
from dra_sandbox.children import terminate
from dra_sandbox.kubelet.draclient import ClaimRef, DraClient
from dra_sandbox.kubelet.versions import V1
from dra_sandbox.objects import create_allocated_claim
from dra_sandbox.polling import socket_accepts, wait_for
from dra_sandbox.upstream.build import EXAMPLE_DRIVER_VERSION

NODE = "peer-node"
DEVICES = 64  # both plugins publish this many devices: enough for 64 claims on distinct devices at once
EXAMPLE_DRIVER = "gpu.example.com"  # the example driver's name for its "gpu" profile
REST_AFTER_PUBLISH_S = 2.0  # as bench.startup_bench: the watch is open, the first background passes have run
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


# --- the plugins ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PluginSpec:
    """How to start one plugin as its own process, and where it serves."""

    label: str  # OURS or EXAMPLE
    driver: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    registry_dir: Path
    dra_socket: Path
    work: Path


def ours_spec(work: Path, kubeconfig: Path, pycache: Path, cdi_root: Path) -> PluginSpec:
    """`dra-driver kubelet-plugin` with product defaults (JSON logs at info, usage sampling, Events, status.devices),
    ports off, on a fake node of 64 L4 GPUs (static MIG: whole-GPU prepares), as bench.prepare_bench runs it."""
    (work / "registry").mkdir(parents=True)  # the kubelet's plugins_registry exists before any plugin starts
    (work / "boot_id").write_text("bench\n")
    plugin_dir = work / "plugin"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")}
    env.update({
        "DRA_DRIVER_NODE_NAME": NODE,
        "DRA_DRIVER_KUBECONFIG": str(kubeconfig),
        "DRA_DRIVER_PLUGIN_DIR": str(plugin_dir),
        "DRA_DRIVER_REGISTRY_DIR": str(work / "registry"),
        "DRA_DRIVER_CDI_ROOT": str(cdi_root),
        "DRA_DRIVER_NVML": many_gpus_node(work / "node.yaml", DEVICES),
        "DRA_DRIVER_MIG_MODE": MigOffering.STATIC.value,
        "DRA_DRIVER_HEALTHZ_PORT": "-1",
        "DRA_DRIVER_METRICS_PORT": "-1",
        "DRA_DRIVER_BOOT_ID_PATH": str(work / "boot_id"),
    })
    # Bytecode compiled once (by the uncounted warm-up start) and kept, as an image's is: without this, a run with
    # PYTHONDONTWRITEBYTECODE would compile every module on every start (bench.startup_bench does the same).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    other = os.environ.get("BENCH_PLUGIN_PYTHONPATH")  # another tree's plugin, as bench.prepare_bench runs it
    if other:
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in other.split(os.pathsep) if p)
    env["PYTHONPATH"] = image_like_pythonpath(work, env.get("PYTHONPATH", ""))
    env = {**IMAGE_ENV, **env}  # BENCH_PLUGIN_ENV's and the caller's settings still win
    return PluginSpec(OURS, defaults.DRIVER_NAME, (sys.executable, "-m", "dra_driver.cli", "kubelet-plugin"), env,
                      work / "registry", plugin_dir / "dra.sock", work)


def example_spec(work: Path, kubeconfig: Path, binary: Path, qps: int, cdi_root: Path) -> PluginSpec:
    """The example driver's kubelet plugin with its chart's settings (gpu profile, device status off, health and
    metrics ports off) but 64 devices and our directories; `qps` > 0 lifts its client-side rate limit (default 5 QPS,
    burst 10), which would otherwise cap its prepares, each a GET of the claim, at 5 a second."""
    (work / "registry").mkdir(parents=True)  # the kubelet's plugins_registry exists before any plugin starts
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["NODE_NAME"] = NODE  # also read from the environment for its common CDI spec
    argv = [str(binary), "--node-name", NODE, "--cdi-root", str(cdi_root), "--num-devices", str(DEVICES),
            "--kubelet-registrar-directory-path", str(work / "registry"),
            "--kubelet-plugins-directory-path", str(work / "plugins"), "--kubeconfig", str(kubeconfig)]
    if qps > 0:
        argv += ["--kube-api-qps", str(qps), "--kube-api-burst", str(qps)]
    return PluginSpec(EXAMPLE, EXAMPLE_DRIVER, tuple(argv), env, work / "registry",
                      work / "plugins" / EXAMPLE_DRIVER / "dra.sock", work)


def registration_answers(registry: Path) -> bool:
    """Some `*-reg.sock` in `registry` answers GetInfo (what the kubelet's plugin watcher asks first)."""
    for sock in registry.glob("*-reg.sock") if registry.is_dir() else ():
        with grpc.insecure_channel(f"unix://{sock}") as channel:
            try:
                pluginregistration_v1_pb2_grpc.RegistrationStub(channel).GetInfo(
                    pluginregistration_v1_pb2.InfoRequest(), timeout=1.0)
            except grpc.RpcError:
                continue
            return True
    return False


def published(rest: KubeRest, driver: str) -> bool:
    items = (rest.get(SLICES) or {}).get("items") or []
    ours = [s for s in items if s["spec"]["driver"] == driver and s["spec"]["pool"]["name"] == NODE]
    return bool(ours) and len(ours) == ours[0]["spec"]["pool"]["resourceSliceCount"]


@dataclass(frozen=True)
class Running:
    spec: PluginSpec
    pid: int
    registered_s: float
    published_s: float


@contextlib.contextmanager
def running(spec: PluginSpec, rest: KubeRest) -> Iterator[Running]:
    """The plugin as its own process, serving and published; stopped with SIGTERM and its slices deleted after."""
    log_path = spec.work / "plugin.log"
    with open(log_path, "ab") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(list(spec.argv), env=dict(spec.env), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=spec.work)
    try:
        def alive() -> None:
            if proc.poll() is not None:
                raise RuntimeError(f"{spec.label} plugin exited {proc.returncode}: {log_path.read_text()[-2000:]}")

        def registered() -> bool:
            alive()
            return registration_answers(spec.registry_dir)

        wait_for(registered, 60, f"{spec.label} plugin's registration socket", interval=0.005)
        registered_s = time.perf_counter() - start

        def serving() -> bool:
            alive()
            return socket_accepts(spec.dra_socket) and published(rest, spec.driver)

        wait_for(serving, 60, f"{spec.label} plugin serving and published", interval=0.01)
        yield Running(spec, proc.pid, registered_s, time.perf_counter() - start)
    finally:
        terminate(proc, 30)
        for item in (rest.get(SLICES) or {}).get("items") or []:
            if item["spec"]["driver"] == spec.driver:
                rest.request("DELETE", f"{SLICES}/{item['metadata']['name']}")


# --- the measurements -----------------------------------------------------------------------------------------


class Claims:
    """Allocated claims of one driver (one device each), deleted when the phase ends."""

    def __init__(self, rest: KubeRest, driver: str, prefix: str) -> None:
        self.rest, self.driver, self.prefix = rest, driver, prefix
        self.made: list[ClaimRef] = []

    def make(self, count: int, tag: str) -> list[ClaimRef]:
        refs = []
        for i in range(count):
            name = f"{self.prefix}-{tag}-{i}"
            obj = create_allocated_claim(self.rest, namespace="default", name=name, driver=self.driver, pool=NODE,
                                         devices=[f"gpu-{i % DEVICES}"], reserved_for=f"pod-{name}")
            refs.append(ClaimRef("default", name, obj["metadata"]["uid"]))
        self.made += refs
        return refs

    def delete(self) -> None:
        for ref in self.made:
            self.rest.request("DELETE", f"{CLAIMS}/{ref.name}")
        self.made.clear()


def _tally(rest: KubeRest) -> list[dict[str, Any]]:
    return list((rest.get("/debug/requests") or {}).get("requests") or [])


def _failed(op: str, errors: Mapping[str, str | None]) -> None:
    for uid, error in errors.items():
        if error:
            raise RuntimeError(f"{op} of claim {uid} failed: {error}")


def one_round(run: Running, rest: KubeRest, server_pid: int, kubeconfig: Path, settings: Settings,
              tag: str) -> dict[str, Any]:
    """Every per-round figure of one plugin (see the module's doc)."""
    out: dict[str, Any] = {"registered_s": run.registered_s, "published_s": run.published_s}
    time.sleep(REST_AFTER_PUBLISH_S)  # memory "at rest" is read a fixed time after publishing, as startup_bench does
    out["rss_at_rest_mib"] = proc_rss_mib(run.pid)
    claims = Claims(rest, run.spec.driver, f"{run.spec.label}-{tag}")
    try:
        refs = claims.make(settings.claims, "one")
        with grpc.insecure_channel(f"unix://{run.spec.dra_socket}") as channel:
            client = DraClient(channel, V1)
            cpu, server_cpu, tally = settled_cpu_s(run.pid), proc_cpu_s(server_pid), _tally(rest)
            prep, unprep = [], []
            for ref in refs:
                t = time.perf_counter()
                _failed("prepare", {u: r.error for u, r in client.prepare([ref]).items()})
                prep.append(time.perf_counter() - t)
                t = time.perf_counter()
                _failed("unprepare", client.unprepare([ref]))
                unprep.append(time.perf_counter() - t)
            out["cpu_ms_per_claim_1"] = (settled_cpu_s(run.pid) - cpu) / len(refs) * 1000
            out["server_cpu_ms_per_claim"] = (proc_cpu_s(server_pid) - server_cpu) / len(refs) * 1000
            out["api_requests_per_claim"] = requests_per_claim(tally, _tally(rest), len(refs))
        out["prepare_s"], out["unprepare_s"] = prep, unprep
        out["rate_prepare_1"], out["rate_unprepare_1"] = len(prep) / sum(prep), len(unprep) / sum(unprep)
        claims.delete()
        for conc in CONCURRENCY:
            with LoadClients(run.spec.dra_socket, kubeconfig, conc, load_procs(conc)) as load:
                batches = [claims.make(conc, f"c{conc}-{r}") for r in range(settings.concurrent_rounds)]
                cpu = settled_cpu_s(run.pid)
                walls = {"prepare": 0.0, "unprepare": 0.0}
                for batch in batches:
                    for op in ("prepare", "unprepare"):
                        walls[op] += load.claims(op, batch)[1]
                total = conc * len(batches)
                out[f"cpu_ms_per_claim_{conc}"] = (settled_cpu_s(run.pid) - cpu) / total * 1000
                out[f"rate_prepare_{conc}"] = total / walls["prepare"]
                out[f"rate_unprepare_{conc}"] = total / walls["unprepare"]
            claims.delete()
    finally:
        claims.delete()
    return out


def cycles(run: Running, rest: KubeRest, kubeconfig: Path, count: int) -> dict[str, Any]:
    """`count` prepare/unprepare cycles, 64 claims at a time (the same 64 claims over and over); RSS before/after."""
    time.sleep(REST_AFTER_PUBLISH_S)
    before = proc_rss_mib(run.pid)
    claims = Claims(rest, run.spec.driver, f"{run.spec.label}-soak")
    done = 0
    try:
        refs = claims.make(DEVICES, "c")
        with LoadClients(run.spec.dra_socket, kubeconfig, DEVICES, load_procs(DEVICES)) as load:
            while done < count:
                load.claims("prepare", refs)
                load.claims("unprepare", refs)
                done += len(refs)
        settled_cpu_s(run.pid)  # background work the cycles caused has ended
        return {"rss_before_cycles_mib": before, "rss_after_cycles_mib": proc_rss_mib(run.pid), "cycles": done}
    finally:
        claims.delete()


def run(binary: Path, settings: Settings, say: Callable[[str], None] = print) -> dict[str, Any]:
    tmp = work_dir("drapeer-")
    per_round: dict[str, list[dict[str, Any]]] = {OURS: [], EXAMPLE: []}
    soak: dict[str, dict[str, Any]] = {}
    load_before = os.getloadavg()
    started = time.monotonic()
    try:
        with api_server_subprocess(tmp) as server, runtime_dir("drapeer-run-") as run_dir:
            filesystems = {"plugin_dir": filesystem(tmp), "cdi_root": filesystem(run_dir)}
            rest = connect(str(server.kubeconfig))
            # The example driver's slice publisher takes the Node's UID for the slices' owner; ours does not need it.
            rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})

            def spec(label: str, work: Path) -> PluginSpec:
                cdi_root = run_dir / work.name  # common.runtime_dir: a tmpfs, as /var/run/cdi on a node
                if label == OURS:
                    return ours_spec(work, server.kubeconfig, tmp / "pycache", cdi_root)
                return example_spec(work, server.kubeconfig, binary, settings.example_qps, cdi_root)

            for label in (OURS, EXAMPLE):  # uncounted: compiles our bytecode, pages both programs in
                with running(spec(label, tmp / f"{label}-warm-up"), rest):
                    pass
            for r in range(settings.rounds):
                order = (OURS, EXAMPLE) if r % 2 == 0 else (EXAMPLE, OURS)
                for label in order:
                    with running(spec(label, tmp / f"{label}-{r}"), rest) as plugin:
                        per_round[label].append(one_round(plugin, rest, server.pid, server.kubeconfig, settings,
                                                          f"r{r}"))
                    say(f"bench-peer: round {r + 1}/{settings.rounds} {label}: "
                        f"prepare p50 {ms(per_round[label][-1]['prepare_s'], 50):.2f} ms, "
                        f"64 concurrent {per_round[label][-1]['rate_prepare_64']:.0f} claims/s")
            for label in (EXAMPLE, OURS) if settings.rounds % 2 else (OURS, EXAMPLE):
                with running(spec(label, tmp / f"{label}-soak"), rest) as plugin:
                    soak[label] = cycles(plugin, rest, server.kubeconfig, settings.cycles)
                say(f"bench-peer: {label}: {soak[label]['cycles']} cycles, RSS {soak[label]['rss_before_cycles_mib']}"
                    f" -> {soak[label]['rss_after_cycles_mib']} MiB")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ours, example = figures_of(per_round[OURS], soak[OURS]), figures_of(per_round[EXAMPLE], soak[EXAMPLE])
    rows = table_rows(ours, example)
    return {
        "example_driver": f"sigs.k8s.io/dra-example-driver {EXAMPLE_DRIVER_VERSION}",
        "settings": dataclasses.asdict(settings),
        "filesystems": filesystems,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.monotonic() - started, 1),
        "api_requests_per_claim": {OURS: ours.api_requests_per_claim, EXAMPLE: example.api_requests_per_claim},
        "cycles": {OURS: ours.cycles, EXAMPLE: example.cycles},
        "rows": [{"figure": r.figure, "ours": r.ours, "example": r.example, "unit": r.unit,
                  "ratio": round(r.ratio, 3)} for r in rows],
        "table": format_table(rows),
        "markdown": markdown_table(rows, f"example driver {EXAMPLE_DRIVER_VERSION}"),
        "goals": goal_lines(rows),
    }
