"""The ResourceSlice publisher against the sandbox API server (real HTTP, real client).

Outcomes are read from the API server itself: its objects (`srv.snapshot`, no HTTP, so never faulted), its
request log, and its watch history (every version of every slice the publisher wrote, with its generation).
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.allocation.model import Node
from dra_driver.allocation.pools import gather_pools
from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_driver.slices.publisher import SLICES_PATH, RequestRetries, SlicePublisher
from dra_sandbox.apiserver import ApiServer, ChaosFaults
from dra_sandbox.apiserver.hooks import Fault
from tests.narrow import present
from tests.polling import wait_for

DRIVER = DRIVER_NAME
NODE = "node-a"
GROUP = "resource.k8s.io"


class Desired:
    """The pool's desired slices; tests swap the device set to simulate a new inventory."""

    def __init__(self, preset: str = "dgx-h100", policy: MigOffering = MigOffering.STATIC) -> None:
        backend = open_backend(f"fake:{preset}")
        backend.init()
        self.inventory = discover(backend)
        self.devices = catalog(self.inventory, policy)
        self.settings = SliceSettings(DRIVER, NODE)

    def __call__(self, generation: int) -> list[dict[str, Any]]:
        return build_slices(self.inventory.system, self.devices, self.settings, generation)

    def drop(self, prefix: str) -> None:
        self.devices = {k: v for k, v in self.devices.items() if not k.startswith(prefix)}


class Tripwire(ChaosFaults):
    """Lets `after` more requests of `verb` through, then fails the next one with `status`, or with
    `outage=True` starts an outage (every request fails until `end_outage()`)."""

    def __init__(self) -> None:
        super().__init__(seed=7)
        self._armed: tuple[str, int, int, bool] | None = None

    def arm(self, verb: str, after: int, *, status: int = 503, outage: bool = False) -> None:
        self._armed = (verb, after, status, outage)

    def take(self, verb: str, resource: str, subresource: str, namespace: str, name: str, group: str) -> Fault | None:
        if self._armed is not None and resource == "resourceslices" and verb == self._armed[0]:
            armed_verb, after, status, outage = self._armed
            if after > 0:
                self._armed = (armed_verb, after - 1, status, outage)
            else:
                self._armed = None
                if outage:
                    self.outage(status)
                else:
                    return Fault(status, "tripwire", self.max_hang_seconds)
        return super().take(verb, resource, subresource, namespace, name, group)


@pytest.fixture
def faults() -> Tripwire:
    return Tripwire()


@pytest.fixture
def server(faults: Tripwire) -> Iterator[ApiServer]:
    with ApiServer(faults=faults) as srv:
        rest = srv.rest()
        rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        yield srv


def _rest(srv: ApiServer) -> KubeRest:
    return srv.rest()


def _slices(srv: ApiServer) -> list[dict[str, Any]]:
    return srv.snapshot(GROUP, "resourceslices")


def _writes(srv: ApiServer) -> int:
    return sum(
        srv.request_log.count(verb=v, resource="resourceslices") for v in ("create", "update", "patch", "delete")
    )


def _publisher(srv: ApiServer, desired: Desired, **kwargs: Any) -> SlicePublisher:
    return SlicePublisher(
        _rest(srv), driver_name=DRIVER, node_name=NODE, desired=desired, rng=random.Random(1), **kwargs
    )


def _spec(obj: JsonObject) -> str:
    """A slice's spec without generation and server-set taint times: what the scheduler reads from it."""
    spec = copy.deepcopy(obj["spec"])
    spec["pool"].pop("generation", None)
    for device in spec.get("devices") or []:
        for taint in device.get("taints") or []:
            taint.pop("timeAdded", None)
    return json.dumps(spec, sort_keys=True)


def _holds_exactly(srv: ApiServer, desired: Desired) -> bool:
    """The API holds exactly the desired slices: one generation, nothing else, names irrelevant."""
    slices = [s for s in _slices(srv) if s["spec"].get("nodeName") == NODE]
    generations = {s["spec"]["pool"]["generation"] for s in slices}
    return len(generations) == 1 and sorted(_spec(s) for s in slices) == sorted(_spec(d) for d in desired(1))


def _generation(srv: ApiServer) -> int:
    return int(max(s["spec"]["pool"]["generation"] for s in _slices(srv) if s["spec"].get("nodeName") == NODE))


