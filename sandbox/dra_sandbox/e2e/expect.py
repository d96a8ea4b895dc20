"""Check a step's expectations against one observation of the cluster. Pure: values in, failures out."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from dra_driver.slices.attributes import semver
from dra_sandbox.conditions import status_condition
from dra_sandbox.e2e.backend import ContainerView, PodView
from dra_sandbox.e2e.scenario import (
    ClaimExpect,
    ComputeDomainExpect,
    ContainerExpect,
    ContainerRef,
    DeviceTaintExpect,
    EventsExpect,
    Expectations,
    JsonObject,
    NodeExpect,
    ObjectRef,
    PodExpect,
    PolicyExpect,
    SliceExpect,
)

DevicesSeen = Mapping[ContainerRef, tuple[str, ...]]
_MESSAGE_CHARS = 400


@dataclass(frozen=True)
class Observation:
    pods: Mapping[str, PodView] = field(default_factory=dict)
    present: frozenset[ObjectRef] = frozenset()  # of the objects asked about, those that still exist
    policies: Mapping[str, JsonObject | None] = field(default_factory=dict)  # name -> the policy (None: absent)
    compute_domains: Mapping[str, JsonObject | None] = field(default_factory=dict)  # name -> the domain
    # node alias -> the driver's ResourceSlices on that node
    slices: Mapping[str, tuple[JsonObject, ...]] = field(default_factory=dict)
    nodes: Mapping[str, JsonObject | None] = field(default_factory=dict)  # node alias -> the Node (None: absent)
    # "Node/<alias>" or "ResourceClaim/<name>" -> the Events about it
    events: Mapping[str, tuple[JsonObject, ...]] = field(default_factory=dict)
    # node alias -> (ready, what /healthz said); None: not observable on this cluster
    plugin_ready: Mapping[str, tuple[bool, str] | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Failure:
    what: str  # the expectation's path, e.g. "pods.big-waiter.phase"
    want: str
    seen: str

    def __str__(self) -> str:
        return f"{self.what}: want {self.want}; saw {self.seen}"


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 1] + "…"


def _describe_pod(view: PodView) -> str:
    if not view.exists:
        return "no such pod"
    where = f" on {view.node}" + (f" (alias {view.node_alias})" if view.node_alias else "") if view.node else ""
    said = f"; message: {_short(view.message)!r}" if view.message else ""
    return f"phase {view.phase or 'unknown'}{where}{said}"


def _check_container(where: str, want: ContainerExpect, view: ContainerView | None) -> Failure | None:
    if view is None:
        return Failure(where, "a report of what the container saw", "none yet")
    devices = view.visible_devices
    if want.devices is not None and len(devices) != want.devices:
        return Failure(f"{where}.devices", f"{want.devices} device(s)", f"{len(devices)}: {list(devices)}")
    if want.uuid is not None:
        wrong = [d for d in devices if not d.startswith(want.uuid + "-")]
        if wrong or not devices:
            return Failure(f"{where}.uuid", f"only {want.uuid}-... UUIDs", f"{list(devices)}")
    for var, pattern in want.env.items():
        value = view.env.get(var)
        if value is None or not re.search(pattern, value):
            return Failure(f"{where}.env.{var}", f"a value matching {pattern!r}", repr(value) if value else "unset")
    for field_name, patterns, seen in (("deviceNodes", want.device_nodes, view.device_nodes),
                                       ("mounts", want.mounts, view.mounts)):
        for pattern in patterns:
            if seen is None:
                return Failure(f"{where}.{field_name}", f"one matching {pattern!r}",
                               "not observable here (the sandbox's kubelet records them; a cluster's log does not)")
            if not any(re.search(pattern, path) for path in seen):
                return Failure(f"{where}.{field_name}", f"one matching {pattern!r}", f"{list(seen)}")
    return None


def check_compute_domain(want: ComputeDomainExpect, domain: JsonObject | None) -> Failure | None:
    where = f"computeDomains.{want.name}"
    if domain is None:
        return Failure(f"{where}.status", want.status, "no such ComputeDomain")
    status = domain.get("status") or {}
    nodes = [n for n in status.get("nodes") or [] if isinstance(n, dict)]
    said = f"status {status.get('status') or 'unset'!r} with {len(nodes)} node(s): " + (
        ", ".join(f"{n.get('name')}={n.get('status')}" for n in nodes) or "none")
    if status.get("status") != want.status:
        return Failure(f"{where}.status", want.status, said)
    if want.nodes is not None and len(nodes) != want.nodes:
        return Failure(f"{where}.nodes", f"{want.nodes} node(s)", said)
    return None


def check_pod(want: PodExpect, view: PodView | None) -> Failure | None:
    where = f"pods.{want.name}"
    if view is None or not view.exists:
        return Failure(f"{where}.phase", want.phase, "no such pod")
    if view.phase != want.phase:
        return Failure(f"{where}.phase", want.phase, _describe_pod(view))
    if want.node is not None and view.node_alias != want.node:
        seen = f"{view.node} (alias {view.node_alias})" if view.node else "no node"
        return Failure(f"{where}.node", f"a node labelled alias {want.node}", seen)
    if want.message is not None and not re.search(want.message, view.message, re.DOTALL):
        return Failure(
            f"{where}.message",
            f"a match for {want.message!r}",
            repr(_short(view.message)) if view.message else "no message yet",
        )
    for name, container_want in want.containers.items():
        failure = _check_container(f"{where}.containers.{name}", container_want, view.containers.get(name))
        if failure is not None:
            return failure
    return None


def check_policy(want: PolicyExpect, policy: JsonObject | None) -> Failure | None:
    where = f"policies.{want.name}"
    if policy is None:
        return Failure(f"{where}.ready", want.ready, "no such policy")
    cond = status_condition(policy, "Ready")
    generation = (policy.get("metadata") or {}).get("generation")
    if cond is None or (policy.get("status") or {}).get("observedGeneration") != generation:
        return Failure(f"{where}.ready", want.ready, f"no Ready condition for generation {generation} yet")
    said = f"Ready={cond.get('status')} reason {cond.get('reason')!r}: {_short(str(cond.get('message') or ''))!r}"
    if cond.get("status") != want.ready:
        return Failure(f"{where}.ready", want.ready, said)
    if want.reason is not None and not re.search(want.reason, str(cond.get("reason") or "")):
        return Failure(f"{where}.reason", f"a match for {want.reason!r}", said)
    if want.message is not None and not re.search(want.message, str(cond.get("message") or ""), re.DOTALL):
        return Failure(f"{where}.message", f"a match for {want.message!r}", said)
    return None


# --- the node's NVIDIA driver (issue 26) -------------------------------------------------------------------------


def _devices(slices: tuple[JsonObject, ...]) -> list[JsonObject]:
    return [d for s in slices for d in (s.get("spec") or {}).get("devices") or () if isinstance(d, dict)]


def check_slices(want: SliceExpect, slices: tuple[JsonObject, ...]) -> Failure | None:
    where = f"slices.{want.node}"
    devices = _devices(slices)
    said = f"{len(slices)} slice(s) with {len(devices)} device(s)"
    if want.count is not None and len(slices) != want.count:
        return Failure(f"{where}.count", f"{want.count} slice(s)", said)
    if want.driver_version is not None:
        expected = semver(want.driver_version)
        versions = sorted({str(((d.get("attributes") or {}).get("driverVersion") or {}).get("version"))
                           for d in devices if "driverVersion" in (d.get("attributes") or {})})
        if versions != [expected]:
            seen = f"{said}; driverVersion {', '.join(versions) or 'on no device'}"
            return Failure(f"{where}.driverVersion", f"{expected} on every device that has one", seen)
    return None


def _first(names: list[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def check_device_taints(want: DeviceTaintExpect, slices: tuple[JsonObject, ...]) -> Failure | None:
    where = f"deviceTaints.{want.node}"
    devices = _devices(slices)
    if not devices:
        return Failure(where, f"published devices to look at for taint {want.key}", "no device published")
    tainted, wrong_effect = [], []
    for device in devices:
        taints = [t for t in device.get("taints") or () if isinstance(t, dict) and t.get("key") == want.key]
        if taints:
            tainted.append(str(device.get("name")))
            if want.effect is not None and all(t.get("effect") != want.effect for t in taints):
                wrong_effect.append(f"{device.get('name')}: {', '.join(str(t.get('effect')) for t in taints)}")
    if want.devices == "none":
        if tainted:
            return Failure(where, f"no device with taint {want.key}", f"{len(tainted)} of {len(devices)}: "
                           f"{_first(tainted)}")
        return None
    if len(tainted) != len(devices):
        untainted = [str(d.get("name")) for d in devices if str(d.get("name")) not in set(tainted)]
        return Failure(where, f"taint {want.key} on every device", f"{len(tainted)} of {len(devices)}; without it: "
                       f"{_first(untainted)}")
    if wrong_effect:
        return Failure(f"{where}.effect", f"effect {want.effect}", _short("; ".join(wrong_effect)))
    return None


def _events_said(events: tuple[JsonObject, ...]) -> str:
    return _short("; ".join(f"{e.get('reason')}: {e.get('message')}" for e in events)) or "no Events"


def check_events(where: str, want: EventsExpect, events: tuple[JsonObject, ...]) -> Failure | None:
    for reason, pattern in want.events.items():
        if not any(e.get("reason") == reason and re.search(pattern, str(e.get("message") or ""), re.DOTALL)
                   for e in events):
            return Failure(f"{where}.events.{reason}", f"an Event {reason} with a message matching {pattern!r}",
                           _events_said(events))
    for reason in want.no_events:
        found = tuple(e for e in events if e.get("reason") == reason)
        if found:
            return Failure(f"{where}.noEvents", f"no Event {reason}", _events_said(found))
    return None


def check_node(want: NodeExpect, node: JsonObject | None, events: tuple[JsonObject, ...],
               ready: tuple[bool, str] | None) -> Failure | None:
    where = f"nodes.{want.alias}"
    if node is None:
        return Failure(where, "the Node", "no such node")
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    for key, pattern in want.annotations.items():
        value = annotations.get(key)
        if value is None or not re.search(pattern, str(value), re.DOTALL):
            return Failure(f"{where}.annotations.{key}", f"a value matching {pattern!r}",
                           repr(_short(str(value))) if value is not None else "not set")
    failure = check_events(where, want.events, events)
    if failure is not None:
        return failure
    if want.plugin_ready is not None:
        if ready is None:
            return Failure(f"{where}.pluginReady", str(want.plugin_ready).lower(),
                           "not observable here (the sandbox asks each plugin's /healthz; a real cluster's pods are "
                           "not looked up)")
        if ready[0] != want.plugin_ready:
            return Failure(f"{where}.pluginReady", str(want.plugin_ready).lower(), _short(ready[1]))
    return None


def check_claim(want: ClaimExpect, events: tuple[JsonObject, ...]) -> Failure | None:
    return check_events(f"claims.{want.name}", want.events, events)


def devices_seen(observation: Observation, before: DevicesSeen) -> dict[ContainerRef, tuple[str, ...]]:
    """`before` updated with every container report in the observation (later steps may compare with it)."""
    seen = dict(before)
    for pod in observation.pods.values():
        for name, view in pod.containers.items():
            seen[ContainerRef(pod.name, name)] = view.visible_devices
    return seen


def _group_devices(
    where: str, group: tuple[ContainerRef, ...], seen: DevicesSeen
) -> tuple[list[tuple[ContainerRef, tuple[str, ...]]], Failure | None]:
    lists = []
    for ref in group:
        if ref not in seen:
            return [], Failure(where, f"a device list for {ref}", "none reported (yet)")
        lists.append((ref, seen[ref]))
    return lists, None


def evaluate(expect: Expectations, observation: Observation, before: DevicesSeen) -> list[Failure]:
    """Every unmet expectation, in the order the scenario lists them (an empty list: the step passed).

    `before` holds the device lists seen earlier in the scenario, so a group may name a container whose
    pod a previous step deleted ("the waiter got the holder's GPU").
    """
    failures: list[Failure] = []
    for pod_want in expect.pods:
        failure = check_pod(pod_want, observation.pods.get(pod_want.name))
        if failure is not None:
            failures.append(failure)
    seen = devices_seen(observation, before)
    for i, group in enumerate(expect.same_devices):
        where = f"sameDevices[{i}]"
        lists, failure = _group_devices(where, group, seen)
        if failure is None and len({devices for _, devices in lists}) != 1:
            failure = Failure(where, "identical device lists", ", ".join(f"{r}: {list(d)}" for r, d in lists))
        if failure is None and not lists[0][1]:
            failure = Failure(where, "identical, non-empty device lists", "no devices at all")
        if failure is not None:
            failures.append(failure)
    for i, group in enumerate(expect.distinct_devices):
        where = f"distinctDevices[{i}]"
        lists, failure = _group_devices(where, group, seen)
        if failure is None:
            owner: dict[str, ContainerRef] = {}
            for ref, devices in lists:
                clash = next((d for d in devices if d in owner), None)
                if clash is not None:
                    failure = Failure(where, "no device shared", f"{clash} seen by {owner[clash]} and {ref}")
                    break
                owner.update(dict.fromkeys(devices, ref))
        if failure is not None:
            failures.append(failure)
    for policy_want in expect.policies:
        failure = check_policy(policy_want, observation.policies.get(policy_want.name))
        if failure is not None:
            failures.append(failure)
    for domain_want in expect.compute_domains:
        failure = check_compute_domain(domain_want, observation.compute_domains.get(domain_want.name))
        if failure is not None:
            failures.append(failure)
    for slice_want in expect.slices:
        failure = check_slices(slice_want, observation.slices.get(slice_want.node, ()))
        if failure is not None:
            failures.append(failure)
    for taint_want in expect.device_taints:
        failure = check_device_taints(taint_want, observation.slices.get(taint_want.node, ()))
        if failure is not None:
            failures.append(failure)
    for node_want in expect.nodes:
        failure = check_node(node_want, observation.nodes.get(node_want.alias),
                             observation.events.get(f"Node/{node_want.alias}", ()),
                             observation.plugin_ready.get(node_want.alias))
        if failure is not None:
            failures.append(failure)
    for claim_want in expect.claims:
        failure = check_claim(claim_want, observation.events.get(f"ResourceClaim/{claim_want.name}", ()))
        if failure is not None:
            failures.append(failure)
    for obj in expect.gone:
        if obj in observation.present:
            failures.append(Failure(f"gone.{obj}", "the object deleted", "it still exists"))
    return failures
