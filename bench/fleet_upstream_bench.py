"""Fleet answers on kube-apiserver 1.37 beside the sandbox API server, in the same run (issue 37 item 4).

For each API server (`sandbox`: the sandbox API server in its own process; `upstream`: etcd + kube-apiserver +
kube-controller-manager + kube-scheduler of the pinned release, `dra_sandbox.upstream.controlplane`, the admin
client, no chart) and each fleet size, the fleet of bench/fleet_bench.py (its generator: the slices the plugin
builds for the fake presets dgx-h100, dgx-a100, a30x4, l4x2 in turn, dynamic MIG, GPU UUIDs unique per node; Node
objects registered; the last node, `fleet-last`, the only hgx-h200) is written, growing from one size to the next,
then measured, each command a process of its own as a user runs it (interpreter start and imports included; peak
RSS from `wait4`):

- `dra-driver explain` of three claims: `nowhere` (one GPU whose productName is 'NVIDIA B200': no pool can serve it),
  `nine` (nine whole GPUs: every pool can serve one, no node has nine), `last` (one 'NVIDIA H200': only the last
  node);
- `dra-driver status` of the fleet (the table);
- each explain and status also with `--no-protobuf` (the slices' LIST in JSON, as before protobuf; its row says
  "(JSON)"), right after the default run (`FLEET_JSON_TOO=0` leaves it out);
- `reads`: one read of every slice from the API server as JSON and as protobuf (`Accept:
  application/vnd.kubernetes.protobuf`), alternating, READ_ROUNDS times each: the server's CPU over an unpaged LIST
  and over the pages explain reads, the bytes, and this process's CPU to decode the unpaged body as explain does
  (JSON: the page split and the pool sieve's light view; protobuf: the list envelope and the sieve's view built
  from each message, commands/protoviews.py) for the `nowhere` claim;
- `dra-driver controller` (bench/controller_bench.py's fleet_start run): start -> one policy's status counts every
  H100 GPU of the fleet, its RSS and CPU then;
- the load average before and after each, and the API server's CPU seconds over each command (its rate at rest,
  `server_cores_at_rest`, is measured first: the commands start once the fleet's writes have settled).

One LIST of every slice (unmeasured, its time reported as `warm_list_s`) precedes the commands on both servers: the
sandbox server renders each object on its first LIST and serves cached bytes afterwards, as kube-apiserver serves
its watch cache all along.

    .venv/bin/python -m bench.fleet_upstream_bench                      # 300 and 1000 nodes, both servers
    BENCH_SHORT=1 .venv/bin/python -m bench.fleet_upstream_bench        # 20 nodes
    FLEET_SIZES=300 FLEET_SERVERS=upstream .venv/bin/python -m bench.fleet_upstream_bench
    FLEET_PARTS=explain,status .venv/bin/python -m bench.fleet_upstream_bench   # skip the controller

A/B in the same run: `FLEET_SOURCES=/tree/a,/tree/b` (checkouts or `git worktree`s) runs each command of each
tree in turn (PYTHONPATH), alternating, `FLEET_REPEAT` times (default 3; the controller `FLEET_CONTROLLER_REPEAT`,
default 2), against the same server and fleet; the runs are under `ab` (per figure, per tree, a list), and the goal
table shows each figure's range per tree.

    FLEET_SOURCES=/tmp/wt-before,/tmp/wt-after FLEET_PARTS=explain,status,controller \
        .venv/bin/python -m bench.fleet_upstream_bench

Where the upstream binaries are not built (`make upstream`), the upstream server's part says so and is skipped.
Figures are printed, never asserted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import controller_bench, fleet_bench
from bench.common import SHORT, cpu_seconds_from_stat, emit
from bench.prepare_bench import api_server_subprocess
from dra_driver.defaults import DRIVER_NAME
from dra_driver.k8s.client import ApiError, KubeRest, connect
from dra_driver.observability.logging import configure_logging
from dra_driver.policy.crd import custom_resource_definition
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.polling import wait_for

RESOURCE = "/apis/resource.k8s.io/v1"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
LAST_NODE = "fleet-last"  # sorts after every fleet-NNNN, so explain's last section is the H200 node's
LAST_INDEX = 99_999  # its GPU UUIDs' salt, apart from every other node's
PUBLISH_THREADS = 4
CLI = "import sys; from dra_driver.cli import main; sys.exit(main())"
# The claims explained, and the exit code each must give (2: fits nowhere, 0: fits somewhere).
CLAIMS: dict[str, int] = {"nowhere": 2, "nine": 2, "last": 0}
GOALS_S = {"explain_small": 1.0, "explain": 2.0, "status": 2.0, "controller": 10.0}


@dataclass(frozen=True)
class FleetNode:
    name: str
    preset: str
    salt: int  # fleet_bench._node_slices' index: makes its GPU UUIDs its own


def fleet(size: int) -> list[FleetNode]:
    """`size` nodes: size - 1 of the cycling presets, then the one hgx-h200 node. Growing the fleet keeps every
    node of the smaller one (the same names, presets and UUIDs)."""
    if size < 1:
        raise ValueError(f"FLEET_SIZES: a fleet has at least one node, not {size}")
    others = [FleetNode(f"fleet-{i:04d}", fleet_bench.PRESETS[i % len(fleet_bench.PRESETS)], i)
              for i in range(size - 1)]
    return [*others, FleetNode(LAST_NODE, fleet_bench.LAST_PRESET, LAST_INDEX)]


def h100_counts(nodes: Sequence[FleetNode], gpus_per_node: int) -> tuple[int, int]:
    """(H100 GPUs, nodes with them): what the policy over H100s must count."""
    h100 = sum(1 for n in nodes if n.preset == "dgx-h100")
    return gpus_per_node * h100, h100


def sizes() -> list[int]:
    raw = os.environ.get("FLEET_SIZES") or ("20" if SHORT else "300,1000")
    return sorted(int(n) for n in raw.split(",") if n.strip())


def parts() -> set[str]:
    return set((os.environ.get("FLEET_PARTS") or "reads,explain,status,controller").split(","))


def sources() -> list[str]:
    """FLEET_SOURCES: the trees whose commands run in turn (A/B); none: this one only."""
    return [src for src in (os.environ.get("FLEET_SOURCES") or "").split(",") if src]


def repeats(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


def json_too() -> bool:
    return os.environ.get("FLEET_JSON_TOO", "1") != "0"


READ_ROUNDS = 2


def claim(name: str) -> dict[str, Any]:
    if name == "nowhere":
        return fleet_bench._claim("fits-nowhere", "NVIDIA B200")
    if name == "last":
        return fleet_bench._claim("fits-last", "NVIDIA H200")
    if name == "nine":
        return {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "nine-gpus", "namespace": "default"},
            "spec": {"devices": {"requests": [
                {"name": "gpus", "exactly": {"deviceClassName": DRIVER_NAME, "count": 9}}]}},
        }
    raise ValueError(f"unknown claim {name!r}; choose from {', '.join(CLAIMS)}")


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def goal_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per measured figure with its goal and whether it was met: results[server][size] as run() makes it."""
    rows: list[dict[str, Any]] = []
    for server, by_size in results.items():
        if not isinstance(by_size, dict) or "skipped" in by_size:
            continue
        for size, figures in by_size.items():
            nodes = int(size)
            explain_goal = GOALS_S["explain_small"] if nodes <= 300 else GOALS_S["explain"]
            for name, run in (figures.get("explain") or {}).items():
                rows.append({"server": server, "nodes": nodes, "figure": f"explain {name}", "s": run["s"],
                             "cpu_s": run["cpu_s"], "server_cpu_s": run.get("server_cpu_s"),
                             "rss_mib": run["rss_mib"], "goal_s": explain_goal, "met": run["s"] <= explain_goal})
            for key, figure in (("status", "status"), ("status_json", "status (JSON)")):
                if key not in figures:
                    continue
                run = figures[key]
                rows.append({"server": server, "nodes": nodes, "figure": figure, "s": run["s"],
                             "cpu_s": run["cpu_s"], "server_cpu_s": run.get("server_cpu_s"),
                             "rss_mib": run["rss_mib"], "goal_s": GOALS_S["status"],
                             "met": run["s"] <= GOALS_S["status"]})
            if "controller" in figures:
                run = figures["controller"]
                seconds = run.get("start_to_counts_s", float("nan"))
                rows.append({"server": server, "nodes": nodes, "figure": "controller start -> counts",
                             "s": seconds, "cpu_s": run.get("cpu_to_counts_s"), "rss_mib": run.get("rss_mib"),
                             "goal_s": GOALS_S["controller"],
                             "met": seconds <= GOALS_S["controller"]})
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The goal rows side by side: one line per (nodes, figure), a column pair per server."""
    servers = list(dict.fromkeys(r["server"] for r in rows))
    keys = list(dict.fromkeys((r["nodes"], r["figure"]) for r in rows))
    by = {(r["server"], r["nodes"], r["figure"]): r for r in rows}
    head = "| nodes | figure | goal | " + " | ".join(
        f"{s}: wall s / CPU s / server CPU s / RSS MiB" for s in servers) + " |"
    lines = [head, "|" + "---|" * (3 + len(servers))]
    for nodes, figure in keys:
        cells = []
        goal = ""
        for server in servers:
            row = by.get((server, nodes, figure))
            if row is None:
                cells.append("-")
                continue
            goal = f"≤ {row['goal_s']:g} s"
            mark = "" if row["met"] else " ✗"
            server_cpu = row.get("server_cpu_s")
            cells.append(f"{row['s']:.2f}{mark} / {row['cpu_s']} / {'-' if server_cpu is None else server_cpu} / "
                         f"{row['rss_mib']}")
        lines.append(f"| {nodes} | {figure} | {goal} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- the servers ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    name: str
    rest: KubeRest
    kubeconfig: Path
    work: Path
    pid: int  # the API server's process (its CPU beside each command's)

    def cpu_s(self) -> float:
        return cpu_seconds_from_stat(Path(f"/proc/{self.pid}/stat").read_text(), os.sysconf("SC_CLK_TCK"))


@contextmanager
def sandbox_server(work: Path) -> Iterator[Server]:
    with api_server_subprocess(work) as process:
        rest = connect(str(process.kubeconfig), timeout=60.0)
        yield Server("sandbox", rest, process.kubeconfig, work, process.pid)


@contextmanager
def upstream_server(work: Path) -> Iterator[Server]:
    from dra_sandbox.upstream.controlplane import ControlPlane, ControlPlaneConfig

    binaries = upstream_binaries()
    if isinstance(binaries, str):
        raise RuntimeError(binaries)
    with ControlPlane(ControlPlaneConfig(work / "controlplane", binaries)) as plane:
        rest = connect(str(plane.admin_kubeconfig), timeout=60.0)
        yield Server("upstream", rest, plane.admin_kubeconfig, work, plane.child_pids()["upstream/kube-apiserver"])


def upstream_binaries() -> Any:
    """The pinned release's binaries, or the reason they are not here (a str)."""
    from dra_sandbox.upstream.build import DEFAULT_MINOR, UpstreamUnavailable, find_release

    try:
        found = find_release(DEFAULT_MINOR)
    except UpstreamUnavailable as exc:
        return f"upstream {DEFAULT_MINOR} not usable here: {exc}"
    if found is None:
        return f"upstream {DEFAULT_MINOR} is not built here: run `make upstream` first (needs Go); skipped"
    return found


