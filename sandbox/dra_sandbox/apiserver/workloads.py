"""Minimal but real Deployment, ReplicaSet and Job controllers (kube-controller-manager's, reduced).

- Deployment: one ReplicaSet per pod template (`<name>-<pod-template-hash>`, label `pod-template-hash`, owned by
  the Deployment as controller) sized to `spec.replicas`; ReplicaSets of older templates are scaled to 0 (a
  rollout replaces all pods at once, like `strategy: Recreate`, whatever the strategy says). Status:
  replicas, updatedReplicas, readyReplicas, availableReplicas, observedGeneration, `Available`/`Progressing`.
- ReplicaSet: keeps `spec.replicas` active pods (not finished, not being deleted) from its template, named
  `<rs>-<5 random>` with a controller ownerReference; extra pods are deleted, newest first. Status counts.
- Job: runs pods until `completions` succeeded (`parallelism` at a time, default 1/1), fails the Job with
  `BackoffLimitExceeded` once more than `backoffLimit` (default 6) pods failed (active ones are deleted).
  Pods keep the `batch.kubernetes.io/job-name` / `controller-uid` labels; finished pods stay, as on a cluster.
  Status: active, ready, succeeded, failed, startTime, completionTime, `Complete`/`Failed` conditions.
- DaemonSet: one pod per eligible node (nodeSelector, required node affinity, taints against tolerations, as
  kube-controller-manager's daemon controller decides it; the pure part is `daemonsets`), pinned with node
  affinity `matchFields metadata.name In [node]` and bound by the scheduler; node label or taint changes add and
  remove pods; RollingUpdate (maxUnavailable) or OnDelete on a template change; the status counters.

Pods are then scheduled and run by whatever plays scheduler and kubelet (the sandbox's); claim templates in
the pod template work as for any pod. Deletion cascades through ownerReferences via the garbage collector.
All work runs on the server's loop right after the write that triggered it, one pass over all workloads.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any, Final

from . import daemonsets as ds_rules
from . import errors, kinds
from .lifecycle import DeleteOptions, Resources, Target
from .registry import ResourceType
from .store import Obj, meta

Schedule = Callable[[Callable[[], None]], None]
ScheduleAfter = Callable[[float, Callable[[], None]], None]
TEMPLATE_HASH_LABEL: Final = "pod-template-hash"
JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"
JOB_UID_LABEL: Final = "batch.kubernetes.io/controller-uid"
DEFAULT_BACKOFF_LIMIT: Final = 6
_WATCHED: Final = frozenset({kinds.DEPLOYMENT_KEY, kinds.REPLICASET_KEY, kinds.JOB_KEY, kinds.DAEMONSET_KEY,
                             kinds.NODE_KEY, kinds.POD_KEY})


def template_hash(template: Any) -> str:
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()
    return "".join("bcdfghjklmnpqrstvwxz2456789"[int(digest[i:i + 2], 16) % 27] for i in range(0, 20, 2))


def _controller_uid(obj: Mapping[str, Any]) -> str | None:
    for ref in meta(obj).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return str(ref.get("uid"))
    return None


def _owner_ref(api_version: str, kind: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    m = meta(owner)
    return {"apiVersion": api_version, "kind": kind, "name": m.get("name"), "uid": m.get("uid"),
            "controller": True, "blockOwnerDeletion": True}


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _active(pod: Mapping[str, Any]) -> bool:
    return not meta(pod).get("deletionTimestamp") and _phase(pod) not in ("Succeeded", "Failed")


def _ready(pod: Mapping[str, Any]) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return _phase(pod) == "Running"


def _int(value: Any, default: int) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else default


class WorkloadController:
    def __init__(self, resources: Resources, schedule: Schedule, schedule_after: ScheduleAfter | None = None) -> None:
        self._res = resources
        self._schedule = schedule
        # A later pass (a DaemonSet's minReadySeconds: its pods become available without a write).
        self._schedule_after = schedule_after
        self._pending = False

    def on_change(self, rt: ResourceType, old: Obj | None, new: Obj | None) -> None:
        if rt.key not in _WATCHED or self._pending:
            return
        if rt.key == kinds.POD_KEY and _controller_uid(new or old or {}) is None:
            return
        if rt.key == kinds.NODE_KEY and not self._res.store.objects(kinds.DAEMONSET_KEY, None):
            return
        self._pending = True
        self._schedule(self.reconcile)

    # -- helpers ------------------------------------------------------------------------------

    def _rt(self, key: tuple[str, str]) -> ResourceType:
        rt = self._res.registry.by_key(key)
        assert rt is not None
        return rt

    def _owned(self, key: tuple[str, str], owner: Mapping[str, Any]) -> list[Obj]:
        uid = meta(owner).get("uid")
        namespace = str(meta(owner).get("namespace") or "")
        return [o for o in self._res.store.objects(key, namespace) if _controller_uid(o) == uid]

    def _set_status(self, key: tuple[str, str], obj: Obj, status: dict[str, Any]) -> None:
        if obj.get("status") == status:
            return

        def change(o: Obj) -> None:
            o["status"] = status

        self._res.mutate(self._rt(key), obj, change, status=True)

    def _delete(self, key: tuple[str, str], obj: Mapping[str, Any]) -> None:
        m = meta(obj)
        try:
            self._res.delete(Target(self._rt(key), "v1", str(m.get("namespace")), str(m.get("name"))),
                             DeleteOptions(uid=str(m.get("uid"))))
        except errors.ApiError as exc:
            if exc.code not in (404, 409):
                raise

    def _create_pod(self, owner: Obj, api_version: str, kind: str, extra_labels: Mapping[str, str],
                    template: Mapping[str, Any] | None = None) -> None:
        template = copy.deepcopy(dict(template) if template is not None else
                                 (owner.get("spec") or {}).get("template") or {})
        pod_meta = dict(template.get("metadata") or {})
        pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **extra_labels}
        pod_meta["generateName"] = f"{meta(owner).get('name')}-"
        pod_meta["ownerReferences"] = [_owner_ref(api_version, kind, owner)]
        pod_meta.pop("name", None)
        namespace = str(meta(owner).get("namespace"))
        pod_meta["namespace"] = namespace
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": template.get("spec") or {}}
        self._res.create(Target(self._rt(kinds.POD_KEY), "v1", namespace), body)

    # -- reconcile ----------------------------------------------------------------------------

    def reconcile(self) -> None:
        self._pending = False
        for work in (self._deployments, self._replicasets, self._jobs, self._daemonsets):
            try:
                work()
            except errors.ApiError:  # a race with a client write; the write's own event brings another pass
                continue

    def _deployments(self) -> None:
        for dep in self._res.store.objects(kinds.DEPLOYMENT_KEY, None):
            if meta(dep).get("deletionTimestamp"):
                continue
            spec = dep.get("spec") or {}
            replicas = _int(spec.get("replicas"), 1)
            template = spec.get("template") or {}
            phash = template_hash(template)
            name = f"{meta(dep).get('name')}-{phash}"
            owned = self._owned(kinds.REPLICASET_KEY, dep)
            current = next((rs for rs in owned if meta(rs).get("name") == name), None)
            if current is None:
                rs_template = copy.deepcopy(template)
                rs_labels = {**((rs_template.get("metadata") or {}).get("labels") or {}), TEMPLATE_HASH_LABEL: phash}
                rs_template.setdefault("metadata", {})["labels"] = rs_labels
                selector = copy.deepcopy(spec.get("selector") or {})
                selector.setdefault("matchLabels", {})[TEMPLATE_HASH_LABEL] = phash
                body = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                        "metadata": {"name": name, "namespace": meta(dep).get("namespace"), "labels": rs_labels,
                                     "ownerReferences": [_owner_ref("apps/v1", "Deployment", dep)]},
                        "spec": {"replicas": replicas, "selector": selector, "template": rs_template}}
                namespace = str(meta(dep).get("namespace"))
                current = self._res.create(Target(self._rt(kinds.REPLICASET_KEY), "v1", namespace), body).obj
            for rs in owned + ([current] if current not in owned else []):
                want = replicas if rs is current else 0
                if _int((rs.get("spec") or {}).get("replicas"), 1) != want:
                    def scale(o: Obj, want: int = want) -> None:
                        o["spec"]["replicas"] = want

                    self._res.mutate(self._rt(kinds.REPLICASET_KEY), rs, scale)
            self._deployment_status(dep, current, owned)

    def _deployment_status(self, dep: Obj, current: Obj, owned: list[Obj]) -> None:
        replicas = _int((dep.get("spec") or {}).get("replicas"), 1)
        pods = [p for rs in {meta(r).get("uid"): r for r in [*owned, current]}.values()
                for p in self._owned(kinds.POD_KEY, rs) if _active(p)]
        updated = [p for p in self._owned(kinds.POD_KEY, current) if _active(p)]
        ready = sum(1 for p in pods if _ready(p))
        now = kinds.timestamp(self._res.now())
        available = ready >= replicas
        old_conditions = {c.get("type"): c for c in (dep.get("status") or {}).get("conditions") or []}

        def condition(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
            prev = old_conditions.get(kind) or {}
            status = "True" if ok else "False"
            since = prev.get("lastTransitionTime") if prev.get("status") == status else now
            return {"type": kind, "status": status, "reason": reason, "message": message,
                    "lastUpdateTime": since, "lastTransitionTime": since}

        status: dict[str, Any] = {
            "observedGeneration": meta(dep).get("generation"),
            "replicas": len(pods), "updatedReplicas": len(updated), "readyReplicas": ready,
            "availableReplicas": ready, "unavailableReplicas": max(replicas - ready, 0),
            "conditions": [
                condition("Available", available, "MinimumReplicasAvailable" if available
                          else "MinimumReplicasUnavailable",
                          "Deployment has minimum availability." if available
                          else "Deployment does not have minimum availability."),
                condition("Progressing", True, "NewReplicaSetAvailable" if available else "ReplicaSetUpdated",
                          f'ReplicaSet "{meta(current).get("name")}" '
                          + ("has successfully progressed." if available else "is progressing.")),
            ],
        }
        self._set_status(kinds.DEPLOYMENT_KEY, dep, kinds.drop_empty({k: v for k, v in status.items() if v != 0}))

    def _owner_missing(self, obj: Obj) -> bool:
        for ref in meta(obj).get("ownerReferences") or []:
            if isinstance(ref, Mapping) and ref.get("controller") and ref.get("kind") == "Deployment":
                owner = self._res.store.get(kinds.DEPLOYMENT_KEY, str(meta(obj).get("namespace")), str(ref.get("name")))
                return owner is None or meta(owner).get("uid") != ref.get("uid") or bool(
                    meta(owner).get("deletionTimestamp"))
        return False

    def _replicasets(self) -> None:
        for rs in self._res.store.objects(kinds.REPLICASET_KEY, None):
            if meta(rs).get("deletionTimestamp") or self._owner_missing(rs):
                continue
            want = _int((rs.get("spec") or {}).get("replicas"), 1)
            pods = self._owned(kinds.POD_KEY, rs)
            active = [p for p in pods if _active(p)]
            for _ in range(want - len(active)):
                self._create_pod(rs, "apps/v1", "ReplicaSet", {})
            if len(active) > want:
                newest = sorted(active, key=lambda p: (str(meta(p).get("creationTimestamp")),
                                                       int(meta(p).get("resourceVersion") or 0)), reverse=True)
                for pod in newest[: len(active) - want]:
                    self._delete(kinds.POD_KEY, pod)
            active = [p for p in self._owned(kinds.POD_KEY, rs) if _active(p)]
            ready = sum(1 for p in active if _ready(p))
            status = {"replicas": len(active), "fullyLabeledReplicas": len(active), "readyReplicas": ready,
                      "availableReplicas": ready, "observedGeneration": meta(rs).get("generation")}
            self._set_status(kinds.REPLICASET_KEY, rs, {k: v for k, v in status.items() if v != 0 or k == "replicas"})

    def _jobs(self) -> None:
        for job in self._res.store.objects(kinds.JOB_KEY, None):
            if meta(job).get("deletionTimestamp"):
                continue
            status = dict(job.get("status") or {})
            conditions = list(status.get("conditions") or [])
            if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions):
                continue
            spec = job.get("spec") or {}
            completions = _int(spec.get("completions"), 1)
            parallelism = _int(spec.get("parallelism"), 1)
            backoff = _int(spec.get("backoffLimit"), DEFAULT_BACKOFF_LIMIT)
            pods = self._owned(kinds.POD_KEY, job)
            succeeded = sum(1 for p in pods if _phase(p) == "Succeeded")
            failed = sum(1 for p in pods if _phase(p) == "Failed")
            active = [p for p in pods if _active(p)]
            now = kinds.timestamp(self._res.now())
            status.setdefault("startTime", now)
            if failed > backoff:
                for pod in active:
                    self._delete(kinds.POD_KEY, pod)
                active = []
                conditions += _job_conditions(("FailureTarget", "Failed"), "BackoffLimitExceeded",
                                              "Job has reached the specified backoff limit", now)
            elif succeeded >= completions:
                status["completionTime"] = now
                conditions += _job_conditions(("SuccessCriteriaMet", "Complete"), "CompletionsReached",
                                              "Reached expected number of succeeded pods", now)
            else:
                want = min(parallelism, completions - succeeded)
                labels = {JOB_NAME_LABEL: str(meta(job).get("name")), JOB_UID_LABEL: str(meta(job).get("uid")),
                          "job-name": str(meta(job).get("name")), "controller-uid": str(meta(job).get("uid"))}
                for _ in range(want - len(active)):
                    self._create_pod(job, "batch/v1", "Job", labels)
                active = [p for p in self._owned(kinds.POD_KEY, job) if _active(p)]
            status.update({"active": len(active), "ready": sum(1 for p in active if _ready(p)),
                           "succeeded": succeeded, "failed": failed, "conditions": conditions})
            for k in ("active", "succeeded", "failed"):
                if status[k] == 0:
                    del status[k]
            self._set_status(kinds.JOB_KEY, job, kinds.drop_empty(status))

    def _daemonsets(self) -> None:
        sets = [d for d in self._res.store.objects(kinds.DAEMONSET_KEY, None) if not meta(d).get("deletionTimestamp")]
        if not sets:
            return
        nodes = self._res.store.objects(kinds.NODE_KEY, None)
        for daemon_set in sets:
            self._daemonset(daemon_set, nodes)

    def _daemonset(self, daemon_set: Obj, nodes: list[Obj]) -> None:
        """manage() then updateDaemonSetStatus() of pkg/controller/daemon/daemon_controller.go, one pass."""
        spec = daemon_set.get("spec") or {}
        revision = template_hash(spec.get("template") or {})
        template = ds_rules.pod_template_for(daemon_set, revision)
        by_node: dict[str, list[Obj]] = {}
        for owned_pod in self._owned(kinds.POD_KEY, daemon_set):
            by_node.setdefault(_pod_node(owned_pod), []).append(owned_pod)
        verdicts = {str(meta(n).get("name")): ds_rules.node_verdict(template.get("spec") or {}, n) for n in nodes}
        plans = {name: ds_rules.plan_node(v, by_node.get(name, [])) for name, v in verdicts.items()}
        # Pods on nodes that no longer exist: deleted, as upstream's (orphaned pods on deleted nodes) GC does.
        stray = [p for name, pods in by_node.items() if name and name not in verdicts for p in pods
                 if not meta(p).get("deletionTimestamp")]
        doomed: list[Mapping[str, Any]] = [*stray, *(p for plan in plans.values() for p in plan.delete)]
        for doomed_pod in doomed:
            self._delete(kinds.POD_KEY, doomed_pod)
        for name, plan in plans.items():
            if plan.create:
                pod_template = copy.deepcopy(template)
                ds_rules.pin_to_node(pod_template.setdefault("spec", {}), name)
                self._create_pod(daemon_set, "apps/v1", "DaemonSet", {}, pod_template)
        self._rolling_update(daemon_set, plans, revision)
        self._daemonset_status(daemon_set, verdicts, revision)

    def _rolling_update(self, daemon_set: Obj, plans: Mapping[str, ds_rules.NodePlan], revision: str) -> None:
        """update.go rollingUpdate, reduced (no surge): delete old-revision pods while fewer than maxUnavailable
        desired nodes lack an available pod; OnDelete leaves old pods until someone deletes them."""
        strategy = ((daemon_set.get("spec") or {}).get("updateStrategy") or {}).get("type") or "RollingUpdate"
        if strategy != "RollingUpdate":
            return
        desired = [plan for plan in plans.values() if plan.create or plan.pod is not None]
        min_ready = _int((daemon_set.get("spec") or {}).get("minReadySeconds"), 0)
        unavailable = sum(1 for plan in desired if plan.pod is None or not self._available(plan.pod, min_ready))
        budget = ds_rules.max_unavailable(daemon_set, len(desired)) - unavailable
        old = [plan.pod for plan in desired if plan.pod is not None
               and (meta(plan.pod).get("labels") or {}).get(ds_rules.REVISION_HASH_LABEL) != revision]
        # Unavailable old pods first (replacing them costs no availability), then the others up to the budget.
        old.sort(key=lambda p: self._available(p, min_ready))
        for pod in old:
            if not self._available(pod, min_ready):
                self._delete(kinds.POD_KEY, pod)
            elif budget > 0:
                budget -= 1
                self._delete(kinds.POD_KEY, pod)

    def _available(self, pod: Mapping[str, Any], min_ready_seconds: int) -> bool:
        """podutil.IsPodAvailable: Ready, and for at least minReadySeconds."""
        since = ds_rules.pod_ready_since(pod)
        if since is None:
            return False
        if min_ready_seconds <= 0:
            return True
        try:
            ready_at = ds_rules.parse_time(since)
        except ValueError:
            return False
        waited = (self._res.now() - ready_at).total_seconds()
        if waited < min_ready_seconds and self._schedule_after is not None:
            self._schedule_after(min_ready_seconds - waited + 0.1, self.reconcile)
        return waited >= min_ready_seconds

    def _daemonset_status(self, daemon_set: Obj, verdicts: Mapping[str, ds_rules.NodeVerdict],
                          revision: str) -> None:
        by_node: dict[str, list[Obj]] = {}
        for pod in self._owned(kinds.POD_KEY, daemon_set):
            if _active(pod):
                by_node.setdefault(_pod_node(pod), []).append(pod)
        min_ready = _int((daemon_set.get("spec") or {}).get("minReadySeconds"), 0)
        desired = current = misscheduled = ready = available = updated = 0
        for name, verdict in verdicts.items():
            pods = sorted(by_node.get(name, []), key=lambda p: str(meta(p).get("creationTimestamp") or ""))
            if not verdict.should_run:
                misscheduled += 1 if pods else 0
                continue
            desired += 1
            if not pods:
                continue
            current += 1
            pod = pods[0]
            if ds_rules.pod_ready_since(pod) is not None:
                ready += 1
                available += 1 if self._available(pod, min_ready) else 0
            if (meta(pod).get("labels") or {}).get(ds_rules.REVISION_HASH_LABEL) == revision:
                updated += 1
        status = ds_rules.DaemonStatus(desired, current, misscheduled, ready, available, updated)
        self._set_status(kinds.DAEMONSET_KEY, daemon_set, status.to_json(meta(daemon_set).get("generation")))


def _pod_node(pod: Mapping[str, Any]) -> str:
    """util.GetTargetNodeName: the node a daemon pod is for: its nodeName once bound, else the node its
    affinity pins it to."""
    name = (pod.get("spec") or {}).get("nodeName")
    if name:
        return str(name)
    affinity = (((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {})
    for term in (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []:
        for req in term.get("matchFields") or []:
            if req.get("key") == "metadata.name" and req.get("operator") == "In" and len(req.get("values") or []) == 1:
                return str(req["values"][0])
    return ""


def _job_conditions(types: tuple[str, ...], reason: str, message: str, now: str) -> list[dict[str, Any]]:
    """The Job controller's terminal conditions, set together: the interim one (FailureTarget,
    SuccessCriteriaMet), then the final one (Failed, Complete), with one reason and message."""
    return [{"type": t, "status": "True", "reason": reason, "message": message, "lastProbeTime": now,
             "lastTransitionTime": now} for t in types]
