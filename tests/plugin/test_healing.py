"""Health that heals: taints come on an event and go after the healthy window (fake clock, no sleeping), a lost
GPU never heals, flapping doubles the window, and the keeper sends no API request (admin taints are
DeviceTaintRules; a Node still carrying the old annotation gets one warning Event). Checked on the real objects: the plugin's ResourceSlices, the kubelet health stream's board, the Node's Events and the
metrics."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering
from dra_driver.k8s.client import KubeRest
from dra_driver.nvml.factory import open_backend
from dra_driver.plugin.app import KubeletPlugin, PluginSettings
from dra_driver.plugin.health.healing import HealthLedger, parse_overrides
from dra_driver.plugin.health.keeper import HealthKeeper, KeeperParts
from dra_driver.plugin.health.problems import DeviceProblem, lost_problem
from dra_sandbox.apiserver import ApiServer
from tests.polling import wait_for

D = DRIVER_NAME
NODE = "node-l4"
HEAL = 600.0
XID_48 = DeviceProblem(f"{D}/xid", "48", "NoSchedule", "Xid 48")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RecordingRest(KubeRest):
    def __init__(self, inner: KubeRest) -> None:
        super().__init__(inner.transport)
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        self.calls.append((method, path, dict(kwargs.get("query") or {})))
        return super().request(method, path, **kwargs)


@dataclass
class Env:
    plugin: KubeletPlugin
    rest: KubeRest
    backend: Any
    clock: FakeClock
    plugin_rest: RecordingRest

    def taints(self) -> dict[str, Any]:
        slices = self.rest.request("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
        return {d["name"]: d.get("taints") for s in slices for d in s["spec"].get("devices", [])}

    def healthy(self, device: str) -> bool:
        return bool(next(d.healthy for d in self.plugin.health.snapshot().devices if d.device == device))

    def node_events(self) -> list[dict[str, Any]]:
        items = self.rest.request("GET", "/api/v1/namespaces/default/events")["items"]
        return [e for e in items if e["involvedObject"]["kind"] == "Node" and e["involvedObject"]["name"] == NODE]

    def transitions(self, change: str, reason: str) -> float:
        value = self.plugin.metrics.registry.get_sample_value(
            "dra_driver_device_health_transitions_total", {"transition": change, "reason": reason}
        )
        return value or 0.0

    def annotate(self, value: str | None) -> None:
        self.rest.request(
            "PATCH", f"/api/v1/nodes/{NODE}",
            body={"metadata": {"annotations": {f"{D}/device-health": value}}},
            content_type="application/merge-patch+json",
        )  # fmt: skip


@pytest.fixture
def env() -> Iterator[Env]:
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra-heal-"))
    (work / "boot_id").write_text("b\n")
    backend = open_backend("fake:l4x2")
    backend.init()
    clock = FakeClock()
    with ApiServer() as srv:
        rest = srv.rest()
        rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        settings = PluginSettings(
            node_name=NODE, driver_name=D, plugin_dir=work / "p", registry_dir=work / "r", cdi_root=work / "cdi",
            driver_root=Path("/"), host_driver_root=Path("/"), mig_offering=MigOffering.DYNAMIC, fake_cdi=True,
            healthz_port=None, boot_id_path=work / "boot_id", kube_version=(1, 35),
            health_heal_after=HEAL, health_heal_after_max=4 * HEAL, health_check_interval=3600.0,
        )  # fmt: skip
        plugin_rest = RecordingRest(srv.rest())
        plugin = KubeletPlugin(settings, nvml=backend, rest=plugin_rest, clock=clock)
        plugin.start()
        e = Env(plugin, rest, backend, clock, plugin_rest)
        wait_for(lambda: e.taints() == {"gpu-0": None, "gpu-1": None}, 10, "the first publish")
        try:
            yield e
        finally:
            plugin.stop()
    shutil.rmtree(work, ignore_errors=True)


def _xid(env: Env, device: str, xid: int) -> None:
    assert env.backend.inject_xid(env.plugin.devices()[device].gpu.uuid, xid)


def test_an_xid_taint_heals_after_the_healthy_window(env: Env) -> None:
    _xid(env, "gpu-1", 48)
    wait_for(lambda: env.taints()["gpu-1"], 10, "the Xid taint")
    assert env.taints()["gpu-1"] == [{"key": f"{D}/xid", "value": "48", "effect": "NoSchedule"}]
    assert not env.healthy("gpu-1")

    env.clock.now += HEAL - 1
    env.plugin.health_keeper.tick()
    assert env.taints()["gpu-1"] and not env.healthy("gpu-1")  # not yet

    env.clock.now += 1
    env.plugin.health_keeper.tick()
    wait_for(lambda: env.taints()["gpu-1"] is None, 10, "the taint removed")
    assert env.healthy("gpu-1") and env.taints()["gpu-0"] is None
    assert env.transitions("tainted", "xid") == 1 and env.transitions("untainted", "healthy-window") == 1

    assert env.plugin.events is not None and env.plugin.events.flush()
    events = {e["reason"]: e for e in env.node_events()}
    assert set(events) == {"DeviceTainted", "DeviceUntainted"}
    assert events["DeviceTainted"]["type"] == "Warning"
    assert events["DeviceTainted"]["message"].startswith(f"gpu-1 tainted ({D}/xid=48:NoSchedule): Xid 48")
    assert events["DeviceUntainted"]["type"] == "Normal"
    assert "no new event for 10m and the NVML probe of the GPU succeeded" in events["DeviceUntainted"]["message"]
    assert events["DeviceTainted"]["involvedObject"]["uid"]  # the Node's


def _second_keeper(env: Env) -> HealthKeeper:
    """A keeper beside the plugin's own, on the same devices and the plugin's Node Events, driven by the test's calls
    only."""
    return HealthKeeper(
        HealthLedger(D, heal_after=HEAL, heal_after_max=4 * HEAL),
        KeeperParts(nvml=env.backend, devices=env.plugin.devices, events=env.plugin.node_events,
                    metrics=env.plugin.metrics, on_change=lambda _problems: None),
        driver_name=D, clock=env.clock,
    )  # fmt: skip


def test_an_event_before_the_first_round_names_the_node_uid_read_at_start(env: Env) -> None:
    """The plugin notes the Node it read at start in its Node Events: an Xid that comes before any round has read the
    Node still produces an Event with the Node's uid (a keeper that never reads or is told the Node proves it)."""
    node = env.rest.request("GET", f"/api/v1/nodes/{NODE}")
    assert env.plugin.events is not None
    keeper = _second_keeper(env)
    keeper.on_problem(["gpu-0"], XID_48)
    assert env.plugin.events.flush()
    (event,) = [e for e in env.node_events() if e["reason"] == "DeviceTainted"]
    assert event["involvedObject"]["uid"] == node["metadata"]["uid"]