def _scheduler_view(srv: ApiServer) -> tuple[list[str], list[str]]:
    """(problems, device names) of node-a's pools as the allocator sees them: only the newest generation
    counts, an incomplete pool is skipped."""
    pools = gather_pools(_slices(srv), Node(NODE, {}), partitionable=True)
    return [str(p) for p in pools.problems], sorted(c.id.device for c in pools.candidates)


def _desired_devices(desired: Desired) -> list[str]:
    return sorted(d["name"] for s in desired(1) for d in s["spec"].get("devices") or [])


def _written_generations(srv: ApiServer, since: str) -> list[tuple[str, str, int]]:
    """(event type, slice name, generation) of every change to a slice after resourceVersion `since`,
    replayed from the API server's watch history."""
    stream = _rest(srv).watch(SLICES_PATH, query={"resourceVersion": since}, timeout_seconds=1)
    return [
        (e["type"], e["object"]["metadata"]["name"], e["object"]["spec"]["pool"]["generation"])
        for e in stream
        if e.get("type") in ("ADDED", "MODIFIED", "DELETED")
    ]


# --- the basics ------------------------------------------------------------------------------------------


def test_first_publish_then_zero_writes(server: ApiServer) -> None:
    desired = Desired(policy=MigOffering.DYNAMIC)
    pub = _publisher(server, desired)
    first = pub.reconcile()
    slices = _slices(server)
    assert first.created == len(slices) == 5 and first.generation == 1
    assert _holds_exactly(server, desired)
    node_uid = present(_rest(server).get(f"/api/v1/nodes/{NODE}"))["metadata"]["uid"]
    for s in slices:
        assert s["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid, "controller": True}
        ]
        # generateName: no fixed name another node could take first
        assert s["metadata"]["generateName"] == "node-a-gpu-dra-dev-"
        assert s["metadata"]["name"].startswith("node-a-gpu-dra-dev-")
    server.request_log.reset()
    for _ in range(5):
        assert pub.reconcile().writes == 0
    assert _writes(server) == 0
    # A restarted plugin (no memory) sees the same content: still zero writes.
    assert _publisher(server, desired).reconcile().writes == 0
    assert _writes(server) == 0


def test_changed_inventory_is_one_generation_written_beside_the_old_one(server: ApiServer) -> None:
    desired = Desired(policy=MigOffering.DYNAMIC)
    pub = _publisher(server, desired)
    pub.reconcile()
    old = {s["metadata"]["name"] for s in _slices(server)}
    since = server.resource_version
    desired.drop("gpu-7")
    result = pub.reconcile()
    assert result.generation == 2 and _holds_exactly(server, desired)
    assert "gpu-7" not in _scheduler_view(server)[1]
    # Request order: the whole new generation is created first, only then the old one deleted; the old
    # slices were never modified (a failure in between could have rolled back to them).
    history = _written_generations(server, str(since))
    assert [t for t, _, _ in history] == ["ADDED"] * result.created + ["DELETED"] * len(old)
    assert {g for t, _, g in history if t == "ADDED"} == {2}
    assert {n for t, n, _ in history if t == "DELETED"} == old


def test_deleted_and_edited_slices_are_repaired_at_the_same_generation(server: ApiServer) -> None:
    desired = Desired(policy=MigOffering.DYNAMIC)
    pub = _publisher(server, desired)
    pub.reconcile()
    rest = _rest(server)
    with_devices = sorted((s for s in _slices(server) if s["spec"].get("devices")), key=lambda s: s["metadata"]["name"])
    victim, edited = with_devices[0], copy.deepcopy(with_devices[1])
    rest.request("DELETE", f"{SLICES_PATH}/{victim['metadata']['name']}")
    edited["spec"]["devices"] = edited["spec"]["devices"][:3]
    rest.request("PUT", f"{SLICES_PATH}/{edited['metadata']['name']}", body=edited)
    server.request_log.reset()
    result = pub.reconcile()
    assert (result.created, result.updated, result.deleted, result.generation) == (1, 1, 0, 1)
    assert _holds_exactly(server, desired)
    # The edited slice was put right in place (one atomic write), not replaced.
    assert edited["metadata"]["name"] in {s["metadata"]["name"] for s in _slices(server)}


def test_leftover_slices_of_the_pool_are_deleted(server: ApiServer) -> None:
    rest = _rest(server)
    stray = Desired()(9)[0]
    stray["metadata"]["name"] = "node-a-stray"
    rest.request("POST", SLICES_PATH, body=stray)
    other_node = copy.deepcopy(stray)
    other_node["metadata"]["name"] = "node-b-slice"
    other_node["spec"]["nodeName"] = "node-b"
    other_node["spec"]["pool"]["name"] = "node-b"
    rest.request("POST", SLICES_PATH, body=other_node)
    result = _publisher(server, Desired()).reconcile()
    names = {s["metadata"]["name"] for s in _slices(server)}
    assert "node-a-stray" not in names and "node-b-slice" in names
    assert result.generation == 10 and result.deleted == 1


