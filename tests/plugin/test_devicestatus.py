"""The claim's status.devices (plugin/devicestatus.py): a plugin in this process against the sandbox API server.

What is asserted is what a user reads from the API (`kubectl get resourceclaim -o yaml`): the entries, their Ready
condition and data; that other drivers' entries survive; that a failing write fails no prepare and is retried;
and the outcome counter on the plugin's metrics registry.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering
from dra_driver.k8s.client import JsonObject, KubeRest
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.nvml.factory import open_backend
from dra_driver.plugin.app import KubeletPlugin
from dra_driver.plugin.checkpoint import Checkpoint, ClaimRecord, ClaimState, MigRecord, MpsRecord, PreparedDevice
from dra_driver.plugin.devicestatus import DeviceStatusWriter, WriterSettings
from dra_driver.plugin.devicestatusentries import (
    REMOVE,
    DeviceEntry,
    Wish,
    desired_devices,
    device_data,
    prepared_wish,
    same_entries,
)
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.objects import create_allocated_claim
from tests.narrow import present
from tests.plugin.conftest import plugin_settings
from tests.polling import wait_for

NODE = "n1"
OTHER = "net.example.com"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
NOW = "2026-07-01T00:00:00Z"


@pytest.fixture
def server() -> Iterator[ApiServer]:
    with ApiServer(kube_version="1.36.0") as srv:
        srv.rest().request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node",
                                                           "metadata": {"name": NODE}})
        yield srv


@pytest.fixture
def plugin(server: ApiServer, work: Path) -> Iterator[KubeletPlugin]:
    backend = open_backend("fake:dgx-h100")
    backend.init()
    settings = replace(plugin_settings(work, NODE, MigOffering.DYNAMIC), usage_interval=0)
    p = KubeletPlugin(settings, nvml=backend, rest=KubeRest(server.connection()))
    p.start()
    try:
        yield p
    finally:
        p.stop()


def _claim(admin: KubeRest, name: str) -> JsonObject:
    return present(admin.get(f"{CLAIMS}/{name}"))


def _entries(admin: KubeRest, name: str, driver: str = DRIVER_NAME) -> list[JsonObject]:
    return [e for e in (_claim(admin, name).get("status") or {}).get("devices") or [] if e["driver"] == driver]


def _ready(entry: JsonObject) -> JsonObject:
    return next(c for c in entry["conditions"] if c["type"] == "Ready")


def _writer(plugin: KubeletPlugin) -> DeviceStatusWriter:
    assert plugin.device_status is not None
    return plugin.device_status


def _settled(plugin: KubeletPlugin) -> bool:
    return _writer(plugin).idle()


def _metric(plugin: KubeletPlugin, outcome: str) -> float:
    value = plugin.metrics.registry.get_sample_value("dra_driver_claim_device_status_writes_total",
                                                     {"outcome": outcome})
    return value or 0.0


def test_a_prepared_mig_device_is_reported_and_removed_on_unprepare(plugin: KubeletPlugin, server: ApiServer) -> None:
    admin = server.rest()
    mig = "gpu-0-mig-1g10gb-19-0"
    claim = create_allocated_claim(admin, namespace="default", name="c1", driver=DRIVER_NAME, pool=NODE,
                                   devices=[mig, "nic-0"], result_fields=[{}, {"driver": OTHER}])
    theirs = {"driver": OTHER, "pool": NODE, "device": "nic-0", "data": {"mac": "aa"},
              "conditions": [{"type": "Ready", "status": "True", "reason": "Up", "lastTransitionTime": NOW}]}
    admin.request("PATCH", f"{CLAIMS}/c1/status", body={"status": {"devices": [theirs]}},
                  content_type="application/merge-patch+json")
    ref = ClaimRef("default", "c1", claim["metadata"]["uid"])

    assert plugin.claim_engine.prepare([ref])[ref.uid].error == ""
    (entry,) = wait_for(lambda: _entries(admin, "c1"), 20, "our status.devices entry")
    record = plugin.engine.prepared_claims().claims[ref.uid].devices[0]
    assert record.mig is not None and record.mig.uuid
    assert entry["pool"] == NODE and entry["device"] == mig
    assert entry["data"]["uuid"] == record.mig.uuid and entry["data"]["uuid"].startswith("MIG-")
    assert entry["data"]["parentUUID"] == record.mig.parent_uuid
    assert entry["data"]["migProfile"] == "1g.10gb"
    assert entry["data"]["migPlacement"] == {"start": 0, "size": 1}
    assert entry["data"]["pciBusID"].startswith("0000:")
    assert entry["data"]["sharing"] == {"strategy": "Exclusive"}
    ready = _ready(entry)
    assert (ready["status"], ready["reason"]) == ("True", "Prepared") and ready["lastTransitionTime"]
    assert _entries(admin, "c1", OTHER) == [theirs]  # another driver's entry: untouched

    assert plugin.claim_engine.unprepare([ref]) == {ref.uid: ""}
    wait_for(lambda: not _entries(admin, "c1"), 20, "our entry removed after unprepare")
    assert _entries(admin, "c1", OTHER) == [theirs]
    wait_for(lambda: _settled(plugin), 10, "the writer idle")
    assert _metric(plugin, "success") == 2


def test_a_failed_api_write_fails_no_prepare_and_is_retried(plugin: KubeletPlugin, server: ApiServer) -> None:
    admin = server.rest()
    claim = create_allocated_claim(admin, namespace="default", name="c2", driver=DRIVER_NAME, pool=NODE,
                                   devices=["gpu-1"])
    ref = ClaimRef("default", "c2", claim["metadata"]["uid"])
    server.faults.inject(verb="patch", resource="resourceclaims/status", status=500, count=2)
    server.faults.inject(verb="patch", resource="resourceclaims/status", status=409, count=1)
    result = plugin.claim_engine.prepare([ref])[ref.uid]
    assert result.error == "" and result.devices  # answered before any write
    (entry,) = wait_for(lambda: _entries(admin, "c2"), 30, "the entry written after the faults")
    assert entry["data"]["uuid"].startswith("GPU-") and "migProfile" not in entry["data"]
    assert server.faults.pending() == 0
    wait_for(lambda: _settled(plugin), 10, "the writer idle")  # the outcome is counted after the write returns
    assert _metric(plugin, "error") == 2 and _metric(plugin, "conflict") == 1 and _metric(plugin, "success") == 1
    patches = server.request_log.count("patch", "resourceclaims/status", name="c2")
    assert patches == 4, server.request_log.summary()


def test_a_failed_prepare_reports_ready_false_with_the_error(plugin: KubeletPlugin, server: ApiServer) -> None:
    admin = server.rest()
    claim = create_allocated_claim(admin, namespace="default", name="c3", driver=DRIVER_NAME, pool=NODE,
                                   devices=["gpu-99"])
    ref = ClaimRef("default", "c3", claim["metadata"]["uid"])
    error = plugin.claim_engine.prepare([ref])[ref.uid].error
    assert error
    (entry,) = wait_for(lambda: _entries(admin, "c3"), 20, "the failure entry")
    ready = _ready(entry)
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", "PrepareFailed", error)
    assert "data" not in entry


def test_a_deleted_claim_is_not_written_and_not_retried(plugin: KubeletPlugin, server: ApiServer) -> None:
    admin = server.rest()
    claim = create_allocated_claim(admin, namespace="default", name="c4", driver=DRIVER_NAME, pool=NODE,
                                   devices=["gpu-2"])
    ref = ClaimRef("default", "c4", claim["metadata"]["uid"])
    assert plugin.claim_engine.prepare([ref])[ref.uid].error == ""
    wait_for(lambda: _entries(admin, "c4"), 20, "the entry")
    admin.request("DELETE", f"{CLAIMS}/c4")
    assert plugin.claim_engine.unprepare([ref]) == {ref.uid: ""}
    wait_for(lambda: _settled(plugin) and _metric(plugin, "gone") == 1, 20, "the removal seen as gone")


# --- the pure part: entries and the merged list ------------------------------------------------------------


def _allocated(*results: tuple[str, str, str], devices: list[Any] | None = None) -> JsonObject:
    return {"metadata": {"generation": 3},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": d, "pool": p, "device": n} for d, p, n in results]}},
                "devices": devices or []}}  # fmt: skip


def test_the_merged_list_keeps_other_entries_and_only_allocated_devices_of_ours() -> None:
    foreign = {"driver": OTHER, "pool": NODE, "device": "nic-0"}
    other_pool = {"driver": DRIVER_NAME, "pool": "n2", "device": "gpu-0"}
    claim = _allocated((DRIVER_NAME, NODE, "gpu-0"), (OTHER, NODE, "nic-0"), devices=[foreign, other_pool])
    wish = Wish(entries=(DeviceEntry(NODE, "gpu-0", None, True, "Prepared", "ok", {"uuid": "GPU-1"}),
                         DeviceEntry(NODE, "gpu-7", None, True, "Prepared", "ok", {"uuid": "GPU-7"})))
    out = desired_devices(claim, wish, driver=DRIVER_NAME, pool=NODE, now=NOW)
    assert out[:2] == [foreign, other_pool]
    assert [e["device"] for e in out[2:]] == ["gpu-0"]  # gpu-7 is not allocated: the server would refuse it
    assert out[2]["conditions"][0]["observedGeneration"] == 3
    # Same status again: the transition time stays; removal leaves the rest as it was.
    claim["status"]["devices"] = out
    again = desired_devices(claim, wish, driver=DRIVER_NAME, pool=NODE, now="2030-01-01T00:00:00Z")
    assert again == out
    assert desired_devices(claim, REMOVE, driver=DRIVER_NAME, pool=NODE, now=NOW) == [foreign, other_pool]
    failed = desired_devices(claim, Wish(failure="boom"), driver=DRIVER_NAME, pool=NODE, now="2030-01-01T00:00:00Z")
    cond = failed[2]["conditions"][0]
    assert (cond["status"], cond["message"], cond["lastTransitionTime"]) == ("False", "boom", "2030-01-01T00:00:00Z")
    assert failed[2]["data"] == {"uuid": "GPU-1"}  # kept from the earlier prepare


def test_data_holds_only_what_applies() -> None:
    mps = PreparedDevice(("r",), NODE, "gpu-0-shared", share_id="6f1d2c3e-0000-4000-8000-000000000001",
                         gpu_uuid="GPU-a", sharing="MPS",
                         mps=MpsRecord("d1", active_thread_percentage=50, pinned_memory_limit=1 << 30, share=True))
    data = device_data(mps, None)
    assert data == {"uuid": "GPU-a", "sharing": {"strategy": "MPS", "mps": {
        "pipeDirectory": "/tmp/nvidia-mps", "activeThreadPercentage": 50, "pinnedMemoryLimitBytes": 1 << 30}}}
    sliced = PreparedDevice(("r",), NODE, "gpu-0", gpu_uuid="GPU-a", sharing="TimeSlicing", time_slice="Long")
    assert device_data(sliced, None)["sharing"] == {"strategy": "TimeSlicing", "timeSlice": "Long"}
    mig = PreparedDevice(("r",), NODE, "gpu-0-mig-x", gpu_uuid="GPU-a", mig=MigRecord("GPU-a", 19, 2, 1, uuid="MIG-b"))
    assert device_data(mig, None) == {"uuid": "MIG-b", "parentUUID": "GPU-a", "migPlacement": {"start": 2, "size": 1},
                                      "sharing": {"strategy": "Exclusive"}}
    started = Checkpoint(claims={"u": ClaimRecord("u", "default", "c", ClaimState.PREPARE_STARTED, (mig,))})
    assert prepared_wish(started.claims["u"], {}, node=NODE) is None  # not prepared yet: nothing to report


def test_a_full_queue_drops_new_claims_but_coalesces_known_ones(server: ApiServer) -> None:
    writer = DeviceStatusWriter(server.rest(), WriterSettings(driver_name=DRIVER_NAME, pool_name=NODE, max_pending=1))
    # Not started: everything stays queued.
    writer.submit(ClaimRef("default", "a", "u1"), REMOVE)
    writer.submit(ClaimRef("default", "a", "u1"), Wish(failure="x"))  # the same claim: replaces, no drop
    writer.submit(ClaimRef("default", "b", "u2"), REMOVE)
    assert writer.outcomes == {"dropped": 1}
    assert not writer.idle()


def test_an_api_server_that_drops_the_field_stops_the_writer(server: ApiServer, monkeypatch: pytest.MonkeyPatch,
                                                            plugin: KubeletPlugin) -> None:
    """DRAResourceClaimDeviceStatus off (1.34-1.36 allow it): the server answers 200 without our entries."""
    admin = server.rest()
    claim = create_allocated_claim(admin, namespace="default", name="c5", driver=DRIVER_NAME, pool=NODE,
                                   devices=["gpu-3"])
    writer = _writer(plugin)
    real = writer.rest.request

    def dropping(method: str, path: str, **kwargs: Any) -> JsonObject:
        answer = real(method, path, **kwargs)
        if method == "PATCH":
            answer.get("status", {}).pop("devices", None)
        return answer

    monkeypatch.setattr(writer.rest, "request", dropping)
    ref = ClaimRef("default", "c5", claim["metadata"]["uid"])
    assert plugin.claim_engine.prepare([ref])[ref.uid].error == ""
    # The outcome is counted just after the write returns: wait for both, not only the flag.
    wait_for(lambda: writer.unsupported and _metric(plugin, "unsupported") == 1, 20, "the writer to notice")
    assert "DRAResourceClaimDeviceStatus" in writer.unsupported


class _CountingGets:
    """The writer's own GETs (its thread's; the engine's claim GET goes through the same client)."""

    def __init__(self, rest: KubeRest) -> None:
        self.paths: list[str] = []
        self.get = rest.get

    def __call__(self, path: str, **kwargs: Any) -> JsonObject | None:
        if threading.current_thread().name == "claim-device-status":
            self.paths.append(path)
        return self.get(path, **kwargs)


