"""`dra-driver status --pool-status` (KEP-5677 ResourcePoolStatusRequest): discovery first and nothing sent where the
kind is not served; where it is, one request created, its answer awaited by a watch, the request deleted whatever
happened; the report as a table or under each node's `poolStatus` (docs/reference/dra-in-flight.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, cast

import pytest

from dra_driver.commands.poolstatus import NOT_SERVED, PATH, PoolStatusQuery, PoolStatusUnavailable, pool_status
from dra_driver.commands.poolstatusview import (
    PoolReport,
    finished,
    only_nodes,
    parse_report,
    pool_data,
    render_pool_table,
)
from dra_driver.commands.status import status_text
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_sandbox.apiserver import ApiServer

DRIVER = "gpu.dra.dev"
GROUP_PATH = "/apis/resource.k8s.io/v1alpha3"


def _answer(*pools: JsonObject, count: int | None = None) -> JsonObject:
    return {"poolCount": len(pools) if count is None else count, "pools": list(pools),
            "conditions": [{"type": "Complete", "status": "True", "reason": "Done", "message": ""}]}


def _pool(node: str, **counts: Any) -> JsonObject:
    return {"driver": DRIVER, "poolName": node, "nodeName": node, "generation": 3, "resourceSliceCount": 2,
            "totalDevices": 16, "allocatedDevices": 2, "availableDevices": 13, "unavailableDevices": 1, **counts}


class FakeControlPlane:
    """The API calls `pool_status` makes, answered as kube-apiserver + kube-controller-manager would; records them."""

    def __init__(self, *, served: bool = True, answer: JsonObject | None = None, answer_at_once: bool = False,
                 refuse_create: ApiError | None = None, refuse_delete: ApiError | None = None) -> None:
        self.served, self.answer, self.answer_at_once = served, answer, answer_at_once
        self.refuse_create, self.refuse_delete = refuse_create, refuse_delete
        self.calls: list[tuple[str, str]] = []
        self.bodies: list[JsonObject] = []
        self.objects: dict[str, JsonObject] = {}

    def get(self, path: str, **_: Any) -> JsonObject | None:
        self.calls.append(("GET", path))
        if path == GROUP_PATH:
            names = ["devicetaintrules"] + (["resourcepoolstatusrequests"] if self.served else [])
            return {"resources": [{"name": n} for n in names]}
        return self.objects.get(path.rsplit("/", 1)[1])

    def request(self, method: str, path: str, *, body: JsonObject | None = None, **_: Any) -> JsonObject:
        self.calls.append((method, path))
        if method == "POST":
            if self.refuse_create is not None:
                raise self.refuse_create
            assert body is not None
            self.bodies.append(body)
            obj = {**body, "metadata": {"name": "dra-driver-status-x1", "resourceVersion": "7"}}
            if self.answer_at_once and self.answer is not None:
                obj["status"] = self.answer
            self.objects["dra-driver-status-x1"] = obj
            return obj
        if method == "DELETE":
            if self.refuse_delete is not None:
                raise self.refuse_delete
            self.objects.pop(path.rsplit("/", 1)[1], None)
            return {}
        raise AssertionError(f"unexpected {method} {path}")

    def watch(self, path: str, *, query: dict[str, Any], timeout_seconds: int) -> Any:
        self.calls.append(("WATCH", path))
        assert query == {"fieldSelector": "metadata.name=dra-driver-status-x1", "resourceVersion": "7"}
        assert timeout_seconds >= 1
        events: list[JsonObject] = [{"type": "MODIFIED", "object": {"metadata": {"name": "x"}}}]  # no status yet
        if self.answer is not None:
            events.append({"type": "MODIFIED", "object": {"metadata": {"name": "x"}, "status": self.answer}})
        return _Stream(events)


class _Stream:
    def __init__(self, events: list[JsonObject]) -> None:
        self.events, self.closed = events, False

    def __iter__(self) -> Iterator[JsonObject]:
        return iter(self.events)

    def close(self) -> None:
        self.closed = True


def _query(plane: FakeControlPlane, pool: str | None = None) -> tuple[PoolReport, list[str]]:
    return pool_status(cast(KubeRest, plane), PoolStatusQuery(DRIVER, pool, 5.0))


def test_a_server_without_the_kind_gets_only_the_discovery_get() -> None:
    plane = FakeControlPlane(served=False)
    with pytest.raises(PoolStatusUnavailable) as refused:
        _query(plane)
    assert str(refused.value) == NOT_SERVED and "DRAResourcePoolStatus" in NOT_SERVED
    assert plane.calls == [("GET", GROUP_PATH)]


def test_one_request_is_created_awaited_by_a_watch_and_deleted() -> None:
    plane = FakeControlPlane(answer=_answer(_pool("node-b"), _pool("node-a", validationError="bad slice")))
    report, warnings = _query(plane, "node-a")
    assert warnings == [] and report.failed == "" and report.pool_count == 2
    assert [p.node for p in report.pools] == ["node-a", "node-b"]
    assert report.pools[0].problem == "bad slice" and report.pools[1].devices == 16
    assert plane.bodies == [{"apiVersion": "resource.k8s.io/v1alpha3", "kind": "ResourcePoolStatusRequest",
                             "metadata": {"generateName": "dra-driver-status-"},
                             "spec": {"driver": DRIVER, "limit": 1000, "poolName": "node-a"}}]
    name = f"{PATH}/dra-driver-status-x1"
    assert plane.calls == [("GET", GROUP_PATH), ("POST", PATH), ("GET", name), ("WATCH", PATH), ("DELETE", name)]
    assert plane.objects == {}


def test_an_answer_already_there_needs_no_watch() -> None:
    plane = FakeControlPlane(answer=_answer(_pool("node-a")), answer_at_once=True)
    report, _ = _query(plane)
    assert len(report.pools) == 1 and ("WATCH", PATH) not in plane.calls
    assert plane.calls[-1][0] == "DELETE"


def test_no_answer_in_time_is_an_error_and_the_request_is_still_deleted() -> None:
    plane = FakeControlPlane(answer=None)
    with pytest.raises(PoolStatusUnavailable, match="did not answer ResourcePoolStatusRequest dra-driver-status-x1"):
        _query(plane)
    assert plane.calls[-1] == ("DELETE", f"{PATH}/dra-driver-status-x1") and plane.objects == {}


def test_a_refused_create_and_an_undeletable_request_are_reported() -> None:
    forbidden = ApiError(403, "Forbidden", {"message": "cannot create resourcepoolstatusrequests"})
    with pytest.raises(PoolStatusUnavailable, match=r"could not create a ResourcePoolStatusRequest: .*403"):
        _query(FakeControlPlane(refuse_create=forbidden))
    plane = FakeControlPlane(answer=_answer(_pool("node-a")), refuse_delete=ApiError(403, "Forbidden"))
    report, warnings = _query(plane)
    assert len(report.pools) == 1
    assert warnings and "delete it by hand" in warnings[0]


def test_the_report_reads_only_this_drivers_pools_and_untrusted_values_show_as_unknown() -> None:
    answer = _answer(_pool("node-a", totalDevices="16", allocatedDevices=True), {**_pool("node-x"), "driver": "other"},
                     cast(JsonObject, "junk"), count=7)
    report = parse_report({"status": answer}, DRIVER)
    assert [p.pool for p in report.pools] == ["node-a"]
    assert report.pools[0].devices is None and report.pools[0].allocated is None  # not ints: not trusted
    text = render_pool_table(report)
    assert "POOL STATUS" in text and "node-a" in text and "the controller counted 7 pools; this shows 1" in text
    assert "-" in text.splitlines()[2].split()
    assert only_nodes(report, ["node-b"]).pools == ()
    failed = parse_report({"status": {"conditions": [{"type": "Failed", "status": "True", "message": "boom"}]}},
                          DRIVER)
    assert failed.failed == "boom" and render_pool_table(failed).endswith("the request failed: boom")
    assert finished({"status": {"conditions": [{"type": "Failed", "status": "True"}]}})
    assert not finished({"status": {"conditions": [{"type": "Complete", "status": "False"}]}})
    assert not finished({}) and not finished(None)


def test_status_against_the_sandbox_sends_no_pool_request_and_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    """The sandbox API server does not serve the kind (as a 1.37 server with the gate off): the status is the same
    as without --pool-status, stderr names the gate, and nothing but discovery was asked."""
    with ApiServer() as srv, srv.rest() as rest:
        plain = status_text(rest, driver=DRIVER, nodes=[], output="json")
        with_flag = status_text(rest, driver=DRIVER, nodes=[], output="json", pool_status_timeout=2.0)
        assert with_flag == plain
        assert srv.request_log.count(resource="resourcepoolstatusrequests") == 0
    assert "no pool status: the API server does not serve ResourcePoolStatusRequest" in capsys.readouterr().err


def test_status_shows_the_report_per_node_in_json(monkeypatch: pytest.MonkeyPatch) -> None:
    from dra_driver.commands import status

    plane = FakeControlPlane(answer=_answer(_pool("node-a")))
    monkeypatch.setattr(status, "pool_status", lambda rest, query: pool_status(cast(KubeRest, plane), query))
    with ApiServer() as srv, srv.rest() as rest:
        rest.request("POST", "/apis/resource.k8s.io/v1/resourceslices", body={
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "node-a-gpu"},
            "spec": {"driver": DRIVER, "nodeName": "node-a", "pool": {"name": "node-a", "generation": 1,
                                                                       "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}]}})
        data = json.loads(status_text(rest, driver=DRIVER, nodes=["node-a"], output="json", pool_status_timeout=2.0))
        table = status_text(rest, driver=DRIVER, nodes=["node-a"], output="", pool_status_timeout=2.0)
    assert [n["name"] for n in data] == ["node-a"]
    assert data[0]["poolStatus"]["totalDevices"] == 16 and data[0]["poolStatus"]["poolName"] == "node-a"
    assert "POOL STATUS" in table and "node-a" in table.split("POOL STATUS")[1]


def test_the_partition_summary_is_shown_per_pool_and_in_json() -> None:
    """KEP-5677 partition types (DRAPartitionableDevicesType): each entry of a pool's partitionSummary is a row of its
    own table and part of the pool's json; entries that are not objects are dropped, counts that are not ints unknown."""
    summary = [{"attribute": "gpu.dra.dev/partitionType", "type": "gpu-0/vgpu-2", "total": 8, "allocatable": 5},
               {"attribute": "gpu.dra.dev/partitionType", "type": "gpu-0/whole", "total": 1, "allocatable": "0"},
               "junk"]
    report = parse_report({"status": _answer(_pool("node-a", partitionSummary=summary))}, DRIVER)
    parts = report.pools[0].partitions
    assert [(p.type, p.total, p.allocatable) for p in parts] == [("gpu-0/vgpu-2", 8, 5), ("gpu-0/whole", 1, None)]
    text = render_pool_table(report)
    rows = text.split("PARTITION TYPES")[1].splitlines()[2:]
    assert rows[0].split() == ["node-a", "node-a", "gpu-0/vgpu-2", "8", "5", "gpu.dra.dev/partitionType"]
    assert rows[1].split()[2:5] == ["gpu-0/whole", "1", "-"]
    assert pool_data(report.pools[0])["partitionSummary"][0] == summary[0]
    plain = parse_report({"status": _answer(_pool("node-a"))}, DRIVER)
    assert "PARTITION TYPES" not in render_pool_table(plain)
    assert pool_data(plain.pools[0])["partitionSummary"] is None