def test_slices_of_an_older_plugin_with_fixed_names_are_adopted_without_writes(server: ApiServer) -> None:
    """Upgrade path: the previous publisher named slices `<node>-<driver>-<i>`; they are found by their fields."""
    desired = Desired(policy=MigOffering.DYNAMIC)
    rest = _rest(server)
    node_uid = present(rest.get(f"/api/v1/nodes/{NODE}"))["metadata"]["uid"]
    owner = {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid, "controller": True}
    for obj in desired(3):  # the builder's fixed names, as the old publisher wrote them
        obj["metadata"]["ownerReferences"] = [owner]
        rest.request("POST", SLICES_PATH, body=obj)
    server.request_log.reset()
    result = _publisher(server, desired).reconcile()
    assert (result.writes, result.generation) == (0, 3)
    assert _writes(server) == 0


def test_a_squatted_slice_name_does_not_block_publishing(server: ApiServer) -> None:
    """Another node's plugin creates a slice under the name node-a's publisher used to use (allowed: names
    are not pinned). node-a publishes anyway, and leaves node-b's slice alone."""
    rest = _rest(server)
    squat = Desired()(1)[0]
    squat["metadata"]["name"] = "node-a-gpu-dra-dev-0"
    squat["spec"]["nodeName"] = squat["spec"]["pool"]["name"] = "node-b"
    rest.request("POST", SLICES_PATH, body=squat)
    desired = Desired(policy=MigOffering.DYNAMIC)
    assert _publisher(server, desired).reconcile().created == 5
    assert _holds_exactly(server, desired)
    assert present(rest.get(f"{SLICES_PATH}/node-a-gpu-dra-dev-0"))["spec"]["nodeName"] == "node-b"


# --- failures inside a pass -------------------------------------------------------------------------


def test_a_pass_with_injected_failures_still_completes(server: ApiServer, faults: Tripwire) -> None:
    """One reconcile() call, no exception: every failed request was retried on its own."""
    faults.inject(verb="list", resource="resourceslices", status=500, count=1)
    # (not 503/429 on a GET: urllib3 itself retries those after their Retry-After, invisibly to us)
    faults.inject(verb="get", resource="nodes", status=500, count=1)
    faults.inject(verb="create", resource="resourceslices", status=500, count=2)
    faults.inject(verb="create", resource="resourceslices", status=409, count=1)
    faults.inject(verb="create", resource="resourceslices", status=429, count=1)
    desired = Desired(policy=MigOffering.DYNAMIC)
    pub = _publisher(server, desired)
    result = pub.reconcile()
    assert (result.generation, result.created) == (1, 5)
    assert _holds_exactly(server, desired)
    assert faults.pending() == 0 and pub.retries == 6
    codes = [r.code for r in server.request_log.records() if (r.verb, r.resource) == ("create", "resourceslices")]
    assert codes == [500, 500, 409, 429, 201, 201, 201, 201, 201]
    # After a 500 the publisher looked before creating again (the create might have been stored).
    assert server.request_log.count(verb="list", resource="resourceslices") >= 3


def test_update_conflict_rereads_and_retries(server: ApiServer, faults: Tripwire) -> None:
    desired = Desired(policy=MigOffering.DYNAMIC)
    pub = _publisher(server, desired)
    pub.reconcile()
    edited = copy.deepcopy(next(s for s in _slices(server) if s["spec"].get("devices")))
    edited["spec"]["devices"] = edited["spec"]["devices"][:1]
    _rest(server).request("PUT", f"{SLICES_PATH}/{edited['metadata']['name']}", body=edited)
    server.request_log.reset()
    faults.inject(verb="update", resource="resourceslices", status=409, count=2)
    result = pub.reconcile()
    assert (result.updated, result.generation) == (1, 1)
    assert _holds_exactly(server, desired)
    assert server.request_log.count(verb="update", resource="resourceslices") == 3
    assert server.request_log.count(verb="get", resource="resourceslices") == 2  # one re-read per 409


