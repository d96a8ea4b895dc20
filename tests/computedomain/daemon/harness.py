"""What the IMEX daemon runner's tests share: the sandbox API server with the chart's ComputeDomainClique CRD, the
stand-in IMEX binaries, loopback pod addresses, and runner processes (`dra-driver compute-domain-daemon run`)."""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.computedomain.model import ComputeDomainClique, parse_clique
from dra_driver.computedomain.names import clique_object_name
from dra_driver.k8s.client import KubeRest
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.imex import install_standins
from dra_sandbox.imex.standin import RELOAD_INTERVAL_ENV, STATE_FILE
from tests.polling import wait_for

REPO = Path(__file__).resolve().parents[3]
CRD = REPO / "charts/dra-driver/crds/computedomaincliques.yaml"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
NAMESPACE = "default"
DOMAIN_UID = "3d1f0c2a-9e7b-4a61-b2c4-5f6e7d8c9b0a"
CLIQUE_ID = "8a2c4e6f-1b3d-4f5a-9c7e-0d2f4a6c8e1b.3"
RELOAD_INTERVAL_S = 0.5  # the runner's --reload-interval, so churn rounds stay short
# The stand-in drops SIGUSR1s sooner than this after the last (as IMEX does for 5 s); below the runner's interval, as the
# runner's default (5.25 s) is above IMEX's 5 s.
STANDIN_RELOAD_INTERVAL_S = 0.4
TIMEOUT = 30.0
# Membership settling (process starts, reloads, reconnects): generous, for loaded 2-core CI machines.
WAIT_TIMEOUT = 90.0


def install_clique_crd(rest: KubeRest) -> None:
    rest.request("POST", CRDS, body=yaml.safe_load(CRD.read_text()))
    wait_for(lambda: rest.get(f"/apis/gpu.dra.dev/v1beta1/namespaces/{NAMESPACE}/computedomaincliques") is not None,
             TIMEOUT, "the clique CRD is served")


class Addresses:
    """Distinct loopback addresses 127.<a>.<b>.<n> (Linux routes all of 127/8 to lo): one random /16 per test, so
    tests running side by side never bind the same IMEX ports."""

    def __init__(self) -> None:
        self.prefix = f"127.{random.randint(100, 250)}.{random.randint(1, 250)}"
        self.next = 10

    def take(self) -> str:
        self.next += 1
        return f"{self.prefix}.{self.next}"