def test_health_rounds_send_no_node_request(env: Env) -> None:
    """Steady state: the plugin's health rounds (and its other loops) read no Node; earlier releases sent a GET per
    --health-check-interval for the admin annotation, 95 % of the fleet's steady requests (docs/benchmarks.md)."""
    calls = env.plugin_rest.calls
    # Once, at start: the GET, and the driver-state annotation once the driver is ready (plugin/driverreport.py).
    wait_for(lambda: len([c for c in calls if c[1].startswith("/api/v1/nodes")]) == 2, 10, "the annotation")
    node_calls = [(c[0], c[1]) for c in calls if c[1].startswith("/api/v1/nodes")]
    assert node_calls == [("GET", f"/api/v1/nodes/{NODE}"), ("PATCH", f"/api/v1/nodes/{NODE}")]
    del calls[:]
    for _ in range(5):
        env.clock.now += 10.0
        env.plugin.health_keeper.tick()
    _xid(env, "gpu-1", 48)
    wait_for(lambda: env.taints()["gpu-1"], 10, "the Xid taint")
    assert not [c for c in calls if c[1].startswith("/api/v1/nodes")], calls
    assert any("resourceslices" in c[1] for c in calls), calls  # the recorder sees the plugin's slice writes


def test_a_node_with_the_old_annotation_gets_one_warning(env: Env) -> None:
    """The annotation of earlier releases is no longer applied: the plugin says so once (log and Event) at start,
    pointing at `dra-driver health migrate`, and taints nothing because of it."""
    env.annotate("gpu-0=unhealthy")
    node = env.rest.request("GET", f"/api/v1/nodes/{NODE}")
    assert env.plugin.events is not None
    keeper = _second_keeper(env)
    keeper.note_node(node)
    keeper.tick()
    assert env.plugin.events.flush()
    (event,) = [e for e in env.node_events() if e["reason"] == "LegacyDeviceHealthAnnotation"]
    assert event["type"] == "Warning" and "dra-driver health migrate" in event["message"]
    assert keeper.problems() == {} and env.taints()["gpu-0"] is None