def test_a_lost_create_answer_does_not_duplicate_a_slice(server: ApiServer) -> None:
    """The API server stores a create but the answer never arrives (connection reset): the retry finds the
    stored slice instead of creating a second one (which would leave more slices than resourceSliceCount)."""

    class LosesOneAnswer(KubeRest):
        lost = 0

        def request(self, method: str, path: str, **kwargs: Any) -> JsonObject:
            answer = super().request(method, path, **kwargs)
            if method == "POST" and path == SLICES_PATH and not self.lost:
                self.lost += 1
                raise ApiError(0, "POST: connection reset by peer")
            return answer

    desired = Desired(policy=MigOffering.DYNAMIC)
    rest = LosesOneAnswer(server.connection())
    pub = SlicePublisher(rest, driver_name=DRIVER, node_name=NODE, desired=desired, rng=random.Random(1))
    result = pub.reconcile()
    assert rest.lost == 1 and result.created == 5
    assert len(_slices(server)) == 5 and _holds_exactly(server, desired)
    assert server.request_log.count(verb="create", resource="resourceslices") == 5


def test_a_new_generation_that_cannot_be_completed_is_rolled_back(server: ApiServer, faults: Tripwire) -> None:
    """The third create of a new generation is refused (422, not retriable). The two slices already written
    at generation 2 are deleted again: the scheduler sees the complete generation 1, never an incomplete
    newest one. The next pass publishes at generation 2 again: a failed pass never bumps the generation."""
    desired = Desired(policy=MigOffering.DYNAMIC)
    pub = _publisher(server, desired)
    pub.reconcile()
    before = sorted(_spec(s) for s in _slices(server))
    devices_before = _desired_devices(desired)
    desired.drop("gpu-7")
    faults.arm("create", after=2, status=422)
    with pytest.raises(ApiError) as failure:
        pub.reconcile()
    assert failure.value.status == 422 and pub.rollbacks == 1
    assert sorted(_spec(s) for s in _slices(server)) == before and _generation(server) == 1
    assert _scheduler_view(server) == ([], devices_before)
    since = server.resource_version
    result = pub.reconcile()
    assert result.generation == 2 and _holds_exactly(server, desired)
    assert {g for t, _, g in _written_generations(server, str(since)) if t != "DELETED"} == {2}
    assert _scheduler_view(server) == ([], _desired_devices(desired))


def test_an_outage_mid_pass_is_completed_at_the_same_generation(server: ApiServer, faults: Tripwire) -> None:
    """The API goes away after two creates of a new generation: neither the pass nor its rollback can
    finish. When it comes back, the next pass completes generation 2 (no generation 3)."""
    desired = Desired(policy=MigOffering.DYNAMIC)
    pub = _publisher(server, desired, retry=RequestRetries(attempts=3, base_seconds=0.01))
    pub.reconcile()
    since = server.resource_version
    desired.drop("gpu-7")
    faults.arm("create", after=2, status=500, outage=True)  # (503 would add urllib3's own Retry-After waits)
    with pytest.raises(ApiError):
        pub.reconcile()
    assert pub.rollbacks == 0 and _generation(server) == 2  # the incomplete generation is still there
    assert _scheduler_view(server)[0], "2 of 5 slices at generation 2: the pool reads as incomplete"
    faults.end_outage()
    assert pub.reconcile().generation == 2 and _holds_exactly(server, desired)
    assert {g for t, _, g in _written_generations(server, str(since)) if t != "DELETED"} == {2}


def test_an_outage_is_probed_not_hammered_and_publishing_resumes_after_it(server: ApiServer) -> None:
    """The loop starts while every request fails. The first pass retries its request (5 retries); after that
    each pass sends a single probe, so the retries stay at 5 however long the outage lasts. When the API is
    back, the pool is published within the pass backoff."""
    chaos = server.faults
    assert isinstance(chaos, ChaosFaults)
    chaos.outage(500)
    desired = Desired(policy=MigOffering.DYNAMIC)
    pub = _publisher(server, desired, max_backoff=0.3)
    pub.start()
    try:
        wait_for(lambda: pub.failed_passes >= 6, 20, "six failed passes")
        assert pub.retries == 5 and not _slices(server)
        chaos.end_outage()
        wait_for(lambda: _holds_exactly(server, desired), 10, "the desired slices")
        assert _generation(server) == 1
    finally:
        pub.stop()


