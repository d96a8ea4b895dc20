"""Two `dra-driver controller` replicas with leader election against the sandbox API server: exactly one
reconciles (the Lease holder), and when it dies the other takes over within the lease duration."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.controller.leader import Attempt, LeaderElector, LeaseSettings
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.operator import ControllerSettings, run
from dra_driver.k8s.client import ApiError, KubeRest
from dra_sandbox.apiserver import ApiServer
from tests.controller.test_controller_sandbox import (
    CHART_CRD,
    CLASSES,
    DRIVER,
    POLICIES,
    TIMESLICED,
    policy,
    wait_ready,
)
from tests.controller.test_status_and_hygiene import H100, gpu, node, resource_slice
from tests.polling import wait_for

LEASE = "/apis/coordination.k8s.io/v1/namespaces/default/leases/dra-driver-controller"
DURATION = 3.0
TIMEOUT = 20.0


@dataclass
class Replica:
    name: str
    stop: threading.Event = field(default_factory=threading.Event)
    ready: threading.Event = field(default_factory=threading.Event)
    metrics: ControllerMetrics = field(default_factory=ControllerMetrics)
    result: list[int] = field(default_factory=list)
    thread: threading.Thread | None = None

    def reconciles(self) -> float:
        return sum(self.metrics.value("dra_driver_controller_reconciles_total", {"outcome": o})
                   for o in ("ready", "invalid", "retry", "error"))


def lease_options(identity: str, *, release: bool = True) -> LeaseSettings:
    return LeaseSettings(name="dra-driver-controller", namespace="default", identity=identity,
                        duration_seconds=DURATION, renew_deadline_seconds=2.0, retry_seconds=0.25,
                        release_on_stop=release)


def start(kubeconfig: Path, name: str, *, release: bool = True, metrics_port: int = -1) -> Replica:
    replica = Replica(name)
    options = ControllerSettings(driver_name=DRIVER, kubeconfig=str(kubeconfig), healthz_port=-1, resync_seconds=1.0,
                                watch_timeout_seconds=10, leader_election=lease_options(name, release=release),
                                metrics_port=metrics_port)

    def main() -> None:
        replica.result.append(run(options, stop_flag=replica.stop, ready_flag=replica.ready, metrics=replica.metrics))

    replica.thread = threading.Thread(target=main, name=f"controller-{name}", daemon=True)
    replica.thread.start()
    return replica


def stop(replica: Replica) -> None:
    replica.stop.set()
    assert replica.thread is not None
    replica.thread.join(TIMEOUT)
    assert not replica.thread.is_alive(), f"controller {replica.name} did not stop"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[ApiServer, KubeRest, Path]]:
    with ApiServer() as srv, srv.rest() as rest:
        rest.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                     body=yaml.safe_load(CHART_CRD.read_text()))
        kubeconfig = tmp_path / "kubeconfig"
        srv.write_kubeconfig(kubeconfig)
        yield srv, rest, kubeconfig


def holder(rest: KubeRest) -> str | None:
    lease = rest.get(LEASE)
    return ((lease or {}).get("spec") or {}).get("holderIdentity") or None


def test_sandbox_leases_conflict_on_stale_resource_version(api: tuple[ApiServer, KubeRest, Path]) -> None:
    _, rest, _ = api
    created = rest.request("POST", "/apis/coordination.k8s.io/v1/namespaces/default/leases", body={
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "x", "namespace": "default"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 3}})
    path = "/apis/coordination.k8s.io/v1/namespaces/default/leases/x"
    updated = rest.request("PUT", path, body={**created, "spec": {**created["spec"], "holderIdentity": "b"}})
    assert updated["spec"]["holderIdentity"] == "b"
    with pytest.raises(ApiError) as stale:
        rest.request("PUT", path, body={**created, "spec": {**created["spec"], "holderIdentity": "c"}})
    assert stale.value.status == 409
    assert holder_of(rest, path) == "b"


def holder_of(rest: KubeRest, path: str) -> str | None:
    lease = rest.get(path)
    return ((lease or {}).get("spec") or {}).get("holderIdentity")


def test_elector_steps(api: tuple[ApiServer, KubeRest, Path]) -> None:
    """One elector creates the Lease; a second is held off until the record stops changing for the duration."""
    _, rest, _ = api
    now = [0.0]
    a = LeaderElector(rest, lease_options("a"), clock=lambda: now[0])
    b = LeaderElector(rest, lease_options("b"), clock=lambda: now[0])
    assert a.try_acquire_or_renew() is Attempt.LEADING
    assert b.try_acquire_or_renew() is Attempt.HELD
    now[0] = 2.0
    assert a.try_acquire_or_renew() is Attempt.LEADING  # renewed: b sees a new record
    assert b.try_acquire_or_renew() is Attempt.HELD
    now[0] = 2.0 + DURATION + 0.1  # a stopped renewing
    assert b.try_acquire_or_renew() is Attempt.LEADING
    lease = rest.get(LEASE)
    assert lease is not None and lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    assert a.try_acquire_or_renew() is Attempt.HELD


def test_two_replicas_one_reconciles_and_the_other_takes_over(api: tuple[ApiServer, KubeRest, Path]) -> None:
    srv, rest, kubeconfig = api
    first = start(kubeconfig, "replica-a", release=False, metrics_port=0)
    second = start(kubeconfig, "replica-b", release=False)
    replicas = {r.name: r for r in (first, second)}
    try:
        assert first.ready.wait(TIMEOUT) and second.ready.wait(TIMEOUT)
        leader_name = wait_for(lambda: holder(rest), TIMEOUT, "a Lease holder", interval=0.05)
        leader = replicas[leader_name]
        follower = next(r for r in replicas.values() if r is not leader)

        rest.request("POST", POLICIES, body=policy("one", TIMESLICED))
        wait_ready(rest, "one", "True")
        assert rest.get(f"{CLASSES}/one") is not None
        assert leader.reconciles() >= 1
        assert follower.reconciles() == 0, "the follower reconciled"
        assert leader.metrics.value("dra_driver_controller_leader") == 1
        assert follower.metrics.value("dra_driver_controller_leader") == 0
        wait_for(lambda: leader.metrics.value("dra_driver_controller_policies", {"ready": "True"}) == 1, TIMEOUT,
                 "the leader to count the Ready policy", interval=0.05)

        # Kill the leader without releasing the Lease (as a crash would): the follower takes over once the
        # record has not changed for the lease duration, and reconciles a new policy.
        killed_at = time.monotonic()
        leader.stop.set()
        wait_for(lambda: holder(rest) == follower.name, DURATION + 5.0, "the follower to take the Lease",
                 interval=0.05)
        took_over = time.monotonic() - killed_at
        assert took_over < DURATION + 2.0, f"takeover took {took_over:.1f}s"
        stop(leader)
        assert leader.result == [0]
        lease = rest.get(LEASE)
        assert lease is not None and lease["spec"]["leaseTransitions"] >= 1

        rest.request("POST", POLICIES, body=policy("two", {k: v for k, v in TIMESLICED.items() if k != "extendedResourceName"}))
        wait_ready(rest, "two", "True")
        assert rest.get(f"{CLASSES}/two") is not None
        assert follower.reconciles() >= 1
        assert follower.metrics.value("dra_driver_controller_leader") == 1
    finally:
        for replica in replicas.values():
            if replica.thread is not None and replica.thread.is_alive():
                stop(replica)
    assert srv.request_log.count(verb="update", resource="leases") >= 2


def test_a_replica_that_loses_the_lease_stops_reconciling_and_exits_non_zero(
    api: tuple[ApiServer, KubeRest, Path],
) -> None:
    _, rest, kubeconfig = api
    replica = start(kubeconfig, "replica-a", metrics_port=0)
    try:
        assert replica.ready.wait(TIMEOUT)
        wait_for(lambda: holder(rest) == "replica-a", TIMEOUT, "replica-a to lead", interval=0.05)
        # Somebody else writes the Lease (a partition healed, an operator edited it): replica-a sees another
        # holder at its next renewal and steps down.
        def steal() -> bool:
            lease = rest.get(LEASE)
            assert lease is not None
            spec = {**lease["spec"], "holderIdentity": "intruder"}
            try:
                rest.request("PUT", LEASE, body={**lease, "spec": spec})
            except ApiError as exc:
                if exc.status == 409:
                    return False  # raced with a renewal; try again
                raise
            return True

        wait_for(steal, TIMEOUT, "the Lease to be taken", interval=0.01)
        assert replica.thread is not None
        replica.thread.join(TIMEOUT)
        assert not replica.thread.is_alive(), "the replica kept running without the Lease"
        assert replica.result == [1]
        assert holder(rest) == "intruder"
        assert replica.metrics.value("dra_driver_controller_leader") == 0
    finally:
        if replica.thread is not None and replica.thread.is_alive():
            stop(replica)


def test_clean_stop_releases_the_lease(api: tuple[ApiServer, KubeRest, Path]) -> None:
    _, rest, kubeconfig = api
    replica = start(kubeconfig, "replica-a", metrics_port=0)
    try:
        assert replica.ready.wait(TIMEOUT)
        wait_for(lambda: holder(rest) == "replica-a", TIMEOUT, "replica-a to lead", interval=0.05)
    finally:
        stop(replica)
    assert replica.result == [0]
    assert holder(rest) is None


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body: Any = response.read()
    return body.decode() if isinstance(body, bytes) else str(body)


def test_a_follower_serves_the_webhook_and_metrics(tmp_path: Path) -> None:
    """Another replica holds the Lease: this one never reconciles, yet admission works through it, and its
    /metrics has every series from the start."""
    from dra_driver.controller.webhook import WebhookSettings
    from dra_sandbox.cluster import free_tcp_port
    from tests.controller.test_webhook_sandbox import (
        CLAIMS,
        SERVICE,
        WEBHOOKS,
        claim,
        configuration,
        listening,
        make_certs,
    )

    make_certs(tmp_path)
    port = free_tcp_port()
    with ApiServer(webhook_service_urls={"/".join(SERVICE): f"https://127.0.0.1:{port}"}) as srv, \
            srv.rest() as rest:
        rest.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                     body=yaml.safe_load(CHART_CRD.read_text()))
        rest.request("POST", "/apis/coordination.k8s.io/v1/namespaces/default/leases", body={
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "dra-driver-controller", "namespace": "default"},
            "spec": {"holderIdentity": "the-leader", "leaseDurationSeconds": 3600}})
        kubeconfig = tmp_path / "kubeconfig"
        srv.write_kubeconfig(kubeconfig)
        replica = Replica("replica-b")
        webhook = WebhookSettings(port=port, addr="127.0.0.1", certfile=str(tmp_path / "tls.crt"),
                                 keyfile=str(tmp_path / "tls.key"))
        options = ControllerSettings(driver_name=DRIVER, kubeconfig=str(kubeconfig), healthz_port=-1,
                                    resync_seconds=1.0, watch_timeout_seconds=10, webhook=webhook,
                                    leader_election=lease_options("replica-b"), metrics_port=free_tcp_port(),
                                    metrics_host="127.0.0.1")
        replica.thread = threading.Thread(
            target=lambda: replica.result.append(run(options, stop_flag=replica.stop, ready_flag=replica.ready,
                                                     metrics=replica.metrics)), daemon=True)
        replica.thread.start()
        try:
            assert replica.ready.wait(TIMEOUT)
            wait_for(lambda: listening(port), TIMEOUT, "the webhook server listening")
            rest.request("POST", WEBHOOKS, body=configuration((tmp_path / "ca.crt").read_bytes(), "Fail"))
            with pytest.raises(ApiError) as refused:
                rest.request("POST", CLAIMS, body=claim("too-much", 101))
            assert refused.value.status == 422
            assert "defaultActiveThreadPercentage" in refused.value.body["message"]
            rest.request("POST", CLAIMS, body=claim("fine", 50))
            rest.request("POST", POLICIES, body=policy("ignored", TIMESLICED))
            text = scrape(options.metrics_port)
            for series in (
                'dra_driver_controller_admissions_total{resource="resourceclaims",result="denied"} 1.0',
                'dra_driver_controller_admissions_total{resource="resourceclaims",result="allowed"} 1.0',
                'dra_driver_controller_admissions_total{resource="deviceclasses",result="denied"} 0.0',
                'dra_driver_controller_reconciles_total{outcome="ready"} 0.0',
                'dra_driver_controller_reconciles_total{outcome="error"} 0.0',
                'dra_driver_controller_policies{ready="True"} 0.0',
                "dra_driver_controller_leader 0.0",
                "dra_driver_controller_stale_slices_deleted_total 0.0",
                "dra_driver_controller_reconcile_seconds_count 0.0",
            ):
                assert series in text, series
            assert holder(rest) == "the-leader"
            policy_now = rest.get(f"{POLICIES}/ignored")
            assert policy_now is not None and "status" not in policy_now  # nobody reconciled it
            assert rest.get(f"{CLASSES}/ignored") is None
        finally:
            stop(replica)
        assert replica.result == [0]
        assert holder(rest) == "the-leader"  # a follower releases nothing


def test_the_command_releases_the_lease_on_sigterm(api: tuple[ApiServer, KubeRest, Path]) -> None:
    """`dra-driver controller --leader-elect` as a process (kopf in the main thread, signal handlers): it leads,
    and SIGTERM ends it with status 0 and an empty holder."""
    _, rest, kubeconfig = api
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")}
    env.update({"POD_NAME": "controller-pod-1", "POD_NAMESPACE": "default"})
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from dra_driver.cli import main; sys.exit(main())", "controller", "--kubeconfig", str(kubeconfig), "--leader-elect",
         "--lease-name", "dra-driver-controller", "--lease-duration", "3", "--healthz-port", "-1",
         "--metrics-port", "-1", "--log-level", "warning"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: holder(rest) == "controller-pod-1", TIMEOUT, "the process to lead", interval=0.05)
        rest.request("POST", POLICIES, body=policy("from-process", TIMESLICED))
        wait_ready(rest, "from-process", "True")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert holder(rest) is None


# --- the view's initial sync across a leader handover (controller/informer.py) ---
def test_a_new_leader_lists_afresh_and_counts_what_changed_during_the_handover(
    api: tuple[ApiServer, KubeRest, Path],
) -> None:
    """The leader counts a policy's devices from its LIST; it stops (Lease released) and, while no replica leads,
    a node's slice is deleted and another node's added. The follower takes over, LISTs, and its counts are the
    cluster's now. Every replica's feed threads end with it."""
    _, rest, kubeconfig = api
    for name, count in (("n1", 2), ("n2", 3)):
        rest.request("POST", "/api/v1/nodes", body=node(name))
        rest.request("POST", "/apis/resource.k8s.io/v1/resourceslices",
                     body=resource_slice(name, [gpu(i, H100) for i in range(count)]))
    rest.request("POST", POLICIES, body=policy("h100", {"devices": {"type": "gpu", "productNames": [H100]}}))

    def counted(devices: int, nodes: int) -> bool:
        status = (rest.get(f"{POLICIES}/h100") or {}).get("status") or {}
        return (status.get("devices"), status.get("nodes")) == (devices, nodes)

    first = start(kubeconfig, "replica-a")
    wait_for(lambda: holder(rest) == "replica-a", TIMEOUT, "replica-a leading")
    second = start(kubeconfig, "replica-b")
    try:
        wait_for(lambda: counted(5, 2), TIMEOUT, "the leader's first counts")
        stop(first)  # releases the Lease
        rest.request("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/n1-{DRIVER}")
        rest.request("POST", "/api/v1/nodes", body=node("n3"))
        rest.request("POST", "/apis/resource.k8s.io/v1/resourceslices",
                     body=resource_slice("n3", [gpu(i, H100) for i in range(4)]))
        wait_for(lambda: holder(rest) == "replica-b", TIMEOUT, "replica-b leading")
        wait_for(lambda: counted(7, 2), TIMEOUT, "the new leader's counts")
    finally:
        stop(second)
    assert first.result == [0] and second.result == [0]
    assert [t.name for t in threading.enumerate() if t.name.startswith("feed-")] == []
