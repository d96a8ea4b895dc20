"""`kubectl get pods`' STATUS column as printPod (pkg/printers/internalversion/printers.go) fills it: what a person
reads for a finished, failing, initializing or terminating pod (issue 38: `Completed`, not the phase)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from dra_sandbox.apiserver.registry import BUILTIN_TYPES
from dra_sandbox.apiserver.tables import to_table

PODS = next(rt for rt in BUILTIN_TYPES if rt.key == ("", "pods"))
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _status_of(pod: dict[str, Any]) -> object:
    table = to_table(PODS, [pod], NOW)
    names = [c["name"] for c in table["columnDefinitions"]]
    return table["rows"][0]["cells"][names.index("Status")]


def _pod(status: dict[str, Any], *, init: list[dict[str, Any]] | None = None, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "default", "creationTimestamp": "2026-01-01T00:00:00Z"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:30Z"
    spec: dict[str, Any] = {"containers": [{"name": "a"}, {"name": "b"}]}
    if init is not None:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def _running(ready: bool = True) -> dict[str, Any]:
    return {"name": "x", "ready": ready, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}


def _done(code: int = 0, reason: str | None = "Completed", signal: int = 0) -> dict[str, Any]:
    terminated: dict[str, Any] = {"exitCode": code}
    if reason:
        terminated["reason"] = reason
    if signal:
        terminated["signal"] = signal
    return {"name": "x", "ready": False, "state": {"terminated": terminated}}


READY = [{"type": "Ready", "status": "True"}, {"type": "Initialized", "status": "True"}]


@pytest.mark.parametrize(("status", "shown"), [
    ({"phase": "Succeeded", "containerStatuses": [_done(), _done()]}, "Completed"),
    ({"phase": "Failed", "containerStatuses": [_done(), _done(1, "Error")]}, "Error"),
    ({"phase": "Failed", "containerStatuses": [_done(2, None)]}, "ExitCode:2"),
    ({"phase": "Failed", "containerStatuses": [_done(137, None, signal=9)]}, "Signal:9"),
    ({"phase": "Running", "conditions": READY, "containerStatuses": [_running(), _done()]}, "Running"),
    ({"phase": "Running", "containerStatuses": [_running(), _done()]}, "NotReady"),
    ({"phase": "Running", "containerStatuses": [_running(), _done(1, "Error")]}, "Error"),
    ({"phase": "Pending", "containerStatuses": [{"name": "a", "state": {"waiting": {"reason": "ContainerCreating"}}}]},
     "ContainerCreating"),
    ({"phase": "Running", "containerStatuses": [_running(), _running()]}, "Running"),
    ({"phase": "Pending"}, "Pending"),
    ({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]},
     "SchedulingGated"),
    ({"phase": "Failed", "reason": "Evicted"}, "Evicted"),
    ({}, "Pending"),
])
def test_the_status_column_reads_the_containers(status: dict[str, Any], shown: str) -> None:
    assert _status_of(_pod(status)) == shown


def test_init_containers_show_their_progress() -> None:
    init = [{"name": "i0"}, {"name": "i1"}, {"name": "side", "restartPolicy": "Always"}]
    waiting = {"name": "i1", "state": {"waiting": {"reason": "PodInitializing"}}}
    assert _status_of(_pod({"phase": "Pending", "initContainerStatuses": [_done(), waiting]}, init=init)) == "Init:1/3"
    crash = {"name": "i1", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
    assert _status_of(_pod({"phase": "Pending", "initContainerStatuses": [_done(), crash]},
                           init=init)) == "Init:CrashLoopBackOff"
    failed = {**_done(1, "Error"), "name": "i0"}
    assert _status_of(_pod({"phase": "Failed", "initContainerStatuses": [failed]}, init=init)) == "Init:Error"
    sidecar = {"name": "side", "started": True, "state": {"running": {}}}
    status = {"phase": "Running", "conditions": READY, "initContainerStatuses": [_done(), _done(), sidecar],
              "containerStatuses": [_running(), _running()]}
    assert _status_of(_pod(status, init=init)) == "Running"


def test_a_pod_being_deleted_is_terminating_until_it_finished() -> None:
    assert _status_of(_pod({"phase": "Running", "containerStatuses": [_running()]}, deleting=True)) == "Terminating"
    assert _status_of(_pod({"phase": "Succeeded", "containerStatuses": [_done()]}, deleting=True)) == "Completed"
    assert _status_of(_pod({"phase": "Running", "reason": "NodeLost"}, deleting=True)) == "Unknown"