def test_a_prepare_writes_from_the_claim_the_engine_read_and_a_stale_one_is_read_again(
    plugin: KubeletPlugin, server: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = server.rest()
    writer = _writer(plugin)
    gets = _CountingGets(writer.rest)
    monkeypatch.setattr(writer.rest, "get", gets)
    claim = create_allocated_claim(admin, namespace="default", name="c1", driver=DRIVER_NAME, pool=NODE,
                                   devices=["gpu-1"])
    ref = ClaimRef("default", "c1", claim["metadata"]["uid"])
    assert plugin.claim_engine.prepare([ref])[ref.uid].error == ""
    wait_for(lambda: _entries(admin, "c1") and _settled(plugin), 20, "our status.devices entry")
    assert gets.paths == []  # the engine's read was the write's base
    assert (_metric(plugin, "success"), _metric(plugin, "conflict")) == (1, 0)

    # A claim changed after the engine read it: the precondition refuses the write, the retry reads it afresh.
    stale = _claim(admin, "c1")
    admin.request("PATCH", f"{CLAIMS}/c1", body={"metadata": {"labels": {"touched": "yes"}}},
                  content_type="application/merge-patch+json")
    writer.note_claim(ref.uid, stale)
    writer.submit(ref, Wish(failure="boom"))
    wait_for(lambda: _settled(plugin) and _metric(plugin, "success") == 2, 20, "the second write")
    assert _metric(plugin, "conflict") == 1 and len(gets.paths) == 1
    assert _ready(_entries(admin, "c1")[0])["status"] == "False"

    # The removal starts from the claim as our last write's answer left it: no read.
    assert plugin.claim_engine.unprepare([ref]) == {ref.uid: ""}
    wait_for(lambda: not _entries(admin, "c1") and _settled(plugin), 20, "our entry removed")
    assert len(gets.paths) == 1 and (_metric(plugin, "success"), _metric(plugin, "conflict")) == (3, 1)


def test_a_removal_of_a_claim_changed_since_our_write_reads_it_again(
    plugin: KubeletPlugin, server: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = server.rest()
    writer = _writer(plugin)
    gets = _CountingGets(writer.rest)
    monkeypatch.setattr(writer.rest, "get", gets)
    claim = create_allocated_claim(admin, namespace="default", name="c2", driver=DRIVER_NAME, pool=NODE,
                                   devices=["gpu-1"])
    ref = ClaimRef("default", "c2", claim["metadata"]["uid"])
    assert plugin.claim_engine.prepare([ref])[ref.uid].error == ""
    wait_for(lambda: _entries(admin, "c2") and _settled(plugin), 20, "our status.devices entry")
    admin.request("PATCH", f"{CLAIMS}/c2", body={"metadata": {"labels": {"touched": "yes"}}},
                  content_type="application/merge-patch+json")  # changed after our write
    assert plugin.claim_engine.unprepare([ref]) == {ref.uid: ""}
    wait_for(lambda: not _entries(admin, "c2") and _settled(plugin), 20, "our entry removed")
    assert _claim(admin, "c2")["metadata"]["labels"] == {"touched": "yes"}
    assert len(gets.paths) == 1 and _metric(plugin, "conflict") == 1  # the stale base was refused, then read


def test_same_entries_compares_as_json_and_lists_of_other_lengths_differ() -> None:
    """The writer skips a PATCH when the entries it wants are the entries the claim has (`unchanged`)."""
    a = {"driver": "d", "pool": "p", "device": "gpu-0", "conditions": [{"type": "Ready", "status": "True"}]}
    b = {"device": "gpu-0", "pool": "p", "driver": "d", "conditions": [{"status": "True", "type": "Ready"}]}
    assert same_entries([a], [b])  # the order of an object's members is no difference
    assert same_entries([], [])
    assert not same_entries([a], [])
    assert not same_entries([], [a])
    assert not same_entries([a], [a, b])
    assert not same_entries([a], [{**b, "device": "gpu-1"}])
    assert not same_entries([a, b], [b, {**a, "device": "gpu-1"}])
