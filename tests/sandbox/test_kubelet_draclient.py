"""NodePrepareResources / NodeUnprepareResources through the DRA client against the TEST plugin."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator

import grpc
import pytest

from dra_driver._gen import dra_health_v1alpha1_pb2
from dra_sandbox.kubelet.clock import Backoff
from dra_sandbox.kubelet.draclient import (
    ClaimRef,
    DraClient,
    PreparedDevice,
    with_retry,
)
from dra_sandbox.kubelet.health import HealthStore, health_from_response
from tests.sandbox.test_kubelet_fakeplugin import FakePlugin, short_tmpdir


class FakeClock:
    """Waits return at once and only record how long they were asked to wait."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return stop.is_set()


A, B, C = ClaimRef("ns", "a", "uid-a"), ClaimRef("ns", "b", "uid-b"), ClaimRef("other", "c", "uid-c")


@pytest.fixture
def plugin() -> Iterator[FakePlugin]:
    base = short_tmpdir()
    p = FakePlugin(base / "reg", base / "plugins")
    p.start_dra()
    yield p
    p.stop()
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=["v1.DRAPlugin", "v1beta1.DRAPlugin"])
def client(request: pytest.FixtureRequest, plugin: FakePlugin) -> Iterator[DraClient]:
    channel = grpc.insecure_channel(f"unix:{plugin.dra_socket}")
    yield DraClient(channel, str(request.param), timeout_s=5.0)
    channel.close()


def test_prepare_success_per_claim_error_and_missing_entry(plugin: FakePlugin, client: DraClient) -> None:
    plugin.prepare_errors["uid-b"] = ["GPU busy"]
    plugin.omit_claims.add("uid-c")
    plugin.devices_per_claim["uid-a"] = [("gpu-0", ["r1"]), ("gpu-1", [])]
    results = client.prepare([A, B, C])
    assert results["uid-a"].ok
    assert results["uid-a"].devices == (
        PreparedDevice(("r1",), "node-1", "gpu-0", (plugin.cdi_id("uid-a", "gpu-0"),)),
        PreparedDevice((), "node-1", "gpu-1", (plugin.cdi_id("uid-a", "gpu-1"),)),
    )
    assert results["uid-b"].error == "GPU busy"
    assert results["uid-c"].error is not None and "no result for claim other/c" in results["uid-c"].error
    version = "v1" if client.service.startswith("v1.") else "v1beta1"
    assert plugin.calls.prepare == [(version, ["uid-a", "uid-b", "uid-c"])]


def test_grpc_error_fails_every_claim(plugin: FakePlugin, client: DraClient) -> None:
    plugin.fail_whole_call = True
    results = client.prepare([A, B])
    assert {uid: r.error for uid, r in results.items()} == {
        "uid-a": "NodePrepareResources failed: INTERNAL: plugin exploded",
        "uid-b": "NodePrepareResources failed: INTERNAL: plugin exploded",
    }
    assert client.unprepare([A]) == {"uid-a": "NodeUnprepareResources failed: INTERNAL: plugin exploded"}


def test_unprepare_errors_and_missing(plugin: FakePlugin, client: DraClient) -> None:
    plugin.prepare_errors["uid-a"] = ["still in use"]
    plugin.omit_claims.add("uid-b")
    out = client.unprepare([A, B, C])
    assert out["uid-a"] == "still in use"
    assert out["uid-b"] is not None and "no result" in out["uid-b"]
    assert out["uid-c"] is None


def test_unreachable_plugin_is_an_error_for_each_claim() -> None:
    channel = grpc.insecure_channel("unix:/tmp/definitely-not-there-dra.sock")
    try:
        results = DraClient(channel, "v1.DRAPlugin", timeout_s=0.5).prepare([A])
    finally:
        channel.close()
    assert results["uid-a"].error is not None and results["uid-a"].error.startswith("NodePrepareResources failed")


def test_prepare_retries_only_failed_claims_with_backoff(plugin: FakePlugin, client: DraClient) -> None:
    plugin.prepare_errors["uid-b"] = ["busy", "still busy"]
    plugin.omit_claims.add("uid-c")
    clock = FakeClock()
    original_wait = clock.wait

    def wait(stop: threading.Event, seconds: float) -> bool:
        plugin.omit_claims.discard("uid-c")  # the plugin answers for c from the second call on
        return original_wait(stop, seconds)

    clock.wait = wait  # type: ignore[method-assign]
    results = with_retry(client.prepare, [A, B, C], clock=clock, backoff=Backoff(1.0, 2.0, 3.0),
                         stop=threading.Event())
    assert all(r.ok for r in results.values())
    assert [uids for _, uids in plugin.calls.prepare] == [["uid-a", "uid-b", "uid-c"], ["uid-b", "uid-c"], ["uid-b"]]
    assert clock.waits == [1.0, 2.0]


def test_retry_gives_up_after_max_attempts_and_keeps_last_error(plugin: FakePlugin, client: DraClient) -> None:
    plugin.prepare_errors["uid-a"] = ["e1", "e2", "e3", "e4"]
    clock = FakeClock()
    results = with_retry(client.prepare, [A], clock=clock, backoff=Backoff(1.0, 2.0, 3.0), stop=threading.Event(),
                         max_attempts=3)
    assert results["uid-a"].error == "e3"
    assert clock.waits == [1.0, 2.0]  # capped growth would be 1, 2, 3, 3, ...


def test_unprepare_retry_and_stop(plugin: FakePlugin, client: DraClient) -> None:
    plugin.prepare_errors["uid-a"] = ["busy"]
    clock = FakeClock()
    assert with_retry(client.unprepare, [A], clock=clock, backoff=Backoff(0.5), stop=threading.Event()) == {
        "uid-a": None
    }
    assert clock.waits == [0.5]
    # A set stop event ends the retry loop after the first failure.
    plugin.prepare_errors["uid-a"] = ["busy", "busy"]
    stopped = threading.Event()
    stopped.set()
    assert with_retry(client.unprepare, [A], clock=clock, backoff=Backoff(0.5), stop=stopped)["uid-a"] == "busy"


def test_health_store_marks_stale_devices_unknown() -> None:
    clock = FakeClock()
    store = HealthStore(clock)
    response = dra_health_v1alpha1_pb2.NodeWatchResourcesResponse(
        devices=[
            dra_health_v1alpha1_pb2.DeviceHealth(
                device=dra_health_v1alpha1_pb2.DeviceIdentifier(pool_name="p", device_name="d0"),
                health=dra_health_v1alpha1_pb2.HEALTHY,
                last_updated_time=5,
            ),
            dra_health_v1alpha1_pb2.DeviceHealth(
                device=dra_health_v1alpha1_pb2.DeviceIdentifier(pool_name="p", device_name="d1"),
                health=dra_health_v1alpha1_pb2.UNHEALTHY,
                health_check_timeout_seconds=100,
            ),
        ]
    )
    store.update(health_from_response("drv", response, clock.monotonic()))
    assert store.status("drv", "p", "d0") == "Healthy" and store.status("drv", "p", "d1") == "Unhealthy"
    clock.now += 31  # past the default 30 s, within d1's own 100 s
    assert store.status("drv", "p", "d0") == "Unknown"
    assert store.status("drv", "p", "d1") == "Unhealthy"
    assert store.status("drv", "p", "nope") == "Unknown"
