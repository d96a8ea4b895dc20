"""The ComputeDomain reconciler inside `dra-driver controller` (kopf, leader election on): a domain applied through
the API gets its objects and status without any explicit pass, a clique entry written as a daemon would turns it
Ready, and deleting it removes everything, its finalizer last. Only the Lease holder reconciles."""

from __future__ import annotations

import threading
from pathlib import Path

from dra_driver.computedomain import names
from dra_driver.controller.computedomains.loop import ComputeDomainSettings
from dra_driver.controller.computedomains.objects import DaemonSetSettings
from dra_driver.controller.leader import LeaseSettings
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.operator import ControllerSettings, run
from dra_sandbox.apiserver import ApiServer
from tests.controller.test_compute_domains_sandbox import (
    CDS,
    CLIQUE_ID,
    CLIQUES,
    DAEMONSETS,
    DRIVER_NS,
    RCTS,
    apply_crds,
    daemon_pod,
    write_entry,
)
from tests.polling import wait_for

TIMEOUT = 30.0


def test_a_domain_through_the_running_controller(tmp_path: Path) -> None:
    with ApiServer() as srv, srv.rest() as rest:
        apply_crds(rest)
        for ns in (DRIVER_NS, "team"):
            rest.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                             "metadata": {"name": ns}})
        rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
        kubeconfig = tmp_path / "kubeconfig"
        srv.write_kubeconfig(kubeconfig)
        metrics = ControllerMetrics()
        options = ControllerSettings(
            driver_name="gpu.dra.dev", kubeconfig=str(kubeconfig), healthz_port=-1, resync_seconds=5.0,
            watch_timeout_seconds=10, stale_slice_grace_seconds=0,
            leader_election=LeaseSettings(name="ctl", namespace=DRIVER_NS, identity="a", duration_seconds=3.0,
                                          renew_deadline_seconds=2.0, retry_seconds=1.0),
            compute_domains=ComputeDomainSettings(daemon=DaemonSetSettings(namespace=DRIVER_NS, image="dra-driver:x"),
                                                  status_interval_seconds=0.2),
        )
        stop, ready = threading.Event(), threading.Event()
        thread = threading.Thread(target=run, args=(options,), kwargs={"stop_flag": stop, "ready_flag": ready,
                                                                       "metrics": metrics}, daemon=True)
        thread.start()
        try:
            assert ready.wait(TIMEOUT)
            cd = rest.request("POST", CDS.format(ns="team"), body={
                "apiVersion": "gpu.dra.dev/v1beta1", "kind": "ComputeDomain",
                "metadata": {"name": "job", "namespace": "team"},
                "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "job-channel"}}}})
            uid = cd["metadata"]["uid"]
            ds = wait_for(lambda: rest.get(f"{DAEMONSETS}/computedomain-daemon-{uid}"), TIMEOUT, "the DaemonSet")
            assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == "dra-driver:x"
            assert rest.get(f"{RCTS.format(ns='team')}/job-channel") is not None
            daemon_pod(rest, uid, "n1")
            write_entry(rest, uid, "n1", "Ready")
            wait_for(lambda: ((rest.get(f"{CDS.format(ns='team')}/job") or {}).get("status") or {}).get("status")
                     == "Ready", TIMEOUT, "the domain Ready")
            assert metrics.value("dra_driver_controller_leader") == 1
            wait_for(lambda: metrics.value("dra_driver_controller_compute_domains", {"status": "Ready"}) == 1,
                     TIMEOUT, "the Ready domain counted")
            # An Event on the domain (the product's recorder, in the domain's namespace).
            wait_for(lambda: any(e["reason"] == "Ready" and e["involvedObject"]["uid"] == uid for e in rest.request(
                "GET", "/api/v1/namespaces/team/events")["items"]), TIMEOUT, "the Ready Event")

            rest.request("DELETE", f"{CDS.format(ns='team')}/job")
            wait_for(lambda: rest.get(f"{CDS.format(ns='team')}/job") is None, TIMEOUT, "the domain gone")
            assert rest.get(f"{DAEMONSETS}/computedomain-daemon-{uid}") is None
            assert rest.get(f"{RCTS.format(ns='team')}/job-channel") is None
            assert rest.get(f"{CLIQUES}/{names.clique_object_name(uid, CLIQUE_ID)}") is None
        finally:
            stop.set()
            thread.join(TIMEOUT)
        assert not thread.is_alive()
