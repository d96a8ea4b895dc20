"""Run scenarios on a backend: one namespace per scenario, steps in order, polling until each step's
expectations hold or its timeout passes, and a cleanup that leaves the cluster as it found it.

Waiting is always polling with a deadline (no fixed sleeps standing in for synchronisation); the clock is
passed in so tests can drive it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from dra_driver.defaults import DRIVER_NAME
from dra_sandbox.e2e.backend import Backend, BackendError, ContainerView, PodView
from dra_sandbox.e2e.expect import DevicesSeen, Failure, Observation, devices_seen, evaluate
from dra_sandbox.e2e.scenario import (
    COMPUTE_DOMAIN_CLUSTER,
    DRIVER_ABSENT_AT_START,
    NODE_LABEL,
    Expectations,
    JsonObject,
    ObjectRef,
    Scenario,
    Step,
    published_consumable_shares,
    publishes_type,
)

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
COMPUTE_DOMAIN_DRIVER = "compute-domain.gpu.dra.dev"  # dra_driver.computedomain.names.DRIVER_NAME
DEVICE_PLUGIN_RESOURCE = "nvidia.com/gpu"  # dra_driver.deviceplugin.settings.RESOURCE_NAME
_STARTED_PHASES = ("Running", "Succeeded", "Failed")
MANAGED_BY = {"app.kubernetes.io/managed-by": "dra-driver-e2e"}


@dataclass(frozen=True)
class Clock:
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


@dataclass(frozen=True)
class ScenarioResult:
    name: str
    status: str  # PASS, FAIL or SKIP
    seconds: float
    detail: str = ""  # FAIL: the first unmet expectation and what was seen; SKIP: why
    steps_passed: int = 0
    steps: int = 0


# Called after each step whose expectations held, with what was observed (the demo builds its table here).
StepHook = Callable[[Scenario, Step, Observation], None]


class StepFailed(Exception):
    def __init__(self, step: Step, failures: list[Failure], elapsed: float) -> None:
        self.step = step
        self.failures = failures
        first = failures[0] if failures else "no observation"
        more = f" (and {len(failures) - 1} more unmet)" if len(failures) > 1 else ""
        super().__init__(f"{step.title}: after {elapsed:.0f}s: {first}{more}")


@dataclass(frozen=True)
class RunnerConfig:
    step_timeout: float = 60.0  # a step's default, unless the scenario or step says otherwise
    cleanup_timeout: float = 120.0


class Runner:
    def __init__(
        self,
        backend: Backend,
        config: RunnerConfig | None = None,
        *,
        clock: Clock | None = None,
        on_step: StepHook | None = None,
        write: Callable[[str], None] | None = None,
    ) -> None:
        self.backend = backend
        self.config = config or RunnerConfig()
        self.clock = clock or Clock()
        self.on_step = on_step
        self._write = write or (lambda line: None)

    # --- the whole run ------------------------------------------------------------------------------

    def run(self, scenarios: Iterable[Scenario]) -> list[ScenarioResult]:
        results = []
        for scenario in scenarios:
            result = self.run_one(scenario)
            self._write(format_result(result))
            results.append(result)
        return results

    def node_aliases(self) -> dict[str, str]:
        """node name -> alias, for the nodes that carry the alias label."""
        aliases = {}
        for node in self.backend.nodes():
            labels = (node.get("metadata") or {}).get("labels") or {}
            if NODE_LABEL in labels:
                aliases[node["metadata"]["name"]] = str(labels[NODE_LABEL])
        return aliases

    def run_one(self, scenario: Scenario) -> ScenarioResult:
        start = self.clock.monotonic()

        def result(status: str, detail: str = "", passed: int = 0) -> ScenarioResult:
            seconds = self.clock.monotonic() - start
            return ScenarioResult(scenario.name, status, seconds, detail, passed, len(scenario.steps))

        # The missing part first: it says more than the missing node aliases would.
        if scenario.cluster == COMPUTE_DOMAIN_CLUSTER:
            missing_part = self._compute_domain_support()
            if missing_part:
                return result(SKIP, missing_part)
        if scenario.acts_on_driver and (why := self.backend.driver_control()):
            return result(SKIP, f"{'driver: ' + scenario.driver + ' and ' if scenario.driver else ''}{why}")
        try:
            aliases = self.node_aliases()
        except BackendError as exc:
            return result(FAIL, f"listing nodes: {exc}")
        missing = sorted(scenario.node_aliases - set(aliases.values()))
        if missing:
            return result(
                SKIP,
                f"no node labelled {', '.join(f'{NODE_LABEL}={m}' for m in missing)}; "
                "label one node per alias (see e2e/README.md)",
            )
        if scenario.driver == DRIVER_ABSENT_AT_START:
            try:
                loaded = sorted(node for node, alias in aliases.items()
                                if alias in scenario.node_aliases and self.backend.driver_of(node).loaded)
            except BackendError as exc:
                return result(FAIL, f"reading the nodes' NVIDIA driver: {exc}")
            if loaded:
                return result(SKIP, f"driver: {DRIVER_ABSENT_AT_START}, but the NVIDIA driver of {', '.join(loaded)} "
                              "is loaded (`dra-sandbox e2e` starts a sandbox without it for such scenarios)")
        if scenario.consumable_shares is not None:
            try:
                modes = published_consumable_shares(self.backend.resource_slices(), DRIVER_NAME)
            except BackendError as exc:
                return result(FAIL, f"listing ResourceSlices: {exc}")
            if scenario.consumable_shares not in modes:
                return result(
                    SKIP,
                    f"no node publishes GPUs with --consumable-shares {scenario.consumable_shares} (chart value "
                    f"sharing.consumableShares, or node label {DRIVER_NAME}/consumable-shares; see e2e/README.md)",
                )
        # Each device type a scenario needs, with where it comes from when no node publishes it.
        needed_types = (
            (scenario.passthrough, "vfio",
             f"no node offers GPUs for passthrough (chart value passthrough.enabled, or node label "
             f"{DRIVER_NAME}/passthrough=true; see docs/passthrough.md)"),
            (scenario.vgpu, "vgpu", "no node offers vGPUs (chart value vgpu.enabled on a vGPU host; see docs/vgpu.md)"),
            (scenario.fabric_partitions, "fm-partition",
             "no node offers Fabric Manager partitions (chart value fabricPartitions.enabled on an NVSwitch node "
             "with FM in shared NVSwitch mode; see docs/passthrough.md)"),
        )
        for needed, device_type, why_not_offered in needed_types:
            if not needed:
                continue
            try:
                offered = publishes_type(self.backend.resource_slices(), DRIVER_NAME, device_type)
            except BackendError as exc:
                return result(FAIL, f"listing ResourceSlices: {exc}")
            if not offered:
                return result(SKIP, why_not_offered)
        if scenario.device_plugin:
            try:
                served = self._device_plugin_served(min(self.config.step_timeout, 30.0))
            except BackendError as exc:
                return result(FAIL, f"listing Nodes: {exc}")
            if not served:
                return result(SKIP, f"no Node's allocatable shows {DEVICE_PLUGIN_RESOURCE} (chart value "
                                    "devicePlugin.enabled; see docs/device-plugin.md)")
        self._write(f"--- {scenario.name}: {scenario.description}")
        passed = 0
        outcome: ScenarioResult | None = None
        drivers = sorted({node for node, alias in aliases.items() for step in scenario.steps
                          if step.nvidia_driver is not None and step.nvidia_driver.node == alias})
        loaded_at_start: list[str] = []
        try:
            loaded_at_start = [node for node in drivers if self.backend.driver_of(node).loaded]
            self._fresh_namespace(scenario)
            seen: DevicesSeen = {}
            for step in scenario.steps:
                seen = self._run_step(scenario, step, aliases, seen)
                passed += 1
        except StepFailed as exc:
            outcome = result(FAIL, str(exc), passed)
        except (BackendError, TimeoutError) as exc:
            outcome = result(FAIL, f"step {passed + 1}: {exc}", passed)
        finally:
            cleanup_error = self._reload_drivers(loaded_at_start) + self._cleanup(scenario)
        if cleanup_error:
            # A scenario that leaves objects behind may break the next one: that is a failure of its own.
            detail = f"{outcome.detail}; " if outcome is not None else ""
            return result(FAIL, f"{detail}cleanup: {cleanup_error}", passed)
        return outcome or result(PASS, passed=passed)

    # --- steps --------------------------------------------------------------------------------------

    def _timeout(self, scenario: Scenario, step: Step) -> float:
        return step.timeout or scenario.timeout or self.config.step_timeout

    def _device_plugin_served(self, timeout: float) -> bool:
        """Whether a Node's allocatable shows the device plugin's resource, waiting up to `timeout` (a plugin
        registers with its kubelet a moment after it publishes its slices)."""
        deadline = time.monotonic() + timeout
        while True:
            if any(DEVICE_PLUGIN_RESOURCE in ((n.get("status") or {}).get("allocatable") or {})
                   for n in self.backend.nodes()):  # fmt: skip
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.backend.poll_interval)

    def _run_step(self, scenario: Scenario, step: Step, aliases: Mapping[str, str], seen: DevicesSeen) -> DevicesSeen:
        began = self.clock.monotonic()
        deadline = began + self._timeout(scenario, step)
        for file_name in step.apply:
            for obj in scenario.objects(file_name):
                self.backend.apply(obj)
        for file_name, pattern in step.apply_fails.items():
            for obj in scenario.objects(file_name):
                failure = self._refused(obj, file_name, pattern)
                if failure is not None:
                    raise StepFailed(step, [failure], self.clock.monotonic() - began)
        for ref in step.delete:
            self.backend.delete(ref)
        if step.delete:
            self._wait_gone(step.delete, deadline, "the deleted objects to go")
        if step.nvidia_driver is not None:
            change = step.nvidia_driver
            node = next(name for name, alias in aliases.items() if alias == change.node)
            before, after = self.backend.change_driver(node, change.action, change.version)
            self._write(f"    {step.title}: {node}: NVIDIA driver {before} -> {after}")
        while True:
            observation = self.observe(scenario, step.expect, aliases)
            failures = evaluate(step.expect, observation, seen)
            seen = devices_seen(observation, seen)
            if not failures:
                self._write(f"    {step.title}: ok ({self.clock.monotonic() - began:.1f}s)")
                if self.on_step is not None:
                    self.on_step(scenario, step, observation)
                return seen
            if self.clock.monotonic() >= deadline:
                raise StepFailed(step, failures, self.clock.monotonic() - began)
            self.clock.sleep(self.backend.poll_interval)

    def observe(self, scenario: Scenario, expect: Expectations, aliases: Mapping[str, str]) -> Observation:
        names = [p.name for p in expect.pods]
        for group in (*expect.same_devices, *expect.distinct_devices):
            names.extend(ref.pod for ref in group)
        pods = {}
        for name in dict.fromkeys(names):
            pod = self.backend.get(ObjectRef("Pod", name, scenario.namespace))
            pods[name] = self._pod_view(name, pod, aliases)
        present = frozenset(ref for ref in expect.gone if self.backend.get(ref) is not None)
        policies = {p.name: self.backend.get(ObjectRef("GpuSharingPolicy", p.name)) for p in expect.policies}
        domains = {d.name: self.backend.get(ObjectRef("ComputeDomain", d.name, scenario.namespace))
                   for d in expect.compute_domains}
        nodes_of = {alias: name for name, alias in aliases.items()}
        slices: dict[str, tuple[JsonObject, ...]] = {}
        if expect.slices or expect.device_taints:
            ours = [s for s in self.backend.resource_slices() if (s.get("spec") or {}).get("driver") == DRIVER_NAME]
            for alias in {e.node for e in expect.slices} | {e.node for e in expect.device_taints}:
                slices[alias] = tuple(s for s in ours if s["spec"].get("nodeName") == nodes_of.get(alias))
        nodes = {n.alias: self.backend.get(ObjectRef("Node", nodes_of[n.alias])) if n.alias in nodes_of else None
                 for n in expect.nodes}
        events = {f"Node/{n.alias}": tuple(self.backend.events(ObjectRef("Node", nodes_of[n.alias])))
                  for n in expect.nodes if (n.events.events or n.events.no_events) and n.alias in nodes_of}
        events.update({f"ResourceClaim/{c.name}": tuple(self.backend.events(
            ObjectRef("ResourceClaim", c.name, scenario.namespace))) for c in expect.claims})
        ready = {n.alias: self.backend.plugin_ready(nodes_of[n.alias])
                 for n in expect.nodes if n.plugin_ready is not None and n.alias in nodes_of}
        return Observation(pods=pods, present=present, policies=policies, compute_domains=domains, slices=slices,
                           nodes=nodes, events=events, plugin_ready=ready)

    def _compute_domain_support(self) -> str:
        """Why this cluster cannot run compute-domain scenarios ("" when it can): the ComputeDomain CRD (the
        controller's chart part) and the compute-domain driver's channel devices on some node (its kubelet plugin)."""
        try:
            crd = self.backend.get(ObjectRef("CustomResourceDefinition", "computedomains.gpu.dra.dev"))
            slices = self.backend.resource_slices()
        except BackendError as exc:
            return f"cannot tell whether the cluster serves ComputeDomains: {exc}"
        if crd is None:
            return ("the cluster has no ComputeDomain CRD (computedomains.gpu.dra.dev): install the chart with the "
                    "compute-domain controller (issue 24)")
        if not any((s.get("spec") or {}).get("driver") == COMPUTE_DOMAIN_DRIVER for s in slices):
            return (f"no node publishes {COMPUTE_DOMAIN_DRIVER} devices: the compute-domain kubelet plugin is not "
                    "running (issue 24; sandbox: nodes of the gb200-nvl72 preset)")
        return ""

    def _refused(self, obj: JsonObject, file_name: str, pattern: str) -> Failure | None:
        """None when applying `obj` is refused with a message matching `pattern` (nothing is created)."""
        where = f"applyFails.{file_name}"
        try:
            self.backend.apply(obj)
        except BackendError as exc:
            if re.search(pattern, str(exc), re.DOTALL):
                return None
            return Failure(where, f"a refusal matching {pattern!r}", repr(str(exc)))
        accepted = f"{obj['kind']}/{obj['metadata']['name']} was accepted"
        return Failure(where, f"a refusal matching {pattern!r}", accepted)

    def _pod_view(self, name: str, pod: JsonObject | None, aliases: Mapping[str, str]) -> PodView:
        if pod is None:
            return PodView(name, exists=False)
        phase = (pod.get("status") or {}).get("phase")
        node = (pod.get("spec") or {}).get("nodeName")
        message = self.backend.scheduling_message(pod) if phase in (None, "Pending") else ""
        containers: dict[str, ContainerView] = {}
        if phase in _STARTED_PHASES:
            for spec in (pod.get("spec") or {}).get("containers") or []:
                view = self.backend.container(pod, spec["name"])
                if view is not None:
                    containers[spec["name"]] = view
        return PodView(
            name,
            True,
            phase=phase,
            node=node,
            node_alias=aliases.get(node or ""),
            message=message,
            containers=containers,
        )

    # --- namespaces and cleanup ---------------------------------------------------------------------

    def _wait_gone(self, refs: Iterable[ObjectRef], deadline: float, what: str) -> None:
        pending = list(refs)
        while True:
            pending = [ref for ref in pending if self.backend.get(ref) is not None]
            if not pending:
                return
            if self.clock.monotonic() >= deadline:
                raise TimeoutError(f"timed out waiting for {what}: still there: {', '.join(map(str, pending))}")
            self.clock.sleep(self.backend.poll_interval)

    def _fresh_namespace(self, scenario: Scenario) -> None:
        """A namespace left by an interrupted run is deleted first, so every run starts clean."""
        ref = ObjectRef("Namespace", scenario.namespace)
        leftovers = [ref, *scenario.cluster_scoped()]
        if any(self.backend.get(r) is not None for r in leftovers):
            for r in leftovers:
                self.backend.delete(r)
            deadline = self.clock.monotonic() + self.config.cleanup_timeout
            self._wait_gone(leftovers, deadline, "the leftovers of an earlier run to go")
        self.backend.apply(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": scenario.namespace,
                    "labels": {**MANAGED_BY, "e2e.dra.dev/scenario": scenario.name},
                },
            }
        )

    def _reload_drivers(self, nodes: Iterable[str]) -> str:
        """Load the driver again where the scenario left it unloaded (a failed step): the claims on the node cannot
        be unprepared without it, so the namespace would never go, and the next scenario needs the node."""
        problems = []
        for node in nodes:
            try:
                if not self.backend.driver_of(node).loaded:
                    before, after = self.backend.change_driver(node, "load", None)
                    self._write(f"    cleanup: {node}: NVIDIA driver {before} -> {after}")
            except BackendError as exc:
                problems.append(f"loading the NVIDIA driver of {node} again: {exc}; ")
        return "".join(problems)

    def _cleanup(self, scenario: Scenario) -> str:
        """Delete the namespace (with everything in it) and the scenario's cluster-scoped objects; wait."""
        refs = [ObjectRef("Namespace", scenario.namespace), *scenario.cluster_scoped()]
        try:
            for ref in refs:
                self.backend.delete(ref)
            self._wait_gone(refs, self.clock.monotonic() + self.config.cleanup_timeout, "the scenario's objects to go")
        except (BackendError, TimeoutError) as exc:
            return str(exc)
        return ""


def format_result(result: ScenarioResult) -> str:
    line = f"{result.status}  {result.name}  ({result.steps_passed}/{result.steps} steps, {result.seconds:.1f}s)"
    return f"{line}\n      {result.detail}" if result.detail else line


def summary(results: Iterable[ScenarioResult]) -> tuple[str, int]:
    """(one summary line, exit code): non-zero when a scenario failed or when nothing ran at all."""
    results = list(results)
    counts = {s: sum(1 for r in results if r.status == s) for s in (PASS, FAIL, SKIP)}
    line = f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped"
    if counts[FAIL]:
        return line, 1
    if not counts[PASS]:
        return line + " (nothing ran)", 1
    return line, 0
