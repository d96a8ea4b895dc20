"""The e2e format's NVIDIA-driver part (issue 26): `nvidiaDriver` steps, `driver: absent-at-start`, the `slices`,
`deviceTaints`, `nodes` and `claims` expectations; validation naming file and field, the pure checks, the runner
(a cluster that cannot change drivers SKIPs, a driver left unloaded is loaded again before cleanup), `--only WORD`."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_sandbox.e2e.backend import BackendError
from dra_sandbox.e2e.expect import Observation, check_device_taints, check_events, check_node, check_slices, evaluate
from dra_sandbox.e2e.kubectl import NO_DRIVER_CONTROL
from dra_sandbox.e2e.loader import load_scenario, load_scenarios
from dra_sandbox.e2e.runner import FAIL, SKIP, Clock, Runner, RunnerConfig
from dra_sandbox.e2e.scenario import (
    DeviceTaintExpect,
    DriverChange,
    EventsExpect,
    JsonObject,
    NodeExpect,
    ObjectRef,
    SliceExpect,
)
from dra_sandbox.nvidiadriver import DriverAction, DriverView
from tests.e2e.test_expect import FakeClock, ScriptedBackend
from tests.e2e.test_loader import CLAIM, SCENARIOS, pod, problems_of, write

DRIVER_EXPECT = """
description: the driver goes and comes back
steps:
  - name: running
    apply: [claim.yaml, pods.yaml]
    expect:
      pods:
        a: {phase: Running}
      slices:
        h100: {count: 1, driverVersion: "580.105.08"}
  - name: unloaded
    nvidiaDriver: {node: h100, action: unload}
    expect:
      deviceTaints:
        h100: {key: gpu.dra.dev/unmonitored, effect: None}
      nodes:
        h100:
          annotations: {gpu.dra.dev/nvidia-driver: "^reloading"}
          events: {NvidiaDriverNotReady: "."}
          pluginReady: false
  - name: loaded
    nvidiaDriver: {node: h100, action: load, version: "580.126.09"}
    expect:
      slices:
        h100: {driverVersion: "580.126.09"}
      deviceTaints:
        h100: {key: gpu.dra.dev/unmonitored, devices: none}
      claims:
        gpu: {noEvents: [PreparedClaimLost]}