@dataclass
class Daemon:
    node: str
    ip: str
    config_dir: Path
    process: subprocess.Popen[bytes]
    log: Path
    term_sent: bool = False

    def standin_state(self) -> dict[str, Any] | None:
        try:
            value: dict[str, Any] = json.loads((self.config_dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        return value

    def send_term(self) -> None:
        """SIGTERM once (the kubelet sends one; `terminate` then only waits)."""
        if not self.term_sent and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.term_sent = True

    def terminate(self, timeout: float = TIMEOUT) -> int:
        self.send_term()
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            tail = self.log.read_text()[-3000:]
            raise AssertionError(f"{self.node} did not exit {timeout:.0f}s after SIGTERM; its log ends:\n{tail}") from None


@dataclass
class Cluster:
    """The API server, a kubeconfig for the runners, the stand-ins and the runners started so far."""

    server: ApiServer
    rest: KubeRest
    root: Path
    bin_dir: Path
    kubeconfig: Path
    addresses: Addresses = field(default_factory=Addresses)
    daemons: list[Daemon] = field(default_factory=list)

    @property
    def clique_path(self) -> str:
        return (f"/apis/gpu.dra.dev/v1beta1/namespaces/{NAMESPACE}/computedomaincliques/"
                f"{clique_object_name(DOMAIN_UID, CLIQUE_ID)}")

    def clique(self) -> ComputeDomainClique | None:
        obj = self.rest.get(self.clique_path)
        return parse_clique(obj) if obj is not None else None

    def start(self, node: str, *, ip: str | None = None, clique_id: str = CLIQUE_ID, max_nodes: int = 18,
              env: dict[str, str] | None = None) -> Daemon:
        address = ip or self.addresses.take()
        config_dir = self.root / node
        config_dir.mkdir(exist_ok=True)
        log = self.root / f"{node}.log"
        environ = {
            **os.environ,
            "NODE_NAME": node, "POD_IP": address, "POD_NAMESPACE": NAMESPACE, "POD_NAME": f"daemon-{node}",
            "POD_UID": f"uid-{node}", "CLIQUE_ID": clique_id, "COMPUTE_DOMAIN_UUID": DOMAIN_UID,
            "COMPUTE_DOMAIN_NAME": "domain", "COMPUTE_DOMAIN_NAMESPACE": "team",
            "MAX_NODES_PER_IMEX_DOMAIN": str(max_nodes), RELOAD_INTERVAL_ENV: str(STANDIN_RELOAD_INTERVAL_S),
            **(env or {}),
        }
        argv = [sys.executable, "-m", "dra_driver.cli", "compute-domain-daemon", "run", "--config-dir",
                str(config_dir), "--imex-bin-dir", str(self.bin_dir), "--kubeconfig", str(self.kubeconfig),
                "--system-hosts-file", "", "--readiness-interval", "0.5", "--reload-interval",
                str(RELOAD_INTERVAL_S), "--log-format", "text"]
        with log.open("ab") as out:
            process = subprocess.Popen(argv, env=environ, stdout=out, stderr=subprocess.STDOUT)
        daemon = Daemon(node, address, config_dir, process, log)
        self.daemons.append(daemon)
        return daemon

    def wait_ready(self, daemons: list[Daemon], what: str = "daemons Ready") -> ComputeDomainClique:
        """Until the clique holds exactly `daemons`' entries, all Ready, with their IPs, and each daemon's IMEX is
        READY connected to exactly the others (an entry's status lags its IMEX by up to a readiness interval)."""
        wanted = {d.node: d.ip for d in daemons}

        def imex_current(d: Daemon) -> bool:
            state = d.standin_state()
            if state is None or not state["ready"]:
                return False
            peers = {p["address"] for p in state["peers"].values() if p["state"] == "C"}
            return peers == set(wanted.values()) - {d.ip}

        def check() -> ComputeDomainClique | None:
            clique = self.clique()
            if clique is None:
                return None
            entries = {d.name: d for d in clique.daemons}
            if set(entries) != set(wanted):
                return None
            good = all(entries[n].ready and entries[n].ip_address == ip for n, ip in wanted.items())
            return clique if good and all(imex_current(d) for d in daemons) else None

        try:
            return wait_for(check, WAIT_TIMEOUT, what, interval=0.05)
        except TimeoutError as exc:
            clique = self.clique()
            entries = clique.daemons if clique is not None else ()
            states = {d.node: d.standin_state() for d in daemons}
            raise AssertionError(f"{exc}\nentries: {entries}\nIMEX states: {states}") from None


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with ApiServer() as server, server.rest() as rest:
        install_clique_crd(rest)
        kubeconfig = tmp_path / "kubeconfig"
        server.write_kubeconfig(kubeconfig)
        bin_dir = tmp_path / "bin"
        install_standins(bin_dir)
        c = Cluster(server, rest, tmp_path, bin_dir, kubeconfig)
        try:
            yield c
        finally:
            for daemon in c.daemons:
                if daemon.process.poll() is None:
                    daemon.process.kill()
                    daemon.process.wait(10)
            # The stand-ins exit when their runner dies; wait for them so no port outlives the test.
            for daemon in c.daemons:
                state = daemon.standin_state()
                if state:
                    wait_for(functools.partial(_exited, state["pid"]), 10.0, f"stand-in {state['pid']} exited")


def _exited(pid: int) -> bool:
    return not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (not yet reaped) no longer holds sockets.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False
