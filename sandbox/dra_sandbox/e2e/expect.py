"""Check a step's expectations against one observation of the cluster. Pure: values in, failures out."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from dra_sandbox.e2e.backend import ContainerView, PodView
from dra_sandbox.e2e.scenario import (
    ComputeDomainExpect,
    ContainerExpect,
    ContainerRef,
    Expectations,
    JsonObject,
    ObjectRef,
    PodExpect,
    PolicyExpect,
)

DevicesSeen = Mapping[ContainerRef, tuple[str, ...]]
_MESSAGE_CHARS = 400


@dataclass(frozen=True)
class Observation:
    pods: Mapping[str, PodView] = field(default_factory=dict)
    present: frozenset[ObjectRef] = frozenset()  # of the objects asked about, those that still exist
    policies: Mapping[str, JsonObject | None] = field(default_factory=dict)  # name -> the policy (None: absent)
    compute_domains: Mapping[str, JsonObject | None] = field(default_factory=dict)  # name -> the domain


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
    status = policy.get("status") or {}
    cond = next((c for c in status.get("conditions") or [] if isinstance(c, dict) and c.get("type") == "Ready"), None)
    generation = (policy.get("metadata") or {}).get("generation")
    if cond is None or status.get("observedGeneration") != generation:
        return Failure(f"{where}.ready", want.ready, f"no Ready condition for generation {generation} yet")
    said = f"Ready={cond.get('status')} reason {cond.get('reason')!r}: {_short(str(cond.get('message') or ''))!r}"
    if cond.get("status") != want.ready:
        return Failure(f"{where}.ready", want.ready, said)
    if want.reason is not None and not re.search(want.reason, str(cond.get("reason") or "")):
        return Failure(f"{where}.reason", f"a match for {want.reason!r}", said)
    if want.message is not None and not re.search(want.message, str(cond.get("message") or ""), re.DOTALL):
        return Failure(f"{where}.message", f"a match for {want.message!r}", said)
    return None


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
    for obj in expect.gone:
        if obj in observation.present:
            failures.append(Failure(f"gone.{obj}", "the object deleted", "it still exists"))
    return failures