# --- writing the fleet ---------------------------------------------------------------------------------------


def setup(server: Server) -> None:
    """The device classes, the claims, the policy CRD and one policy over the H100 GPUs."""
    rest = server.rest
    for cls in device_classes(DRIVER_NAME):
        rest.request("POST", f"{RESOURCE}/deviceclasses", body=cls)
    for name in CLAIMS:
        rest.request("POST", f"{RESOURCE}/namespaces/default/resourceclaims", body=claim(name))
    rest.request("POST", CRDS, body=custom_resource_definition())
    crd_name = custom_resource_definition()["metadata"]["name"]

    def established() -> bool:
        conditions = ((rest.get(f"{CRDS}/{crd_name}") or {}).get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    wait_for(established, 60.0, f"CRD {crd_name} to be established", interval=0.1)

    def create_policy() -> bool:
        try:
            rest.request("POST", controller_bench.POLICIES, body={
                "apiVersion": "gpu.dra.dev/v1beta1", "kind": "GpuSharingPolicy", "metadata": {"name": "fleet-h100"},
                "spec": {"devices": {"type": "gpu", "productNames": [fleet_bench.H100]}},
            })
        except ApiError as exc:
            if exc.status == 404:  # established, but the discovery of the new kind has not reached every handler
                return False
            raise
        return True

    wait_for(create_policy, 60.0, "the GpuSharingPolicy kind to be served", interval=0.2)


def grow(server: Server, inventories: dict[str, Any], have: list[FleetNode], want: list[FleetNode]) -> dict[str, Any]:
    """Write the Nodes and slices of `want` not in `have`, several requests at a time (the API server's own
    concurrency, not ours, is what a fleet of plugins meets)."""
    new = [n for n in want if n not in set(have)]
    start = time.perf_counter()

    def publish(node: FleetNode) -> tuple[int, int]:
        built = fleet_bench._node_slices(inventories, node.name, node.preset, node.salt)
        return fleet_bench._publish_node(server.rest, node.name, node.preset, built)

    with ThreadPoolExecutor(PUBLISH_THREADS) as pool:
        counts = list(pool.map(publish, new))
    return {"nodes_written": len(new), "slices_written": sum(c[0] for c in counts),
            "devices_written": sum(c[1] for c in counts), "write_s": round(time.perf_counter() - start, 2)}


# --- the commands --------------------------------------------------------------------------------------------


# Runs the command as a child of a small interpreter that reports the child's wall time and peak RSS: a child of
# this (large) process would inherit its RSS at the fork into its own peak (Linux folds the old memory map's high
# water mark into ru_maxrss at exec), so every command would read as at least this process's size.
LAUNCHER = """
import os, subprocess, sys, time
start = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(proc.pid, 0)
print(time.perf_counter() - start, usage.ru_maxrss, os.waitstatus_to_exitcode(status),
      usage.ru_utime + usage.ru_stime)
"""


def command(server: Server, args: Sequence[str], source: str = "") -> dict[str, Any]:
    """`dra-driver ARGS --kubeconfig K` as a process of its own (of `source`'s tree; "": this one): wall seconds,
    its CPU seconds and peak RSS, exit code, and the API server's CPU seconds meanwhile (other clients' requests
    included: the control plane's own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")}
    if source:
        env["PYTHONPATH"] = source
    argv = [sys.executable, "-c", CLI, *args, "--kubeconfig", str(server.kubeconfig)]
    before = server.cpu_s()
    done = subprocess.run([sys.executable, "-c", LAUNCHER, *argv], capture_output=True, text=True, env=env,
                          cwd=server.work, check=True)  # not the checkout: `-c` puts the cwd first on sys.path
    return {**launched(done.stdout), "server_cpu_s": round(server.cpu_s() - before, 2)}


def launched(report: str) -> dict[str, Any]:
    """The launcher's line: wall seconds, peak RSS in KiB, exit code, CPU seconds (user + system)."""
    seconds, rss_kib, rc, cpu = report.split()
    return {"s": round(float(seconds), 3), "cpu_s": round(float(cpu), 3), "rss_mib": round(int(rss_kib) / 1024, 1),
            "rc": int(rc)}


SETTLE_WINDOW_S = 5.0
SETTLE_CORES = 0.3  # the API server's CPU rate under which the fleet's writes count as settled
SETTLE_LIMIT_S = 180.0
# kube-controller-manager's node-monitor grace period (40 s) and a period (5 s) of its node lifecycle controller,
# with margin: the new Nodes, which no kubelet renews, are marked NotReady and tainted within this after they appear.
NODE_GRACE_S = 50.0


def settle(server: Server) -> dict[str, Any]:
    """Wait NODE_GRACE_S after the fleet's last write (upstream only), then until the API server's CPU rate falls
    under SETTLE_CORES over a window (at most SETTLE_LIMIT_S): kube-controller-manager's NotReady wave over the new
    Nodes keeps kube-apiserver busy after the writes, which would be billed to the commands."""
    start = time.monotonic()
    if server.name == "upstream":
        time.sleep(NODE_GRACE_S)  # kube-controller-manager's grace period runs out (not a synchronisation)
    rate = float("inf")
    while time.monotonic() - start < SETTLE_LIMIT_S:
        before = server.cpu_s()
        time.sleep(SETTLE_WINDOW_S)  # the measuring window itself
        rate = (server.cpu_s() - before) / SETTLE_WINDOW_S
        if rate < SETTLE_CORES:
            break
    return {"settle_s": round(time.monotonic() - start, 1), "server_cores_at_rest": round(rate, 3)}


def measure(server: Server, inventories: dict[str, Any], nodes: list[FleetNode], wanted: set[str]
            ) -> dict[str, Any]:
    out: dict[str, Any] = settle(server)
    out["load_before"] = load()
    start = time.perf_counter()
    server.rest.request_bytes("GET", f"{RESOURCE}/resourceslices")
    out["warm_list_s"] = round(time.perf_counter() - start, 3)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import dra_driver.commands.explain, dra_driver.allocation"],
                   check=True, cwd=server.work)
    out["import_only_s"] = round(time.perf_counter() - start, 3)
    if "reads" in wanted:
        out["reads"] = read_costs(server)
    if "explain" in wanted and not sources():  # with FLEET_SOURCES, each tree's runs are under "ab" instead
        explained: dict[str, Any] = {}
        for name, rc in CLAIMS.items():
            ref = f"default/{claim(name)['metadata']['name']}"
            for label, extra in ((name, []), (f"{name} (JSON)", ["--no-protobuf"]))[:2 if json_too() else 1]:
                run = command(server, ["explain", ref, *extra])
                if run["rc"] != rc:
                    run["error"] = f"exit code {run['rc']}, expected {rc}"
                explained[label] = run
        out["explain"] = explained
    if "status" in wanted and not sources():
        out["status"] = command(server, ["status"])
        if json_too():
            out["status_json"] = command(server, ["status", "--no-protobuf"])
    if "controller" in wanted and not sources():
        gpus = len(inventories["dgx-h100"].gpus)
        out["controller"] = controller_bench._start_to_counts(
            server.work, server.rest, server.kubeconfig, h100_counts(nodes, gpus), "")
    if sources():
        out["ab"] = alternated(server, inventories, nodes, wanted)
    out["load_after"] = load()
    return out