def test_random_faults_never_bump_the_generation_without_a_content_change(server: ApiServer) -> None:
    """20 % of the publisher's requests fail (500 or 409), chosen by a seeded generator. The running loop
    still converges to exactly the desired slices, first at generation 1 and after one inventory change at
    generation 2; the watch history shows no slice ever written at any other generation."""
    chaos = server.faults
    assert isinstance(chaos, ChaosFaults)
    since = server.resource_version
    for verb in ("list", "get", "create", "update", "delete"):
        chaos.fail_randomly(0.2, (500, 409), verb=verb)
    desired = Desired(policy=MigOffering.DYNAMIC)
    pub = _publisher(server, desired, resync_seconds=0.05)
    pub.start()
    try:
        wait_for(lambda: _holds_exactly(server, desired), 30, "the desired slices")
        count = pub.reconcile_count
        assert pub.wait_for_reconciles(count + 20, timeout=30)  # more passes over the same content
        desired.drop("gpu-7")
        pub.trigger()
        wait_for(
            lambda: _holds_exactly(server, desired) and _generation(server) == 2, 30, "the new slices at generation 2"
        )
        count = pub.reconcile_count
        assert pub.wait_for_reconciles(count + 20, timeout=30)
    finally:
        pub.stop()
        chaos.clear()
    assert chaos.random_failures >= 5 and pub.retries >= 5
    history = _written_generations(server, str(since))
    assert {g for t, _, g in history if t != "DELETED"} == {1, 2}
    assert _holds_exactly(server, desired) and _generation(server) == 2


# --- the loop --------------------------------------------------------------------------------------------


def test_watch_restores_a_deleted_slice_within_seconds(server: ApiServer) -> None:
    desired = Desired()
    pub = _publisher(server, desired)
    pub.start()
    try:
        rest = _rest(server)
        wait_for(lambda: len(_slices(server)) == 1, 10, "the slice")
        name = _slices(server)[0]["metadata"]["name"]
        rest.request("DELETE", f"{SLICES_PATH}/{name}")
        wait_for(
            lambda: _holds_exactly(server, desired) and _slices(server)[0]["metadata"]["name"] != name,
            5,
            "the deleted slice replaced",
        )
        assert _generation(server) == 1  # drift repair: same content, same generation
    finally:
        pub.stop()


def test_running_loop_makes_zero_writes_over_many_reconciles(server: ApiServer) -> None:
    """The loop as it runs in the plugin (here resyncing every 20 ms): after the first publish, 25 more
    reconciles make no write at all, as the API server's request log shows."""
    pub = SlicePublisher(
        _rest(server), driver_name=DRIVER, node_name=NODE, desired=Desired(policy=MigOffering.DYNAMIC), resync_seconds=0.02
    )
    pub.start()
    try:
        assert pub.wait_for_reconciles(1, timeout=20)
        server.request_log.reset()
        first = pub.reconcile_count
        # One more than counted: a reconcile in flight across the reset completes in the window with its LIST
        # logged before the reset.
        assert pub.wait_for_reconciles(first + 26, timeout=30)
        assert _writes(server) == 0
        assert server.request_log.count(verb="list", resource="resourceslices") >= 25
    finally:
        pub.stop()


def _requests(srv: ApiServer, verb: str, resource: str = "resourceslices") -> int:
    return srv.request_log.count(verb=verb, resource=resource)


def _published_and_watching(srv: ApiServer, pub: SlicePublisher, watches: int = 1) -> None:
    assert pub.wait_for_reconciles(1, timeout=20)
    wait_for(lambda: _requests(srv, "watch") >= watches, 10, f"{watches} slice watch(es)")  # logged once registered


def test_first_publish_lists_once_and_the_watch_starts_from_that_list(server: ApiServer) -> None:
    """The loop's LIST is also the watch's starting point: 1 LIST, 1 GET of the Node, one create per slice and
    1 WATCH; and the watch events of the creates (often faster than the creates' answers) wake no second pass."""
    desired = Desired(policy=MigOffering.DYNAMIC)
    server.request_log.reset()
    pub = _publisher(server, desired)
    pub.start()
    try:
        _published_and_watching(server, pub)
        slices = len(desired(1))
        assert slices == 5
        wait_for(lambda: _requests(server, "create") == slices, 10, "the creates")
        # The watch replays and streams the 5 creates; none of them may start another pass (another LIST).
        wait_for(lambda: len(_slices(server)) == slices, 10, "the slices")
        assert pub.reconcile_count == 1
        assert server.request_log.summary() == {
            ("list", "resourceslices"): 1,
            ("get", "nodes"): 1,
            ("create", "resourceslices"): slices,
            ("watch", "resourceslices"): 1,
        }
    finally:
        pub.stop()