def test_a_lost_gpu_never_heals_even_after_its_xid_window(env: Env) -> None:
    _xid(env, "gpu-0", 48)
    wait_for(lambda: env.taints()["gpu-0"], 10, "the Xid taint")
    env.backend.inject_gpu_lost(env.plugin.devices()["gpu-0"].gpu.uuid)
    wait_for(lambda: len(env.taints()["gpu-0"] or []) == 1 and env.taints()["gpu-0"][0]["key"] == f"{D}/gpu-lost",
             10, "the gpu-lost taint")  # fmt: skip
    env.clock.now += 100 * HEAL
    env.plugin.health_keeper.tick()
    assert env.taints()["gpu-0"][0]["key"] == f"{D}/gpu-lost" and not env.healthy("gpu-0")
    assert env.transitions("untainted", "healthy-window") == 0


def test_flapping_doubles_the_window_up_to_the_cap() -> None:
    ledger = HealthLedger(D, heal_after=10, heal_after_max=40)
    assert [t.reason for t in ledger.record(["gpu-0"], XID_48, 0)] == ["xid"]
    assert ledger.due(9) == [] and ledger.due(10) == [("gpu-0", True)]
    ledger.heal("gpu-0", 10)
    ledger.record(["gpu-0"], XID_48, 15)  # within the window after healing: flapping
    assert ledger.window("gpu-0") == 20 and ledger.due(34) == [] and ledger.due(35) == [("gpu-0", True)]
    ledger.record(["gpu-0"], XID_48, 35)  # again while tainted
    ledger.record(["gpu-0"], XID_48, 36)
    assert ledger.window("gpu-0") == 40  # capped
    ledger.heal("gpu-0", 76)
    ledger.forget_quiet(200)  # a full window quiet: the damping starts over
    ledger.record(["gpu-0"], XID_48, 300)
    assert ledger.window("gpu-0") == 10


def test_gpu_lost_and_xid_79_never_heal_and_the_worst_problem_stays() -> None:
    ledger = HealthLedger(D, heal_after=10, heal_after_max=40)
    ledger.record(["a"], lost_problem(D), 0)
    ledger.record(["b"], DeviceProblem(f"{D}/xid", "79", "NoSchedule", "Xid 79"), 0)
    ledger.record(["a", "b"], DeviceProblem(f"{D}/xid", "13", "None", "Xid 13"), 1)
    assert ledger.due(10**6) == []
    assert ledger.problems()["a"] == (lost_problem(D),)
    assert HealthLedger(D, heal_after=0, heal_after_max=0).due(10**6) == []


def test_override_parsing() -> None:
    assert parse_overrides(" gpu-3=healthy@17, gpu-5=unhealthy,") == (
        {"gpu-3": "healthy@17", "gpu-5": "unhealthy"}, [],
    )  # fmt: skip
    entries, problems = parse_overrides("gpu-1=sick,gpu-2")
    assert entries == {} and len(problems) == 2 and "write <device>=healthy" in problems[0]