def alternated(server: Server, inventories: dict[str, Any], nodes: list[FleetNode], wanted: set[str]
               ) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Each figure of each FLEET_SOURCES tree, the trees in turn, FLEET_REPEAT times: figure -> tree -> runs."""
    trees = sources()
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}

    def record(figure: str, tree: str, run: dict[str, Any]) -> None:
        out.setdefault(figure, {}).setdefault(tree, []).append({**run, "load": load()})

    for _ in range(repeats("FLEET_REPEAT", 3)):
        for tree in trees:
            if "explain" in wanted:
                for name, rc in CLAIMS.items():
                    run = command(server, ["explain", f"default/{claim(name)['metadata']['name']}"], tree)
                    if run["rc"] != rc:
                        run["error"] = f"exit code {run['rc']}, expected {rc}"
                    record(f"explain {name}", tree, run)
            if "status" in wanted:
                record("status", tree, command(server, ["status"], tree))
    if "controller" in wanted:
        gpus = len(inventories["dgx-h100"].gpus)
        for _ in range(repeats("FLEET_CONTROLLER_REPEAT", 2)):
            for tree in trees:
                run = controller_bench._start_to_counts(
                    server.work, server.rest, server.kubeconfig, h100_counts(nodes, gpus), tree)
                record("controller start -> counts", tree, {
                    "s": run.get("start_to_counts_s"), "cpu_s": run.get("cpu_to_counts_s"),
                    "rss_mib": run.get("rss_mib"), **({"error": run["error"]} if "error" in run else {})})
    return out


def ab_table(results: dict[str, Any]) -> str:
    """The A/B runs as ranges: per server, size and figure, per tree min-max of wall, CPU, server CPU and RSS."""
    lines = ["| server | nodes | figure | tree | wall s | CPU s | server CPU s | RSS MiB |", "|" + "---|" * 8]

    def span(runs: list[dict[str, Any]], key: str) -> str:
        values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
        if not values:
            return "-"
        low, high = min(values), max(values)
        return f"{low:.2f}" if low == high else f"{low:.2f}-{high:.2f}"

    for server, by_size in results.items():
        if not isinstance(by_size, dict) or "skipped" in by_size:
            continue
        for size, figures in by_size.items():
            if not isinstance(figures, dict):
                continue
            for figure, trees in (figures.get("ab") or {}).items():
                for tree, runs in trees.items():
                    lines.append(f"| {server} | {size} | {figure} | {tree} | {span(runs, 's')} | {span(runs, 'cpu_s')} "
                                 f"| {span(runs, 'server_cpu_s')} | {span(runs, 'rss_mib')} |")
    return "\n".join(lines)


def read_costs(server: Server) -> dict[str, Any]:
    """One read of every slice as JSON and as protobuf, alternating READ_ROUNDS times: the API server's CPU and the
    wall time of an unpaged LIST and of the pages explain reads (bytes only, nothing decoded), the unpaged body's
    size, and this process's CPU to decode that body as explain does for the `nowhere` claim. The server's CPU
    includes its background (`server_cores_at_rest`)."""
    from dra_driver.allocation.prune import PoolSieve, claim_reach
    from dra_driver.cel import DraCelEnvironment
    from dra_driver.commands.protoviews import ProtoSieveFeed
    from dra_driver.k8s import liststream, sliceproto

    path = f"{RESOURCE}/resourceslices"
    classes = device_classes(DRIVER_NAME)
    out: dict[str, list[dict[str, Any]]] = {"json": [], "protobuf": []}
    for _ in range(READ_ROUNDS):
        for encoding, accept in (("json", "application/json"), ("protobuf", sliceproto.ACCEPT)):
            before, start = server.cpu_s(), time.perf_counter()
            body = liststream._get(server.rest, path, {}, accept)
            one: dict[str, Any] = {"server_cpu_s": round(server.cpu_s() - before, 2),
                                   "s": round(time.perf_counter() - start, 2), "mb": round(len(body) / 1e6, 1)}
            reach = claim_reach(claim("nowhere"), classes, cel=DraCelEnvironment())
            assert reach is not None
            sieve = PoolSieve(reach)
            cpu = time.process_time()
            one["answered"] = "protobuf" if sliceproto.is_protobuf(body) else "json"  # the sandbox: JSON only
            if one["answered"] == "json":
                for item in liststream._split_page(body, path)[0]:
                    sieve.add_encoded(item)
            else:
                feed = ProtoSieveFeed(sieve, reach)
                for item in sliceproto.list_page(body)[0]:
                    feed.add(item)
            sieve.result()
            one["decode_cpu_s"] = round(time.process_time() - cpu, 2)
            del body, sieve
            before, start = server.cpu_s(), time.perf_counter()
            pages = list(liststream.stream_pages(server.rest, path, protobuf=encoding == "protobuf"))
            one.update(pages_server_cpu_s=round(server.cpu_s() - before, 2),
                       pages_s=round(time.perf_counter() - start, 2), pages_items=len(pages))
            del pages
            out[encoding].append(one)
    return out


def run_server(name: str, inventories: dict[str, Any]) -> dict[str, Any]:
    if name == "upstream":
        binaries = upstream_binaries()
        if isinstance(binaries, str):
            print(f"fleet_upstream_bench: {binaries}", file=sys.stderr)
            return {"skipped": binaries}
    opened = {"sandbox": sandbox_server, "upstream": upstream_server}[name]
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix=f"fleet-{name}-") as tmp, opened(Path(tmp)) as server:
        setup(server)
        have: list[FleetNode] = []
        for size in sizes():
            want = fleet(size)
            # The hgx-h200 node stays last: growing from a smaller fleet keeps it and adds nodes before it.
            written = grow(server, inventories, have, want)
            have = want
            out[str(size)] = {**written, **measure(server, inventories, want, parts())}
            print(f"fleet_upstream_bench: {name} {size} nodes: {out[str(size)]}", file=sys.stderr, flush=True)
    return out


def run() -> dict[str, Any]:
    configure_logging("critical", "text")
    inventories = fleet_bench._inventories()
    servers = (os.environ.get("FLEET_SERVERS") or "sandbox,upstream").split(",")
    results: dict[str, Any] = {"load_at_start": load()}
    by_server = {name: run_server(name, inventories) for name in servers}
    results.update(by_server)
    results["load_at_end"] = load()
    results["goals"] = goal_rows(by_server)
    return results


if __name__ == "__main__":
    figures = run()
    emit(f"fleet on kube-apiserver vs the sandbox API server ({', '.join(map(str, sizes()))} nodes)", figures)
    if figures["goals"]:
        print("== table")
        print(table(figures["goals"]))
    if sources():
        print("== A/B")
        print(ab_table(figures))
