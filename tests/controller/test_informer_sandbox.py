"""The controller's view fed by `informer.py` (one paged LIST per resource, then a watch) against the sandbox API
server: the counts after the initial LIST equal the counts of a view that saw the same history event by event;
changes after the LIST reach the view; an expired resume point (410) lists again and drops what is gone; the
view waits for its first LISTs."""

from __future__ import annotations

import gc
import random
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.controller import informer, operator
from dra_driver.controller.clusterview import ClusterView
from dra_driver.controller.informer import FEED_SLICES, Feeds
from dra_driver.controller.operator import ControllerSettings, feeds
from dra_driver.k8s.client import ApiError, KubeRest
from dra_driver.policy.counts import Counts
from dra_sandbox.apiserver import ApiServer, ChaosFaults
from tests.controller.test_status_and_hygiene import H100, gpu, node, resource_slice
from tests.polling import wait_for

DRIVER = "gpu.dra.dev"
A100 = "NVIDIA A100-SXM4-80GB"
NODES = "/api/v1/nodes"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
TIMEOUT = 20.0
# The selectors of a few policies (a class of all H100 GPUs, all A100 MIG devices, every device).
POLICIES: tuple[tuple[tuple[str, ...], str], ...] = (
    ((f"device.attributes['{DRIVER}'].productName == '{H100}'",), "h100"),
    ((f"device.attributes['{DRIVER}'].type == 'mig'",), "mig"),
    (("true",), "gpu.dra.dev"),
)


@pytest.fixture
def server() -> Iterator[tuple[ApiServer, ChaosFaults, KubeRest]]:
    faults = ChaosFaults(seed=1)
    with ApiServer(faults=faults) as srv, srv.rest() as rest:
        yield srv, faults, rest


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(informer, "PAGE", 3)  # several pages even for a small fleet
    monkeypatch.setattr(operator, "SLICE_PAGE", 2)


def _slice(node_name: str, pool: str, generation: int, devices: list[dict[str, Any]], index: int,
           driver: str = DRIVER) -> dict[str, Any]:
    obj = resource_slice(node_name, devices, driver=driver)
    obj["metadata"]["name"] = f"{pool}-{generation}-{index}"
    obj["spec"]["pool"] = {"name": pool, "generation": generation, "resourceSliceCount": 2}
    return obj


