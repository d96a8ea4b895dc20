"""`dra-driver compute-domain-daemon run|check` as processes against the sandbox API server, with the stand-in
IMEX on distinct loopback addresses: joining, readiness in the clique, SIGTERM, restarts, the watchdog, and
churn (NVIDIA #1418/#1440: slots swapped or doubled as nodes come and go)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dra_driver.computedomain.daemon.config import UNUSED_SLOT_ADDRESS
from dra_driver.computedomain.model import ComputeDomainClique, parse_clique
from dra_driver.computedomain.names import daemon_host_name
from dra_driver.k8s.client import ApiError
from tests.computedomain.daemon.harness import (
    CLIQUE_ID,
    DOMAIN_UID,
    NAMESPACE,
    TIMEOUT,
    Cluster,
    Daemon,
)
from tests.polling import wait_for


def slots(clique: ComputeDomainClique) -> dict[str, int]:
    return {d.name: d.index for d in clique.daemons}


def check(daemon: Daemon, bin_dir: Path, env: dict[str, str] | None = None) -> int:
    environ = {**os.environ, "CLIQUE_ID": "x.1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "dra_driver.cli", "compute-domain-daemon", "check", "--config-dir",
                           str(daemon.config_dir), "--imex-bin-dir", str(bin_dir)], env=environ,
                          capture_output=True, timeout=TIMEOUT, check=False).returncode


def standin_pid(daemon: Daemon) -> int:
    state = wait_for(daemon.standin_state, TIMEOUT, f"{daemon.node}'s IMEX state")
    return int(state["pid"])


def test_daemons_reach_ready_in_their_clique_entries(cluster: Cluster) -> None:
    daemons = [cluster.start(f"node-{i}") for i in range(4)]
    clique = cluster.wait_ready(daemons)
    assert sorted(slots(clique).values()) == [0, 1, 2, 3]
    for entry in clique.daemons:
        assert entry.clique_id == CLIQUE_ID and entry.status == "Ready"
    hosts = {(d.config_dir / "hosts").read_text() for d in daemons}
    assert len(hosts) == 1  # every peer renders the same mapping
    lines = {name: address for address, name in (line.split("\t") for line in hosts.pop().splitlines())}
    by_node = {d.node: d.ip for d in daemons}
    for name, index in slots(clique).items():
        assert lines[daemon_host_name(DOMAIN_UID, index)] == by_node[name]
    assert list(lines.values()).count(UNUSED_SLOT_ADDRESS) == 14
    for d in daemons:
        assert (d.config_dir / "nodes.cfg").read_text().splitlines() == [
            daemon_host_name(DOMAIN_UID, i) for i in range(18)]
        assert f"IMEX_CMD_BIND_INTERFACE_IP={d.ip}\n" in (d.config_dir / "imexd.cfg").read_text()
        state = d.standin_state()
        assert state is not None and state["ready"] and len(state["peers"]) == 3
        assert {p["state"] for p in state["peers"].values()} == {"C"}
        assert check(d, cluster.bin_dir) == 0


def test_check_fails_without_a_ready_imex_and_passes_without_a_clique(cluster: Cluster, tmp_path: Path) -> None:
    a = cluster.start("node-a")
    b_ip = cluster.addresses.take()
    # a's map lists b (b holds a slot but runs no IMEX): a's IMEX is up, not ready.
    cluster.wait_ready([a])
    wait_for(lambda: _add_entry(cluster, "node-b", b_ip, 1), TIMEOUT, "b's entry written")
    wait_for(lambda: (a.standin_state() or {}).get("peers"), TIMEOUT, "a sees b")
    assert check(a, cluster.bin_dir) == 1
    nothing = Daemon("none", "", tmp_path / "none", a.process, a.log)
    (tmp_path / "none").mkdir()
    assert check(nothing, cluster.bin_dir) == 1  # no config at all
    assert check(nothing, cluster.bin_dir, {"CLIQUE_ID": ""}) == 0  # no clique: nothing to wait for


def _add_entry(cluster: Cluster, node: str, ip: str, index: int) -> bool:
    """One GET + PUT (False when a daemon's write came in between: 409)."""
    obj = cluster.rest.get(cluster.clique_path)
    assert obj is not None
    entry = {"nodeName": node, "ipAddress": ip, "cliqueID": CLIQUE_ID, "index": index, "status": "NotReady"}
    try:
        cluster.rest.request("PUT", cluster.clique_path, body={**obj, "daemons": [*obj["daemons"], entry]})
    except ApiError as exc:
        if exc.status == 409:
            return False
        raise
    return True


def test_sigterm_removes_the_own_entry_stops_imex_and_exits_0(cluster: Cluster) -> None:
    a, b = cluster.start("node-a"), cluster.start("node-b")
    cluster.wait_ready([a, b])
    b_imex = standin_pid(b)
    assert b.terminate() == 0
    clique = cluster.clique()
    assert clique is not None and [d.name for d in clique.daemons] == ["node-a"]
    wait_for(lambda: not Path(f"/proc/{b_imex}").exists() or "Z" in Path(f"/proc/{b_imex}/stat").read_text()
             .split(") ")[1][:1], TIMEOUT, "b's IMEX stopped")
    cluster.wait_ready([a], "a Ready alone")
    assert "left the clique" in b.log.read_text()


def test_a_restarted_daemon_keeps_its_slot_and_a_newcomer_fills_the_gap(cluster: Cluster) -> None:
    a, b, c = cluster.start("node-a"), cluster.start("node-b"), cluster.start("node-c")
    before = slots(cluster.wait_ready([a, b, c]))
    gap = before["node-a"]
    assert a.terminate() == 0
    cluster.wait_ready([b, c])
    # c dies without leaving (SIGKILL: its entry stays) and comes back on a new pod IP.
    c.process.send_signal(signal.SIGKILL)
    c.process.wait(TIMEOUT)
    c2 = cluster.start("node-c")
    after = slots(cluster.wait_ready([b, c2]))
    assert after["node-c"] == before["node-c"] != gap
    d = cluster.start("node-d")
    assert slots(cluster.wait_ready([b, c2, d]))["node-d"] == gap


def test_the_watchdog_restarts_a_dead_imex(cluster: Cluster) -> None:
    a, b = cluster.start("node-a"), cluster.start("node-b")
    cluster.wait_ready([a, b])
    first = standin_pid(a)
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: (a.standin_state() or {}).get("pid") not in (None, first), TIMEOUT, "a new IMEX")
    cluster.wait_ready([a, b], "Ready again after the restart")
    assert a.process.poll() is None


