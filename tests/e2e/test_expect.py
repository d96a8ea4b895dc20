"""The pure core: expectations against observations, the runner's verdicts with a fake backend, tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dra_sandbox.e2e.backend import BackendError, ContainerView, PodView, condition_message, parse_visible_devices
from dra_sandbox.e2e.expect import Observation, devices_seen, evaluate
from dra_sandbox.e2e.loader import load_scenario
from dra_sandbox.e2e.runner import FAIL, PASS, SKIP, Clock, Runner, RunnerConfig, summary
from dra_sandbox.e2e.scenario import (
    ContainerExpect,
    ContainerRef,
    Expectations,
    JsonObject,
    ObjectRef,
    PodExpect,
)
from dra_sandbox.e2e.table import render_table, shorten_id
from dra_sandbox.nvidiadriver import DriverAction, DriverView

GPU_A, GPU_B = "GPU-aaaaaaaa-0000", "GPU-bbbbbbbb-0000"


def view(name: str, phase: str = "Running", devices: str = GPU_A, **kw: Any) -> PodView:
    container = ContainerView(env={"NVIDIA_VISIBLE_DEVICES": devices}, runtime="podman", executed=True)
    return PodView(name, True, phase=phase, node="node-h100", node_alias="h100", containers={"main": container}, **kw)


def test_a_met_expectation_passes_and_each_unmet_one_says_what_was_seen() -> None:
    want = Expectations(
        pods=(
            PodExpect("a", "Running", node="h100", containers={"main": ContainerExpect(devices=1, uuid="GPU")}),
            PodExpect("w", "Pending", message="cannot allocate"),
        )
    )
    pending = PodView("w", True, phase="Pending", message="0/2 nodes are available: 2 cannot allocate all claims.")
    assert evaluate(want, Observation(pods={"a": view("a"), "w": pending}), {}) == []

    cases = {
        "pods.a.phase: want Running; saw phase Pending on node-h100 (alias h100)": view("a", phase="Pending"),
        "pods.a.containers.main.devices: want 1 device(s); saw 2: ['GPU-aaaaaaaa-0000', 'GPU-bbbbbbbb-0000']": view(
            "a", devices=f"{GPU_A},{GPU_B}"
        ),
        "pods.a.containers.main.uuid: want only GPU-... UUIDs; saw ['MIG-1']": view("a", devices="MIG-1"),
        "pods.a.phase: want Running; saw no such pod": PodView("a", False),
    }
    for message, seen in cases.items():
        failures = evaluate(want, Observation(pods={"a": seen, "w": pending}), {})
        assert [str(f) for f in failures] == [message]
    wrong_node = PodView("a", True, phase="Running", node="node-a100", node_alias="a100")
    assert str(evaluate(want, Observation(pods={"a": wrong_node, "w": pending}), {})[0]) == (
        "pods.a.node: want a node labelled alias h100; saw node-a100 (alias a100)"
    )
    silent = PodView("w", True, phase="Pending", message="")
    assert [str(f) for f in evaluate(want, Observation(pods={"a": view("a"), "w": silent}), {})] == [
        "pods.w.message: want a match for 'cannot allocate'; saw no message yet"
    ]


def test_env_expectations_and_device_lists() -> None:
    want = Expectations(pods=(PodExpect("a", "Running", containers={"main": ContainerExpect(env={"X": "^ok$"})}),))
    assert str(evaluate(want, Observation(pods={"a": view("a")}), {})[0]) == (
        "pods.a.containers.main.env.X: want a value matching '^ok$'; saw unset"
    )
    assert parse_visible_devices(" GPU-1, GPU-2 ,") == ("GPU-1", "GPU-2")
    assert parse_visible_devices("void") == () and parse_visible_devices("") == ()


def test_groups_compare_with_devices_remembered_from_earlier_steps() -> None:
    holder, waiter = ContainerRef("holder", "main"), ContainerRef("waiter", "main")
    same = Expectations(same_devices=((holder, waiter),))
    # Step 1 saw the holder; step 3 sees only the waiter (the holder was deleted).
    remembered = devices_seen(Observation(pods={"holder": view("holder")}), {})
    assert remembered == {holder: (GPU_A,)}
    assert evaluate(same, Observation(pods={"waiter": view("waiter")}), remembered) == []
    failures = evaluate(same, Observation(pods={"waiter": view("waiter", devices=GPU_B)}), remembered)
    assert str(failures[0]) == (
        "sameDevices[0]: want identical device lists; saw holder/main: ['GPU-aaaaaaaa-0000'], "
        "waiter/main: ['GPU-bbbbbbbb-0000']"
    )
    assert str(evaluate(same, Observation(), {})[0]) == (
        "sameDevices[0]: want a device list for holder/main; saw none reported (yet)"
    )
    distinct = Expectations(distinct_devices=((holder, waiter),))
    assert (
        evaluate(distinct, Observation(pods={"holder": view("holder"), "waiter": view("waiter", devices=GPU_B)}), {})
        == []
    )
    clash = evaluate(distinct, Observation(pods={"holder": view("holder"), "waiter": view("waiter")}), {})
    assert (
        str(clash[0])
        == "distinctDevices[0]: want no device shared; saw GPU-aaaaaaaa-0000 seen by holder/main and waiter/main"
    )


def test_gone_and_condition_messages() -> None:
    ref = ObjectRef("ResourceClaim", "c", "ns")
    want = Expectations(gone=(ref,))
    assert [str(f) for f in evaluate(want, Observation(present=frozenset({ref})), {})] == [
        "gone.ResourceClaim/c: want the object deleted; saw it still exists"
    ]
    assert evaluate(want, Observation(), {}) == []
    pod = {
        "status": {
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "False", "message": "waiting for claims"},
                {"type": "PodScheduled", "status": "False", "message": "cannot allocate all claims"},
            ]
        }
    }
    assert condition_message(pod) == "cannot allocate all claims"
    pod["status"]["conditions"][1]["status"] = "True"
    assert condition_message(pod) == "waiting for claims"


class ScriptedBackend:
    """A backend whose pods appear Running after a given number of looks; records every call."""

    name = "scripted"
    poll_interval = 1.0

    def __init__(self, devices: dict[str, str], running_after: int = 0, aliases: tuple[str, ...] = ("h100",)) -> None:
        self.objects: dict[tuple[str, str, str | None], JsonObject] = {}
        self.devices = devices
        self.running_after = running_after
        self.looks = 0
        self.calls: list[str] = []
        self.aliases = aliases

    def apply(self, obj: JsonObject) -> None:
        meta = obj["metadata"]
        self.calls.append(f"apply {obj['kind']}/{meta['name']}")
        self.objects[(obj["kind"], meta["name"], meta.get("namespace"))] = obj

    def delete(self, ref: ObjectRef) -> None:
        self.calls.append(f"delete {ref}")
        if ref.kind == "Namespace":
            self.objects = {k: v for k, v in self.objects.items() if k[2] != ref.name and k[1] != ref.name}
        self.objects.pop((ref.kind, ref.name, ref.namespace), None)

    def get(self, ref: ObjectRef) -> JsonObject | None:
        obj = self.objects.get((ref.kind, ref.name, ref.namespace))
        if obj is None or ref.kind != "Pod":
            return obj
        self.looks += 1
        phase = "Running" if self.looks > self.running_after else "Pending"
        return {**obj, "status": {"phase": phase}, "spec": {**obj["spec"], "nodeName": "node-h100"}}

    def nodes(self) -> list[JsonObject]:
        return [{"metadata": {"name": f"node-{a}", "labels": {"e2e.dra.dev/node": a}}} for a in self.aliases]

    def resource_slices(self) -> list[JsonObject]:
        return []

    def container(self, pod: JsonObject, container: str) -> ContainerView | None:
        value = self.devices.get(pod["metadata"]["name"])
        return None if value is None else ContainerView({"NVIDIA_VISIBLE_DEVICES": value}, "fake", True)

    def scheduling_message(self, pod: JsonObject) -> str:
        return "not yet"

    def events(self, about: ObjectRef) -> list[JsonObject]:
        return []

    def plugin_ready(self, node: str) -> tuple[bool, str] | None:
        return None

    def driver_control(self) -> str:
        return "the scripted cluster has no NVIDIA driver to change"

    def driver_of(self, node: str) -> DriverView:
        raise BackendError(self.driver_control())

    def change_driver(self, node: str, action: DriverAction, version: str | None) -> tuple[DriverView, DriverView]:
        raise BackendError(self.driver_control())


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


SHARED = Path(__file__).resolve().parents[2] / "e2e" / "scenarios" / "shared-claim"


def test_runner_polls_until_expectations_hold_and_cleans_up() -> None:
    scenario = load_scenario(SHARED)
    backend = ScriptedBackend({"pod-a": GPU_A, "pod-b": GPU_A}, running_after=4)
    clock = FakeClock()
    seen_steps: list[str] = []
    runner = Runner(
        backend,
        RunnerConfig(step_timeout=30),
        clock=Clock(clock.monotonic, clock.sleep),
        on_step=lambda sc, step, obs: seen_steps.append(f"{sc.name}:{step.number}:{sorted(obs.pods)}"),
    )
    [result] = runner.run([scenario])
    assert result.status == PASS and result.steps_passed == 1, result
    assert clock.slept == [1.0, 1.0]  # two pods per look: running from the 5th get on, i.e. the third look
    assert seen_steps == ["shared-claim:1:['pod-a', 'pod-b']"]
    assert backend.calls == [
        "apply Namespace/e2e-shared-claim",
        "apply ResourceClaim/shared-gpu",
        "apply Pod/pod-a",
        "apply Pod/pod-b",
        "delete Namespace/e2e-shared-claim",
    ]
    assert backend.objects == {}


def test_runner_reports_the_first_unmet_expectation_after_the_timeout() -> None:
    scenario = load_scenario(SHARED)
    backend = ScriptedBackend({"pod-a": GPU_A, "pod-b": GPU_B})
    clock = FakeClock()
    [result] = Runner(backend, RunnerConfig(step_timeout=5), clock=Clock(clock.monotonic, clock.sleep)).run([scenario])
    assert result.status == FAIL
    assert result.detail == (
        "step 1 (both pods run on the shared GPU): after 5s: sameDevices[0]: want identical device lists; "
        "saw pod-a/main: ['GPU-aaaaaaaa-0000'], pod-b/main: ['GPU-bbbbbbbb-0000']"
    )
    assert backend.calls[-1] == "delete Namespace/e2e-shared-claim"  # cleaned up after the failure too
    assert summary([result]) == ("0 passed, 1 failed, 0 skipped", 1)


def test_a_scenario_needing_an_unlabelled_node_is_skipped() -> None:
    scenario = load_scenario(SHARED)
    backend = ScriptedBackend({}, aliases=("a100",))
    [result] = Runner(backend).run([scenario])
    assert result.status == SKIP
    assert "no node labelled e2e.dra.dev/node=h100" in result.detail
    assert backend.calls == []
    assert summary([result]) == ("0 passed, 0 failed, 1 skipped (nothing ran)", 1)


def test_tables_align_multi_line_cells() -> None:
    text = render_table(["A", "BB"], [["x", ["1", "22"]], [["long cell"], "y"]], indent="  ")
    assert text.splitlines() == [
        "  A          BB",
        "  ---------  --",
        "  x          1",
        "             22",
        "  long cell  y",
    ]
    assert shorten_id("GPU-f5410d5c-b860-5217-a017-359f27425786") == "GPU-f5410d5c…"
    assert shorten_id("k8s.gpu.dra.dev/claim=3250a72f-8345-41ae-9994-4af0e39ce361-gpu-0") == (
        "k8s.gpu.dra.dev/claim=3250a72f…-gpu-0"
    )
    assert shorten_id("gpu-0") == "gpu-0"


class StickyNamespaces(ScriptedBackend):
    """Namespaces never go away (a stuck finalizer)."""

    def delete(self, ref: ObjectRef) -> None:
        self.calls.append(f"delete {ref}")


def test_leftovers_are_removed_first_and_a_stuck_cleanup_fails_the_scenario() -> None:
    scenario = load_scenario(SHARED)
    backend = ScriptedBackend({"pod-a": GPU_A, "pod-b": GPU_A})
    backend.objects[("Namespace", "e2e-shared-claim", None)] = {"metadata": {"name": "e2e-shared-claim"}}
    [result] = Runner(backend).run([scenario])
    assert result.status == PASS
    assert backend.calls[:2] == ["delete Namespace/e2e-shared-claim", "apply Namespace/e2e-shared-claim"]

    sticky = StickyNamespaces({"pod-a": GPU_A, "pod-b": GPU_A})
    clock = FakeClock()
    config = RunnerConfig(step_timeout=5, cleanup_timeout=3)
    [result] = Runner(sticky, config, clock=Clock(clock.monotonic, clock.sleep)).run([scenario])
    assert result.status == FAIL and result.steps_passed == 1
    assert result.detail == (
        "cleanup: timed out waiting for the scenario's objects to go: still there: Namespace/e2e-shared-claim"
    )


def test_device_nodes_and_mounts_each_need_a_match_and_are_never_assumed() -> None:
    """Passthrough scenarios (docs/passthrough.md): every regex must match one device node / mount the container
    got; where nothing is known (a real cluster's log) the check fails saying so rather than passing."""
    want = Expectations(pods=(PodExpect("vm", "Running", containers={"compute": ContainerExpect(
        device_nodes=("^/dev/vfio/[0-9]+$", "^/dev/vfio/vfio$"), mounts=("dra-device-attributes/",))}),))

    def vm(device_nodes: tuple[str, ...] | None, mounts: tuple[str, ...] | None) -> PodView:
        container = ContainerView(env={}, runtime="cdi-check", executed=False, device_nodes=device_nodes,
                                  mounts=mounts)
        return PodView("vm", True, phase="Running", containers={"compute": container})

    seen_all = vm(("/dev/vfio/7", "/dev/vfio/vfio"),
                  ("/var/run/kubernetes.io/dra-device-attributes/resourceclaims/c/gpu/gpu.dra.dev-metadata.json",))
    assert evaluate(want, Observation(pods={"vm": seen_all}), {}) == []
    [failure] = evaluate(want, Observation(pods={"vm": vm(("/dev/vfio/7",), ())}), {})
    assert str(failure) == ("pods.vm.containers.compute.deviceNodes: want one matching '^/dev/vfio/vfio$'; "
                            "saw ['/dev/vfio/7']")
    [failure] = evaluate(want, Observation(pods={"vm": vm(("/dev/vfio/7", "/dev/vfio/vfio"), ())}), {})
    assert str(failure) == "pods.vm.containers.compute.mounts: want one matching 'dra-device-attributes/'; saw []"
    [failure] = evaluate(want, Observation(pods={"vm": vm(None, None)}), {})
    assert "deviceNodes" in str(failure) and "not observable here" in str(failure)
