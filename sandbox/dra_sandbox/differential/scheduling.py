"""Part (b): the scheduling corpus on one target, batch by batch, and each pod's verdict.

A batch holds up to `batch_size` cases; each case gets one node per shape (`n-<case>-<shape>`) with that shape's
ResourceSlices, its claims (`<case>-<shape>-<claim>`) and one pod (`p-<case>-<shape>`) pinned to that node by
`nodeSelector`. Every node of a batch exists while it is scheduled, so the FitError counts (`0/N nodes are
available: ...`) are the same on both sides; the batch is then deleted before the next one starts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_sandbox.polling import wait_for
from dra_sandbox.rest import merge_patch

from .corpus import ADMIN_NAMESPACE, NAMESPACE, Case, batches
from .fleet import SHAPE_NAMES, Fleet, classes
from .targets import PodKey, Target

RESOURCE: Final = "/apis/resource.k8s.io/v1"
ADMIN_LABEL: Final = "resource.kubernetes.io/admin-access"
NOT_READY_TAINTS: Final = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
HOSTNAME: Final = "kubernetes.io/hostname"
TIMEOUT_S: Final = 60.0


@dataclass(frozen=True)
class Verdict:
    case: str
    shape: str
    created: Mapping[str, str]  # claim or "pod" -> "ok" or the refusal (code reason [fields])
    node: str | None  # "<node>" when bound to its node, another name would be a harness bug
    allocations: Mapping[str, Any]  # pod claim name (or "extended") -> the allocation, node names as <node>
    message: str  # the PodScheduled condition's message
    events: tuple[str, ...]  # FailedScheduling notes, oldest first
    # object -> the refusal's message (reported, not compared)
    refusals: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.case}@{self.shape}"

    def compared(self) -> dict[str, Any]:
        """What must agree between the two sides."""
        return {"created": dict(self.created), "node": self.node, "allocations": dict(self.allocations),
                "message": self.message, "event": self.events[-1] if self.events else ""}


def refusal(exc: ApiError) -> str:
    body = exc.body or {}
    details = body.get("details") if isinstance(body.get("details"), dict) else {}
    fields = sorted({str(c.get("field", "")) for c in (details or {}).get("causes") or [] if isinstance(c, dict)})
    return f"{exc.status} {body.get('reason', '')} {fields}".strip()


def _names(case: Case, shape: str) -> tuple[str, str]:
    return f"n-{case.id}-{shape}", f"p-{case.id}-{shape}"


def claim_name(case: Case, shape: str, claim: str) -> str:
    return f"{case.id}-{shape}-{claim}"


def pod_object(case: Case, shape: str) -> JsonObject:
    node, pod = _names(case, shape)
    container: JsonObject = {"name": "c", "image": "busybox"}
    resources: JsonObject = {}
    if case.claims:
        resources["claims"] = [{"name": name} for name, _ in case.claims]
    if case.extended:
        resources["limits"] = dict(case.extended)
    if resources:
        container["resources"] = resources
    spec: JsonObject = {"containers": [container], "nodeSelector": {HOSTNAME: node},
                        "terminationGracePeriodSeconds": 0, "automountServiceAccountToken": False}
    if case.claims:
        spec["resourceClaims"] = [{"name": name, "resourceClaimName": claim_name(case, shape, name)}
                                  for name, _ in case.claims]
    if case.tolerations:
        spec["tolerations"] = [dict(t) for t in case.tolerations]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "namespace": case.namespace}, "spec": spec}


def _normalize(value: Any, node: str) -> Any:
    if isinstance(value, str):
        return "<node>" if value == node else value
    if isinstance(value, list):
        return [_normalize(v, node) for v in value]
    if isinstance(value, dict):
        return {k: ("<share>" if k == "shareID" else _normalize(v, node)) for k, v in value.items()}
    return value


def _allocation(claim: JsonObject | None, node: str) -> Any:
    if claim is None:
        return None
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return None
    allocation = {k: v for k, v in allocation.items() if k != "allocationTimestamp"}
    return _normalize(allocation, node)


class Run:
    """The corpus on one target."""

    def __init__(self, target: Target, fleet: Fleet, say: Callable[[str], None] = lambda _: None) -> None:
        self.target = target
        self.rest: KubeRest = target.rest
        self.fleet = fleet
        self.say = say

    def prepare(self) -> None:
        for namespace, labels in ((NAMESPACE, {}), (ADMIN_NAMESPACE, {ADMIN_LABEL: "true"})):
            self.rest.request("POST", "/api/v1/namespaces", body={
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}})
            self.target.namespace_ready(namespace)
        for obj in classes():
            self.rest.request("POST", f"{RESOURCE}/deviceclasses", body=obj)

    def run(self, cases: Sequence[Case], batch_size: int) -> list[Verdict]:
        verdicts: list[Verdict] = []
        for number, batch in enumerate(batches(cases, batch_size)):
            self.say(f"{self.target.name}: batch {number} ({len(batch)} cases)")
            verdicts.extend(self._batch(batch))
        return verdicts

    # --- one batch -------------------------------------------------------------------------------------------
    def _nodes(self, batch: Sequence[Case]) -> list[tuple[str, str]]:
        return [(_names(case, shape)[0], shape) for case in batch for shape in SHAPE_NAMES]

    def _create_nodes(self, nodes: Sequence[tuple[str, str]]) -> None:
        for name, shape in nodes:
            self.rest.request("POST", "/api/v1/nodes", body=self.fleet.node(name, shape))
            merge_patch(self.rest, f"/api/v1/nodes/{name}/status", {"status": self.fleet.node_status(name)})
        self.target.nodes_created([name for name, _ in nodes])
        for name, shape in nodes:
            wanted = self.fleet.node(name, shape).get("spec", {}).get("taints", [])
            # kube-apiserver's TaintNodesByCondition admission puts not-ready on every new Node; a kubelet's Ready
            # status makes the node lifecycle controller lift it. Lifted here for both sides alike.
            def lifted(name: str = name, wanted: Any = wanted) -> bool:
                obj = self.rest.request("GET", f"/api/v1/nodes/{name}")
                taints = (obj.get("spec") or {}).get("taints") or []
                if any(t.get("key") in NOT_READY_TAINTS for t in taints):
                    keep = [t for t in taints if t.get("key") not in NOT_READY_TAINTS]
                    with contextlib.suppress(ApiError):  # a conflict with the controller: look again
                        self.rest.request("PATCH", f"/api/v1/nodes/{name}", body=[
                            {"op": "test", "path": "/metadata/resourceVersion",
                             "value": obj["metadata"]["resourceVersion"]},
                            {"op": "replace", "path": "/spec/taints", "value": keep}],
                            content_type="application/json-patch+json")
                    return False
                return bool([{k: t[k] for k in ("key", "value", "effect") if k in t} for t in taints] == wanted)

            wait_for(lifted, TIMEOUT_S, f"node {name} without the not-ready taint", interval=0.2)
        for name, shape in nodes:
            for obj in self.fleet.slices(name, shape):
                self.rest.request("POST", f"{RESOURCE}/resourceslices", body=obj)

    def _batch(self, batch: Sequence[Case]) -> list[Verdict]:
        nodes = self._nodes(batch)
        self._create_nodes(nodes)
        created: dict[str, dict[str, str]] = {}
        refusals: dict[str, dict[str, str]] = {}
        pods: list[PodKey] = []
        for case in batch:
            for shape in SHAPE_NAMES:
                key = f"{case.id}@{shape}"
                created[key], refusals[key] = {}, {}
                for name, spec in case.claims:
                    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                            "metadata": {"name": claim_name(case, shape, name), "namespace": case.namespace},
                            "spec": spec}
                    self._create(f"{RESOURCE}/namespaces/{case.namespace}/resourceclaims", body, name,
                                 created[key], refusals[key])
        for case in batch:
            for shape in SHAPE_NAMES:
                key = f"{case.id}@{shape}"
                pod = pod_object(case, shape)
                made = self._create(f"/api/v1/namespaces/{case.namespace}/pods", pod, "pod", created[key],
                                    refusals[key])
                # A pod whose claim was refused never gets a verdict from kube-scheduler (its DynamicResources
                # PreEnqueue holds it back: no condition, no Event), so nothing waits for one.
                if made and all(created[key].get(name) == "ok" for name, _ in case.claims):
                    pods.append((case.namespace, pod["metadata"]["name"]))
        self.target.schedule(pods)
        verdicts = self._collect(batch, created, refusals)
        self._delete(batch, nodes)
        return verdicts

    def _create(self, path: str, body: JsonObject, what: str, created: dict[str, str],
                refusals: dict[str, str]) -> bool:
        try:
            self.rest.request("POST", path, body=body)
        except ApiError as exc:
            created[what] = refusal(exc)
            refusals[what] = str((exc.body or {}).get("message", exc))
            return False
        created[what] = "ok"
        return True

    def _events(self, namespace: str) -> dict[str, list[str]]:
        """FailedScheduling notes per pod, oldest first (events.k8s.io/v1: kube-scheduler's recorder)."""
        items = self.rest.request("GET", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events").get("items") or []
        notes: dict[str, list[tuple[str, str]]] = {}
        for event in items:
            if event.get("reason") != "FailedScheduling":
                continue
            regarding = event.get("regarding") or {}
            series = event.get("series") or {}
            when = str(series.get("lastObservedTime") or event.get("eventTime") or "")
            notes.setdefault(str(regarding.get("name", "")), []).append((when, str(event.get("note", ""))))
        return {pod: [note for _, note in sorted(found)] for pod, found in notes.items()}

    def _collect(self, batch: Sequence[Case], created: Mapping[str, dict[str, str]],
                 refusals: Mapping[str, dict[str, str]]) -> list[Verdict]:
        events: dict[str, dict[str, list[str]]] = {}
        for namespace in sorted({case.namespace for case in batch}):
            pending = []
            for case in batch:
                if case.namespace != namespace:
                    continue
                for shape in SHAPE_NAMES:
                    node, pod_name = _names(case, shape)
                    pod = self.rest.get(f"/api/v1/namespaces/{namespace}/pods/{pod_name}")
                    conditions = (pod or {}).get("status", {}).get("conditions") or []
                    if pod is not None and not (pod.get("spec") or {}).get("nodeName") and any(
                            c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conditions):
                        pending.append(pod_name)

            # kube-scheduler's event broadcaster writes asynchronously: wait until every pending pod has one.
            def seen(namespace: str = namespace, pending: list[str] = pending) -> dict[str, list[str]] | None:
                found = self._events(namespace)
                return found if all(p in found for p in pending) else None

            try:
                events[namespace] = wait_for(seen, self.target.event_wait_s,
                                             "a FailedScheduling Event for every pending pod", interval=0.5)
            except TimeoutError:
                events[namespace] = self._events(namespace)
        verdicts = []
        for case in batch:
            for shape in SHAPE_NAMES:
                node, pod_name = _names(case, shape)
                key = f"{case.id}@{shape}"
                pod = self.rest.get(f"/api/v1/namespaces/{case.namespace}/pods/{pod_name}") or {}
                bound = (pod.get("spec") or {}).get("nodeName")
                message = " ".join(str(c.get("message", "")) for c in (pod.get("status") or {}).get("conditions") or []
                                   if c.get("type") == "PodScheduled" and c.get("status") == "False")
                allocations: dict[str, Any] = {}
                for name, _ in case.claims:
                    if created[key].get(name) == "ok":
                        claim = self.rest.get(f"{RESOURCE}/namespaces/{case.namespace}/resourceclaims/"
                                              f"{claim_name(case, shape, name)}")
                        allocations[name] = _allocation(claim, node)
                extended = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
                if extended.get("resourceClaimName"):
                    claim = self.rest.get(f"{RESOURCE}/namespaces/{case.namespace}/resourceclaims/"
                                          f"{extended['resourceClaimName']}")
                    allocations["extended"] = {"allocation": _allocation(claim, node),
                                               "requestMappings": extended.get("requestMappings")}
                verdicts.append(Verdict(
                    case.id, shape, dict(created[key]), None if not bound else ("<node>" if bound == node else bound),
                    allocations, message, tuple(events.get(case.namespace, {}).get(pod_name, [])),
                    dict(refusals[key])))
        return verdicts

    def _delete(self, batch: Sequence[Case], nodes: Sequence[tuple[str, str]]) -> None:
        for case in batch:
            for shape in SHAPE_NAMES:
                _, pod_name = _names(case, shape)
                with contextlib.suppress(ApiError):
                    self.rest.request("DELETE", f"/api/v1/namespaces/{case.namespace}/pods/{pod_name}",
                                      query={"gracePeriodSeconds": 0})
                for name, _ in case.claims:
                    with contextlib.suppress(ApiError):
                        self.rest.request("DELETE", f"{RESOURCE}/namespaces/{case.namespace}/resourceclaims/"
                                          f"{claim_name(case, shape, name)}")
        names = [name for name, _ in nodes]
        for name in names:
            with contextlib.suppress(ApiError):
                self.rest.request("DELETE", f"{RESOURCE}/resourceslices",
                                  query={"fieldSelector": f"spec.nodeName={name}"})
            with contextlib.suppress(ApiError):
                self.rest.request("DELETE", f"/api/v1/nodes/{name}")
        self.target.nodes_deleted(names)
        gone = set(names)
        wait_for(lambda: not gone & {n["metadata"]["name"] for n in
                                     self.rest.request("GET", "/api/v1/nodes").get("items") or []},
                 TIMEOUT_S, "the batch's nodes to be gone", interval=0.2)
        wait_for(lambda: not any((s.get("spec") or {}).get("nodeName") in gone for s in
                                 self.rest.request("GET", f"{RESOURCE}/resourceslices").get("items") or []),
                 TIMEOUT_S, "the batch's slices to be gone", interval=0.2)