def test_a_watch_that_times_out_resumes_without_a_list(server: ApiServer) -> None:
    """Watches of 1-2 s: each new one resumes from the version the last one ended at (its closing bookmark),
    so three watches cost no LIST beyond the first pass's, and no pass."""
    desired = Desired()
    pub = _publisher(server, desired, watch_timeout_seconds=1)
    pub.start()
    try:
        _published_and_watching(server, pub, watches=3)
        assert _requests(server, "list") == 1
        assert pub.reconcile_count == 1
        # The resumed watch still sees foreign changes.
        name = _slices(server)[0]["metadata"]["name"]
        _rest(server).request("DELETE", f"{SLICES_PATH}/{name}")
        wait_for(lambda: _holds_exactly(server, desired) and pub.reconcile_count == 2, 10, "the slice restored")
    finally:
        pub.stop()


def test_an_expired_resume_point_runs_a_pass_and_starts_the_watch_from_its_list(server: ApiServer) -> None:
    """The history the watch would resume from is gone (etcd compaction): the server answers with an ERROR event
    (410 Expired). Changes may have been missed, so the loop runs a pass, and the watch starts again from that
    pass's LIST."""
    desired = Desired()
    pub = _publisher(server, desired)
    pub.start()
    try:
        _published_and_watching(server, pub)
        slice_of_another_node = desired(1)[0]
        slice_of_another_node["metadata"] = {"name": "other-node-slice"}
        slice_of_another_node["spec"] = {**slice_of_another_node["spec"], "nodeName": "node-b"}
        slice_of_another_node["spec"]["pool"] = {**slice_of_another_node["spec"]["pool"], "name": "node-b"}
        _rest(server).request("POST", SLICES_PATH, body=slice_of_another_node)  # not in the watch: its version stays
        server.compact()
        stream = pub._stream
        assert stream is not None
        stream.close()  # the connection drops; the watch resumes from a version the server no longer has
        wait_for(lambda: pub.reconcile_count == 2, 10, "a pass after the expired watch")
        wait_for(lambda: _requests(server, "watch") == 3, 10, "the expired watch and a fresh one")
        assert _requests(server, "list") == 2 and _writes(server) == 1 + 1  # our slice and the foreign one
        name = next(s["metadata"]["name"] for s in _slices(server) if s["spec"]["nodeName"] == NODE)
        _rest(server).request("DELETE", f"{SLICES_PATH}/{name}")
        wait_for(lambda: _holds_exactly(server, desired), 10, "the slice restored by the fresh watch")
    finally:
        pub.stop()


def test_a_watch_answered_410_runs_a_pass_and_starts_again(server: ApiServer, faults: Tripwire) -> None:
    desired = Desired()
    pub = _publisher(server, desired)
    faults.inject(verb="watch", resource="resourceslices", status=410)
    pub.start()
    try:
        _published_and_watching(server, pub, watches=2)  # the refused one, then one from the second pass's LIST
        assert pub.reconcile_count == 2 and _requests(server, "list") == 2
    finally:
        pub.stop()


def _owner_uid(srv: ApiServer) -> set[str]:
    return {o["uid"] for s in _slices(srv) for o in s["metadata"].get("ownerReferences") or []}


def test_a_node_the_caller_has_read_is_the_owner_without_a_get(server: ApiServer) -> None:
    """The plugin reads its Node at start (sharing-mode label) and hands it over: the first publish reads it no
    second time."""
    node = present(_rest(server).get(f"/api/v1/nodes/{NODE}"))
    server.request_log.reset()
    pub = _publisher(server, Desired(), node=node)
    pub.reconcile()
    assert _requests(server, "get", "nodes") == 0
    assert _owner_uid(server) == {node["metadata"]["uid"]}


def test_the_owner_is_read_again_once_the_pool_is_gone(server: ApiServer) -> None:
    """The Node deleted and created again (its slices went with it, by garbage collection or by hand): the next
    pass reads the new Node's UID for the owner reference."""
    rest = _rest(server)
    pub = _publisher(server, Desired(), node=present(rest.get(f"/api/v1/nodes/{NODE}")))
    pub.reconcile()
    for s in _slices(server):  # before the Node: nothing left for the garbage collector to race with
        rest.request("DELETE", f"{SLICES_PATH}/{s['metadata']['name']}")
    rest.request("DELETE", f"/api/v1/nodes/{NODE}")
    created = rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    server.request_log.reset()
    pub.reconcile()
    assert _requests(server, "get", "nodes") == 1
    assert _owner_uid(server) == {created["metadata"]["uid"]}