"""


def driver_files(expect: str = DRIVER_EXPECT) -> dict[str, str]:
    return {"claim.yaml": CLAIM, "pods.yaml": pod("a"), "expect.yaml": expect}


def test_the_driver_keys_load_into_the_model(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, driver_files()))
    assert scenario.acts_on_driver and scenario.driver is None
    first, unload, load = scenario.steps
    assert first.expect.slices == (SliceExpect("h100", 1, "580.105.08"),)
    assert unload.nvidia_driver == DriverChange("h100", "unload")
    assert unload.expect.device_taints == (DeviceTaintExpect("h100", "gpu.dra.dev/unmonitored", "None", "all"),)
    assert unload.expect.nodes == (NodeExpect("h100", {"gpu.dra.dev/nvidia-driver": "^reloading"},
                                              EventsExpect({"NvidiaDriverNotReady": "."}), False),)
    assert load.nvidia_driver == DriverChange("h100", "load", "580.126.09")
    assert load.expect.claims[0].events == EventsExpect({}, ("PreparedClaimLost",))


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (("action: unload}", "action: rmmod}"),
         "steps[1].nvidiaDriver.action: must be one of unload, load, reload; got 'rmmod'"),
        (("action: unload}", "action: unload, version: '580.1.1'}"),
         "steps[1].nvidiaDriver.version: goes with load or reload (unload removes whatever version is loaded); "
         "remove it"),
        (('version: "580.126.09"}', 'version: "latest"}'),
         "steps[2].nvidiaDriver.version: 'latest' is not a driver version; write e.g. 580.126.09"),
        (("nvidiaDriver: {node: h100, action: unload}", "nvidiaDriver: {node: H100, action: unload}"),
         "steps[1].nvidiaDriver.node: must be a node alias (the node's e2e.dra.dev/node label value), got 'H100'"),
        (("  - name: unloaded\n", "  - name: unloaded\n    apply: [claim.yaml]\n"),
         "steps[1]: needs exactly one of apply (files), delete (objects or files), applyFails (files) or "
         "nvidiaDriver (a node's driver)"),
        (('{count: 1, driverVersion: "580.105.08"}', '{count: 0, driverVersion: "580.105.08"}'),
         "steps[0].expect.slices.h100.driverVersion: no device shows a version when no slice is published "
         "(count: 0); remove one of them"),
        (('{count: 1, driverVersion: "580.105.08"}', "{}"),
         "steps[0].expect.slices.h100: needs at least one of count, driverVersion"),
        (('{count: 1, driverVersion: "580.105.08"}', "{count: -1}"),
         "steps[0].expect.slices.h100.count: must be a whole number >= 0, got -1 (ResourceSlices of the driver on "
         "the node (0: none))"),
        (("{key: gpu.dra.dev/unmonitored, devices: none}", "{key: gpu.dra.dev/unmonitored, devices: none, "
                                                            "effect: None}"),
         "steps[2].expect.deviceTaints.h100.effect: makes no sense with devices: none (no device has the key); "
         "remove it"),
        (("effect: None}", "effect: none}"),
         "steps[1].expect.deviceTaints.h100.effect: must be one of NoSchedule, NoExecute, None; got 'none'"),
        (("{NvidiaDriverNotReady: \".\"}", "{nvidia-driver-not-ready: \".\"}"),
         "steps[1].expect.nodes.h100.events.nvidia-driver-not-ready: must be an Event reason (CamelCase, e.g. NvidiaDriverNotReady), got "
         "'nvidia-driver-not-ready'"),
        (("pluginReady: false", "pluginReady: 'no'"),
         "steps[1].expect.nodes.h100.pluginReady: must be a boolean, got a string 'no' (the node's kubelet plugin's "
         "/healthz readiness)"),
        (("gpu: {noEvents: [PreparedClaimLost]}", "lost: {noEvents: [PreparedClaimLost]}"),
         "steps[2].expect.claims.lost: ResourceClaim 'lost' is not defined in any file of this scenario (a claim "
         "made from a template has a generated name: use a ResourceClaim)"),
        (("gpu: {noEvents: [PreparedClaimLost]}", "gpu: {events: {PreparedClaimLost: x}, noEvents: "
                                                   "[PreparedClaimLost]}"),
         "steps[2].expect.claims.gpu.noEvents: PreparedClaimLost cannot be both expected and not"),
        (("description: the driver goes and comes back\n", "description: x\ndriver: late\n"),
         "driver: must be 'absent-at-start', got 'late'"),
    ],
)
def test_each_driver_mistake_is_reported_with_file_and_field(
    tmp_path: Path, change: tuple[str, str], problem: str
) -> None:
    assert change[0] in DRIVER_EXPECT
    directory = write(tmp_path, driver_files(DRIVER_EXPECT.replace(*change)))
    problems = problems_of(directory)
    assert f"{directory / 'expect.yaml'}: {problem}" in problems, problems


def test_a_claim_is_named_only_once_applied(tmp_path: Path) -> None:
    text = DRIVER_EXPECT.replace("      pods:\n        a: {phase: Running}\n",
                                 "      claims:\n        gpu: {events: {PreparedClaimLost: x}}\n")
    text = text.replace("apply: [claim.yaml, pods.yaml]", "apply: [pods.yaml]").replace(
        "        h100: {driverVersion: \"580.126.09\"}\n", "        h100: {driverVersion: \"580.126.09\"}\n", 1)
    text += "  - apply: [claim.yaml]\n    expect: {gone: [Pod/a]}\n"
    directory = write(tmp_path, driver_files(text))
    assert (f"{directory / 'expect.yaml'}: steps[0].expect.claims.gpu: ResourceClaim 'gpu' is not applied by this "
            "or an earlier step") in problems_of(directory)


# --- the pure checks ------------------------------------------------------------------------------------------


def _slice(*devices: JsonObject) -> JsonObject:
    return {"spec": {"driver": "gpu.dra.dev", "nodeName": "node-h100", "devices": list(devices)}}


def _device(name: str, version: str | None = "580.105.8", taints: tuple[JsonObject, ...] = ()) -> JsonObject:
    attributes = {"type": {"string": "gpu"}}
    if version is not None:
        attributes["driverVersion"] = {"version": version}
    return {"name": name, "attributes": attributes, "taints": list(taints)}


UNMONITORED = {"key": "gpu.dra.dev/unmonitored", "value": "driver-reload", "effect": "None"}


def test_slices_count_and_the_driver_version_every_device_shows() -> None:
    published = (_slice(_device("gpu-0"), _device("gpu-0-mig", version=None)),)
    assert check_slices(SliceExpect("h100", count=1, driver_version="580.105.08"), published) is None
    assert str(check_slices(SliceExpect("h100", count=0), published)) == (
        "slices.h100.count: want 0 slice(s); saw 1 slice(s) with 2 device(s)")
    assert str(check_slices(SliceExpect("h100", driver_version="580.126.09"), published)) == (
        "slices.h100.driverVersion: want 580.126.9 on every device that has one; saw 1 slice(s) with 2 device(s); "
        "driverVersion 580.105.8")
    mixed = (_slice(_device("gpu-0"), _device("gpu-1", version="580.126.9")),)
    assert check_slices(SliceExpect("h100", driver_version="580.126.09"), mixed) is not None
    assert str(check_slices(SliceExpect("h100", driver_version="580.105.08"), ())) == (
        "slices.h100.driverVersion: want 580.105.8 on every device that has one; saw 0 slice(s) with 0 device(s); "
        "driverVersion on no device")
    assert check_slices(SliceExpect("h100", count=0), ()) is None


def test_device_taints_on_every_device_or_on_none() -> None:
    every = DeviceTaintExpect("h100", "gpu.dra.dev/unmonitored", "None")
    none = DeviceTaintExpect("h100", "gpu.dra.dev/unmonitored", devices="none")
    tainted = (_slice(*(_device(f"gpu-{i}", taints=(UNMONITORED,)) for i in range(8))),)
    clean = (_slice(*(_device(f"gpu-{i}") for i in range(8))),)
    assert check_device_taints(every, tainted) is None and check_device_taints(none, clean) is None
    assert str(check_device_taints(every, clean)) == (
        "deviceTaints.h100: want taint gpu.dra.dev/unmonitored on every device; saw 0 of 8; without it: "
        "gpu-0, gpu-1, gpu-2, gpu-3, gpu-4 and 3 more")
    assert str(check_device_taints(none, tainted)).startswith(
        "deviceTaints.h100: want no device with taint gpu.dra.dev/unmonitored; saw 8 of 8: gpu-0")
    schedule = (_slice(_device("gpu-0", taints=({**UNMONITORED, "effect": "NoSchedule"},))),)
    assert str(check_device_taints(every, schedule)) == (
        "deviceTaints.h100.effect: want effect None; saw gpu-0: NoSchedule")
    assert str(check_device_taints(none, ())) == (
        "deviceTaints.h100: want published devices to look at for taint gpu.dra.dev/unmonitored; saw no device "
        "published")


def test_node_annotations_events_and_readiness() -> None:
    want = NodeExpect("h100", {"gpu.dra.dev/nvidia-driver": "^not-ready: "},
                      EventsExpect({"NvidiaDriverNotReady": "DRIVER_NOT_LOADED"}, ("NvidiaDriverReady",)), False)
    node = {"metadata": {"name": "node-h100", "annotations": {
        "gpu.dra.dev/nvidia-driver": "not-ready: NVML: DRIVER_NOT_LOADED"}}}
    event = {"reason": "NvidiaDriverNotReady", "message": "NVML init failed: DRIVER_NOT_LOADED"}
    assert check_node(want, node, (event,), (False, "HTTP 503: driver not ready")) is None
    assert str(check_node(want, None, (), None)) == "nodes.h100: want the Node; saw no such node"
    ready_node = {"metadata": {"annotations": {"gpu.dra.dev/nvidia-driver": "ready"}}}
    assert str(check_node(want, ready_node, (event,), None)) == (
        "nodes.h100.annotations.gpu.dra.dev/nvidia-driver: want a value matching '^not-ready: '; saw 'ready'")
    assert str(check_node(want, {"metadata": {}}, (event,), None)) == (
        "nodes.h100.annotations.gpu.dra.dev/nvidia-driver: want a value matching '^not-ready: '; saw not set")
    assert str(check_node(want, node, (), None)) == (
        "nodes.h100.events.NvidiaDriverNotReady: want an Event NvidiaDriverNotReady with a message matching "
        "'DRIVER_NOT_LOADED'; saw no Events")
    ready = {"reason": "NvidiaDriverReady", "message": "driver 580.105.08"}
    assert str(check_node(want, node, (event, ready), None)) == (
        "nodes.h100.noEvents: want no Event NvidiaDriverReady; saw NvidiaDriverReady: driver 580.105.08")
    assert str(check_node(want, node, (event,), None)).startswith(
        "nodes.h100.pluginReady: want false; saw not observable here")
    assert str(check_node(want, node, (event,), (True, "HTTP 200: ok"))) == (
        "nodes.h100.pluginReady: want false; saw HTTP 200: ok")
    assert check_events("claims.c", EventsExpect({"PreparedClaimLost": "(?i)mig"}),
                        ({"reason": "PreparedClaimLost", "message": "its MIG instance is gone"},)) is None


def test_evaluate_reads_the_driver_keys_from_the_observation(tmp_path: Path) -> None:
    _, unload, load = load_scenario(write(tmp_path, driver_files())).steps
    tainted = (_slice(_device("gpu-0", taints=(UNMONITORED,))),)
    node = {"metadata": {"annotations": {"gpu.dra.dev/nvidia-driver": "reloading: GPU_IS_LOST"}}}
    seen = Observation(slices={"h100": tainted}, nodes={"h100": node},
                       events={"Node/h100": ({"reason": "NvidiaDriverNotReady", "message": "reloading"},)},
                       plugin_ready={"h100": (False, "HTTP 503")})
    assert evaluate(unload.expect, seen, {}) == []
    assert [f.what for f in evaluate(load.expect, seen, {})] == ["slices.h100.driverVersion", "deviceTaints.h100"]


# --- the runner -----------------------------------------------------------------------------------------------


class DriverBackend(ScriptedBackend):
    """A scripted cluster whose nodes' drivers the runner may change (as the sandbox's)."""

    def __init__(self, *, loaded: bool = True, fail_loads: bool = False) -> None:
        super().__init__({"a": "GPU-aaaaaaaa-0000"})
        self.driver = DriverView(loaded, "580.105.08", 0)
        self.fail_loads = fail_loads

    def driver_control(self) -> str:
        return ""

    def driver_of(self, node: str) -> DriverView:
        return self.driver

    def change_driver(self, node: str, action: DriverAction, version: str | None) -> tuple[DriverView, DriverView]:
        self.calls.append(f"nvidia-driver {action} {node} {version}")
        if action == "load" and self.fail_loads:
            raise BackendError("no such module")
        before = self.driver
        loaded = action != "unload"
        self.driver = DriverView(loaded, version or before.version, before.generation + int(loaded))
        return before, self.driver


def test_a_cluster_that_cannot_change_drivers_skips_the_scenario(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, driver_files()))
    backend = ScriptedBackend({})
    [result] = Runner(backend).run([scenario])
    assert (result.status, result.detail) == (SKIP, "the scripted cluster has no NVIDIA driver to change")
    assert backend.calls == []
    absent = load_scenario(SCENARIOS / "driver-not-ready-at-start")
    [result] = Runner(backend).run([absent])
    assert (result.status, result.detail) == (
        SKIP, "driver: absent-at-start and the scripted cluster has no NVIDIA driver to change")
    assert "only to the sandbox's fake nodes" in NO_DRIVER_CONTROL


def test_absent_at_start_skips_where_the_driver_is_loaded() -> None:
    scenario = load_scenario(SCENARIOS / "driver-not-ready-at-start")
    [result] = Runner(DriverBackend(loaded=True)).run([scenario])
    assert (result.status, result.detail) == (
        SKIP, "driver: absent-at-start, but the NVIDIA driver of node-h100 is loaded (`dra-sandbox e2e` starts a "
        "sandbox without it for such scenarios)")


def test_a_driver_step_acts_on_the_aliased_node_and_a_failed_scenario_loads_it_again(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, driver_files()))
    backend = DriverBackend()
    clock = FakeClock()
    lines: list[str] = []
    runner = Runner(backend, RunnerConfig(step_timeout=3), clock=Clock(clock.monotonic, clock.sleep),
                    write=lines.append)
    [result] = runner.run([scenario])
    # Step 1 needs slices the scripted cluster never publishes.
    assert result.status == FAIL and result.detail.startswith("step 1 (running): after 3s: slices.h100.count")
    assert not [c for c in backend.calls if c.startswith("nvidia-driver")]

    unloaded = write(tmp_path, driver_files(DRIVER_EXPECT.replace(
        "        h100: {count: 1, driverVersion: \"580.105.08\"}\n", "        h100: {count: 0}\n")), name="second")
    backend = DriverBackend()
    lines.clear()
    runner = Runner(backend, RunnerConfig(step_timeout=3), clock=Clock(clock.monotonic, clock.sleep),
                    write=lines.append)
    [result] = runner.run([load_scenario(unloaded)])
    assert result.status == FAIL and result.detail.startswith("step 2 (unloaded): after 3s: deviceTaints.h100")
    assert [c for c in backend.calls if c.startswith("nvidia-driver")] == [
        "nvidia-driver unload node-h100 None",  # the step
        "nvidia-driver load node-h100 None",  # the cleanup: its claims cannot be unprepared without a driver
    ]
    assert ("    step 2 (unloaded): node-h100: NVIDIA driver loaded (version 580.105.08, load #0) -> not loaded "
            "(version 580.105.08, load #0)") in lines
    assert any(line.startswith("    cleanup: node-h100: NVIDIA driver not loaded") for line in lines)
    assert backend.calls[-1] == "delete Namespace/e2e-second"

    stuck = DriverBackend(fail_loads=True)
    [result] = Runner(stuck, RunnerConfig(step_timeout=3), clock=Clock(clock.monotonic, clock.sleep)).run(
        [load_scenario(unloaded)])
    assert result.status == FAIL and result.detail.endswith(
        "cleanup: loading the NVIDIA driver of node-h100 again: no such module; ")


def test_observe_asks_for_the_node_events_and_readiness_by_node_name(tmp_path: Path) -> None:
    asked: list[str] = []

    class Watching(DriverBackend):
        def events(self, about: ObjectRef) -> list[JsonObject]:
            asked.append(f"events {about} {about.namespace}")
            return []

        def plugin_ready(self, node: str) -> tuple[bool, str] | None:
            asked.append(f"ready {node}")
            return False, "HTTP 503"

    scenario = load_scenario(write(tmp_path, driver_files()))
    runner = Runner(Watching())
    observation = runner.observe(scenario, scenario.steps[1].expect, {"node-h100": "h100"})
    assert asked == ["events Node/node-h100 None", "ready node-h100"]
    assert observation.plugin_ready == {"h100": (False, "HTTP 503")}
    asked.clear()
    runner.observe(scenario, scenario.steps[2].expect, {"node-h100": "h100"})
    assert asked == ["events ResourceClaim/gpu e2e-demo-scenario"]


def test_only_a_word_selects_every_scenario_whose_name_contains_it() -> None:
    names = [s.name for s in load_scenarios(SCENARIOS, ["driver"])]
    assert names == ["driver-not-ready-at-start", "driver-reload-new-version"]
    assert [s.name for s in load_scenarios(SCENARIOS, ["single-gpu", "driver-reload-new-version"])] == [
        "single-gpu", "driver-reload-new-version"]
    for scenario in load_scenarios(SCENARIOS, ["driver"]):
        # Their own sandbox (`dra-sandbox e2e`) starts only the node they name.
        assert scenario.acts_on_driver and scenario.node_aliases == frozenset({"h100"}), scenario.name