def test_without_a_clique_the_daemon_idles_and_writes_nothing(cluster: Cluster) -> None:
    idle = cluster.start("node-x", clique_id="")
    wait_for(lambda: "idling until stopped" in idle.log.read_text(), TIMEOUT, "the idle message")
    assert idle.process.poll() is None
    assert cluster.clique() is None and not (idle.config_dir / "imexd.cfg").exists()
    assert idle.terminate() == 0


# 10 rounds in make test (each starts one or two runner processes), more with DRA_TEST_FULL=1 (make test-full).
CHURN_ROUNDS = 30 if os.environ.get("DRA_TEST_FULL") == "1" else 10


@pytest.mark.slow  # a soak; joining, leaving and restarts each have a quick test above
@pytest.mark.timeout(600)
def test_churn_keeps_slots_unique_fills_gaps_and_never_restarts_imex(cluster: Cluster) -> None:
    """Rounds of daemons leaving (SIGTERM) and joining (new nodes, and nodes coming back). Every version of
    the clique the API server ever held is checked, not only the ones between rounds."""
    seen: list[ComputeDomainClique] = []
    stop = threading.Event()
    watching = threading.Event()

    def record() -> None:
        with cluster.server.rest() as rest:
            stream = rest.watch(f"/apis/gpu.dra.dev/v1beta1/namespaces/{NAMESPACE}/computedomaincliques",
                                timeout_seconds=300)
            watching.set()
            for event in stream:
                if event.get("type") in ("ADDED", "MODIFIED"):
                    seen.append(parse_clique(event["object"]))
                if stop.is_set():
                    stream.close()
                    return

    recorder = threading.Thread(target=record, daemon=True)
    recorder.start()
    assert watching.wait(TIMEOUT)
    core = [cluster.start("core-0"), cluster.start("core-1")]
    running = {d.node: d for d in [*core, cluster.start("churn-0"), cluster.start("churn-1")]}
    cluster.wait_ready(list(running.values()))
    core_pids = {d.node: standin_pid(d) for d in core}
    reloads = {d.node: (d.standin_state() or {})["reloads"] for d in core}
    rng = random.Random(1418)
    names = iter(f"churn-{i}" for i in range(2, 100))
    gone: list[str] = []
    for round_ in range(CHURN_ROUNDS):
        churners = sorted(n for n in running if n.startswith("churn-"))
        leavers = rng.sample(churners, min(len(churners), rng.randint(1, 2)))
        for node in leavers:  # side by side, as a DaemonSet's pods go when their nodes lose the label
            running[node].send_term()
        for node in leavers:
            assert running.pop(node).terminate() == 0, f"round {round_}: {node} did not exit 0"
        gone.extend(leavers)
        clique = cluster.wait_ready(list(running.values()), f"round {round_}: after {leavers} left")
        free = sorted(set(range(18)) - set(slots(clique).values()))
        joiners = [gone.pop(0) if gone and rng.random() < 0.3 else next(names) for _ in range(rng.randint(1, 2))]
        for node in joiners:  # racing each other for the lowest free slots
            running[node] = cluster.start(node)
        clique = cluster.wait_ready(list(running.values()), f"round {round_}: {joiners} joined")
        assert sorted(slots(clique)[n] for n in joiners) == free[:len(joiners)], (
            f"round {round_}: {joiners} did not take the lowest free slots {free[:len(joiners)]}")
        for d in core:
            state = d.standin_state() or {}
            assert state.get("pid") == core_pids[d.node], f"round {round_}: {d.node}'s IMEX was restarted"
            assert state["reloads"] > reloads[d.node], f"round {round_}: {d.node}'s IMEX got no SIGUSR1"
            reloads[d.node] = state["reloads"]
    stop.set()
    cluster.rest.request("PUT", cluster.clique_path, body=cluster.rest.get(cluster.clique_path))  # wake the recorder
    recorder.join(TIMEOUT)
    assert len(seen) > 50
    for version in seen:
        indexes = [d.index for d in version.daemons]
        assert len(indexes) == len(set(indexes)), f"two entries share a slot: {version.daemons}"
        assert all(0 <= i < 18 for i in indexes)
