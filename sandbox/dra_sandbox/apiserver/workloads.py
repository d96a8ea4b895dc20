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

from . import errors, kinds
from .lifecycle import DeleteOptions, Resources, Target
from .registry import ResourceType
from .store import Obj, meta

Schedule = Callable[[Callable[[], None]], None]
DEPLOYMENT_KEY: Final = ("apps", "deployments")
REPLICASET_KEY: Final = ("apps", "replicasets")
JOB_KEY: Final = ("batch", "jobs")
TEMPLATE_HASH_LABEL: Final = "pod-template-hash"
JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"
JOB_UID_LABEL: Final = "batch.kubernetes.io/controller-uid"
DEFAULT_BACKOFF_LIMIT: Final = 6
_WATCHED: Final = frozenset({DEPLOYMENT_KEY, REPLICASET_KEY, JOB_KEY, kinds.POD_KEY})


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
    def __init__(self, resources: Resources, schedule: Schedule) -> None:
        self._res = resources
        self._schedule = schedule
        self._pending = False

    def on_change(self, rt: ResourceType, old: Obj | None, new: Obj | None) -> None:
        if rt.key not in _WATCHED or self._pending:
            return
        if rt.key == kinds.POD_KEY and _controller_uid(new or old or {}) is None:
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

    def _delete(self, key: tuple[str, str], obj: Obj) -> None:
        m = meta(obj)
        try:
            self._res.delete(Target(self._rt(key), "v1", str(m.get("namespace")), str(m.get("name"))),
                             DeleteOptions(uid=str(m.get("uid"))))
        except errors.ApiError as exc:
            if exc.code not in (404, 409):
                raise

    def _create_pod(self, owner: Obj, api_version: str, kind: str, extra_labels: Mapping[str, str]) -> None:
        template = copy.deepcopy((owner.get("spec") or {}).get("template") or {})
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
        for work in (self._deployments, self._replicasets, self._jobs):
            try:
                work()
            except errors.ApiError:  # a race with a client write; the write's own event brings another pass
                continue

    def _deployments(self) -> None:
        for dep in self._res.store.objects(DEPLOYMENT_KEY, None):
            if meta(dep).get("deletionTimestamp"):
                continue
            spec = dep.get("spec") or {}
            replicas = _int(spec.get("replicas"), 1)
            template = spec.get("template") or {}
            phash = template_hash(template)
            name = f"{meta(dep).get('name')}-{phash}"
            owned = self._owned(REPLICASET_KEY, dep)
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
                current = self._res.create(Target(self._rt(REPLICASET_KEY), "v1", str(meta(dep).get("namespace"))),
                                           body).obj
            for rs in owned + ([current] if current not in owned else []):
                want = replicas if rs is current else 0
                if _int((rs.get("spec") or {}).get("replicas"), 1) != want:
                    def scale(o: Obj, want: int = want) -> None:
                        o["spec"]["replicas"] = want

                    self._res.mutate(self._rt(REPLICASET_KEY), rs, scale)
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
        self._set_status(DEPLOYMENT_KEY, dep, kinds.drop_empty({k: v for k, v in status.items() if v != 0}))

    def _owner_missing(self, obj: Obj) -> bool:
        for ref in meta(obj).get("ownerReferences") or []:
            if isinstance(ref, Mapping) and ref.get("controller") and ref.get("kind") == "Deployment":
                owner = self._res.store.get(DEPLOYMENT_KEY, str(meta(obj).get("namespace")), str(ref.get("name")))
                return owner is None or meta(owner).get("uid") != ref.get("uid") or bool(
                    meta(owner).get("deletionTimestamp"))
        return False

    def _replicasets(self) -> None:
        for rs in self._res.store.objects(REPLICASET_KEY, None):
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
            self._set_status(REPLICASET_KEY, rs, {k: v for k, v in status.items() if v != 0 or k == "replicas"})

    def _jobs(self) -> None:
        for job in self._res.store.objects(JOB_KEY, None):
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
                conditions += [
                    {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded",
                     "message": "Job has reached the specified backoff limit", "lastProbeTime": now,
                     "lastTransitionTime": now},
                    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                     "message": "Job has reached the specified backoff limit", "lastProbeTime": now,
                     "lastTransitionTime": now}]
            elif succeeded >= completions:
                status["completionTime"] = now
                conditions += [
                    {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached",
                     "message": "Reached expected number of succeeded pods", "lastProbeTime": now,
                     "lastTransitionTime": now},
                    {"type": "Complete", "status": "True", "reason": "CompletionsReached",
                     "message": "Reached expected number of succeeded pods", "lastProbeTime": now,
                     "lastTransitionTime": now}]
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
            self._set_status(JOB_KEY, job, kinds.drop_empty(status))