def _claim(name: str, classes: list[str]) -> dict[str, Any]:
    requests = [{"name": f"r{i}", "exactly": {"deviceClassName": c}} for i, c in enumerate(classes)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": requests}}}


def _allocate(rest: KubeRest, name: str, count: int) -> None:
    claim = rest.request("GET", f"{CLAIMS}/{name}")
    claim["status"] = {"allocation": {"devices": {"results": [
        {"request": f"r{i}", "driver": DRIVER, "pool": "p", "device": f"gpu-{i}"} for i in range(count)]}}}
    rest.request("PUT", f"{CLAIMS}/{name}/status", body=claim)


def write_fleet(rest: KubeRest, seed: int) -> None:
    """A varied history: nodes, slices of two pool generations (the old one partly deleted, as a plugin replacing
    its pool), another driver's slices, MIG and GPU devices, slices changed and deleted, allocated claims."""
    rng = random.Random(seed)
    slices: list[str] = []
    for n in range(rng.randint(3, 7)):
        name = f"n{n}"
        rest.request("POST", NODES, body=node(name))
        generations = rng.choice((1, 2))
        for generation in range(1, generations + 1):
            for index in range(2):
                devices = [gpu(i, rng.choice((H100, A100)), rng.choice(("gpu", "mig"))) for i in
                           range(rng.randint(0, 5))]
                obj = rest.request("POST", FEED_SLICES, body=_slice(name, name, generation, devices, index))
                slices.append(obj["metadata"]["name"])
        rest.request("POST", FEED_SLICES, body=_slice(name, f"other-{name}", 1, [gpu(0, H100)], 0, "other.dev"))
    for name in rng.sample(slices, k=len(slices) // 4):
        obj = rest.request("GET", f"{FEED_SLICES}/{name}")
        obj["spec"]["devices"] = [gpu(9, H100)]
        rest.request("PUT", f"{FEED_SLICES}/{name}", body=obj)
    for name in rng.sample(slices, k=len(slices) // 5):
        rest.request("DELETE", f"{FEED_SLICES}/{name}")
    for c in range(rng.randint(1, 4)):
        rest.request("POST", CLAIMS, body=_claim(f"c{c}", rng.sample(["h100", "mig", "gpu.dra.dev"], k=2)))
        _allocate(rest, f"c{c}", rng.randint(0, 2))
    if rng.random() < 0.5:
        rest.request("DELETE", f"{CLAIMS}/c0")
    rest.request("DELETE", f"{NODES}/n0")


def counts(view: ClusterView) -> list[Counts]:
    return [view.counts(selectors, name) for selectors, name in POLICIES]


def view_feeds(rest: KubeRest, *, watch_timeout: int = 30) -> tuple[ClusterView, Feeds]:
    view = ClusterView(DRIVER, DraCelEnvironment())
    options = ControllerSettings(driver_name=DRIVER, watch_timeout_seconds=watch_timeout)
    return view, feeds(options, rest, view)


def listed_view(rest: KubeRest) -> ClusterView:
    """A view from one LIST of each feed (no watch)."""
    view, fed = view_feeds(rest)
    for reflector in fed.reflectors:
        reflector.relist()
        view.mark_synced(reflector.feed.name)
    return view


@pytest.mark.usefixtures("small_pages")
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_counts_after_the_initial_list_equal_counts_after_every_event(
    server: tuple[ApiServer, ChaosFaults, KubeRest], seed: int
) -> None:
    _, _, rest = server
    by_events, early = view_feeds(rest)
    assert gc.isenabled()
    early.start()  # before anything exists: the whole history arrives as watch events
    try:
        wait_for(lambda: by_events.synced, TIMEOUT, "the empty LISTs")
        assert gc.isenabled()  # paused for the first LISTs only
        write_fleet(rest, seed)
        listed = listed_view(rest)
        assert sum(c.devices for c in counts(listed)) > 0
        wait_for(lambda: counts(by_events) == counts(listed), TIMEOUT, "the events view agrees with the LIST view")
        assert by_events.nodes() == listed.nodes() == frozenset(
            n["metadata"]["name"] for n in rest.request("GET", NODES)["items"])
        assert by_events.slices_by_node() == listed.slices_by_node()
        assert all(r.lists == 1 for r in early.reflectors)
    finally:
        early.stop()


def test_nothing_is_counted_before_every_first_list(server: tuple[ApiServer, ChaosFaults, KubeRest]) -> None:
    _, _, rest = server
    view, _ = view_feeds(rest)
    assert not view.synced
    view.mark_synced("slices")
    view.mark_synced("nodes")
    assert not view.synced
    view.mark_synced("claims")
    assert view.synced


@pytest.mark.usefixtures("small_pages")
def test_a_slice_changed_or_deleted_after_the_list_is_counted(
    server: tuple[ApiServer, ChaosFaults, KubeRest]
) -> None:
    _, _, rest = server
    write_fleet(rest, 4)
    view, fed = view_feeds(rest)
    fed.start()
    try:
        wait_for(lambda: view.synced, TIMEOUT, "the first LISTs")
        assert counts(view) == counts(listed_view(rest))
        ours = [s for s in rest.request("GET", FEED_SLICES)["items"] if s["spec"]["driver"] == DRIVER]
        changed, deleted = ours[0], ours[1]
        changed["spec"]["devices"] = [gpu(i, H100) for i in range(7)]
        rest.request("PUT", f"{FEED_SLICES}/{changed['metadata']['name']}", body=changed)
        rest.request("DELETE", f"{FEED_SLICES}/{deleted['metadata']['name']}")
        rest.request("POST", CLAIMS, body=_claim("late", ["h100"]))
        _allocate(rest, "late", 1)
        wanted = counts(listed_view(rest))
        wait_for(lambda: counts(view) == wanted, TIMEOUT, "the change and the deletion in the view")
        assert deleted["metadata"]["uid"] not in {uid for s in view.slices_by_node().values() for _, uid in s}
        assert all(r.lists == 1 for r in fed.reflectors)  # by the watch, not another LIST
    finally:
        fed.stop()


def test_an_expired_resume_point_lists_again_and_drops_what_is_gone(
    server: tuple[ApiServer, ChaosFaults, KubeRest]
) -> None:
    """The watch is down (every watch request fails) while a slice is deleted and another added, and the history
    is compacted: the next watch from the old version is answered 410, the reflector lists again, and the view
    loses the deleted slice (no DELETED event ever came for it) and gains the new one."""
    srv, faults, rest = server
    write_fleet(rest, 5)
    view, fed = view_feeds(rest, watch_timeout=1)
    slices = next(r for r in fed.reflectors if r.feed.name == "slices")
    fed.start()
    try:
        wait_for(lambda: view.synced, TIMEOUT, "the first LISTs")
        faults.fail_randomly(1.0, (500,), verb="watch", resource="resourceslices")
        wait_for(lambda: faults.random_failures > 0, TIMEOUT, "the slice watch down")
        ours = [s for s in rest.request("GET", FEED_SLICES)["items"] if s["spec"]["driver"] == DRIVER]
        gone = ours[0]
        rest.request("DELETE", f"{FEED_SLICES}/{gone['metadata']['name']}")
        rest.request("POST", FEED_SLICES, body=_slice("n9", "n9", 1, [gpu(0, H100), gpu(1, H100)], 0))
        srv.compact()
        faults.clear()
        wanted = counts(listed_view(rest))
        wait_for(lambda: slices.lists >= 2, TIMEOUT, "a LIST after the 410")
        wait_for(lambda: counts(view) == wanted, TIMEOUT, "the relisted view")
        assert gone["metadata"]["uid"] not in {uid for s in view.slices_by_node().values() for _, uid in s}
        assert "n9" in view.slices_by_node()
    finally:
        fed.stop()


def test_a_watch_from_a_compacted_version_raises_gone(server: tuple[ApiServer, ChaosFaults, KubeRest]) -> None:
    srv, _, rest = server
    write_fleet(rest, 6)
    _, fed = view_feeds(rest)
    reflector = next(r for r in fed.reflectors if r.feed.name == "slices")
    version = reflector.relist()
    rest.request("POST", FEED_SLICES, body=_slice("n9", "n9", 1, [gpu(0, H100)], 0))
    srv.compact()
    with pytest.raises(ApiError) as raised:
        reflector.watch(version)
    assert raised.value.status == 410
