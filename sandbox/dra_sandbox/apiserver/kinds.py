"""What individual kinds do differently from the generic rules (the apiserver's "strategies").

Kept to what clients observe: defaults the apiserver fills in, the status a new object starts with,
graceful pod deletion, namespace and CRD finalizers. Everything here mutates a freshly built object
that the caller owns; stored objects are never touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from .crds import established_status
from .registry import ResourceType

CORE: Final = ""
RESOURCE_GROUP: Final = "resource.k8s.io"
CRD_KEY: Final = ("apiextensions.k8s.io", "customresourcedefinitions")
NAMESPACE_KEY: Final = ("", "namespaces")
POD_KEY: Final = ("", "pods")
CLAIM_KEY: Final = ("resource.k8s.io", "resourceclaims")
NODE_KEY: Final = ("", "nodes")
EVENT_KEY: Final = ("", "events")
LEASE_KEY: Final = ("coordination.k8s.io", "leases")
POD_GROUP_KEY: Final = ("scheduling.k8s.io", "podgroups")
DEPLOYMENT_KEY: Final = ("apps", "deployments")
REPLICASET_KEY: Final = ("apps", "replicasets")
DAEMONSET_KEY: Final = ("apps", "daemonsets")
JOB_KEY: Final = ("batch", "jobs")

CRD_CLEANUP_FINALIZER: Final = "customresourcecleanup.apiextensions.k8s.io"
NAMESPACE_FINALIZER: Final = "kubernetes"
FOREGROUND_FINALIZER: Final = "foregroundDeletion"
ORPHAN_FINALIZER: Final = "orphan"
INITIAL_NAMESPACES: Final = ("default", "kube-system", "kube-public", "kube-node-lease")
PROTECTED_NAMESPACES: Final = frozenset({"default", "kube-system", "kube-public"})
DEFAULT_POD_GRACE_SECONDS: Final = 30


def timestamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


# Free-form JSON inside typed objects (RawExtension): kept byte-for-byte by the apiserver.
_RAW_FIELDS: Final = frozenset({"parameters", "data", "managedFields"})
# Map-typed fields (omitempty): an empty map does not survive a round trip. Other empty objects may
# be pointers to empty structs (`emptyDir: {}`, `subresources.status: {}`) and are kept.
_MAP_FIELDS: Final = frozenset({"labels", "annotations"})


def drop_empty(value: Any) -> Any:
    """Built-in kinds are Go structs: null fields, empty lists and empty label/annotation maps do not
    survive a round trip, so `labels: {}` or `nodeName: null` store (and compare) as absent."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            v = v if k in _RAW_FIELDS else drop_empty(v)
            if v is None or (v == [] and k not in _RAW_FIELDS) or (v == {} and k in _MAP_FIELDS):
                continue
            out[k] = v
        return out
    if isinstance(value, list):
        return [drop_empty(v) for v in value]
    return value


def _defaults_for_request(req: dict[str, Any]) -> None:
    mode = req.setdefault("allocationMode", "ExactCount") or "ExactCount"
    # pkg/apis/resource/v1/defaults.go: a count of 0 is Go's unset int64, defaulted like a missing one.
    if mode == "ExactCount" and req.get("count") in (None, 0):
        req["count"] = 1
    for tol in req.get("tolerations") or []:
        if isinstance(tol, dict) and not tol.get("operator"):
            tol["operator"] = "Equal"


def _default_claim_spec(spec: Any) -> None:
    if not isinstance(spec, dict):
        return
    devices = spec.get("devices")
    if not isinstance(devices, dict):
        return
    for req in devices.get("requests") or []:
        if not isinstance(req, dict):
            continue
        if isinstance(req.get("exactly"), dict):
            _defaults_for_request(req["exactly"])
        for sub in req.get("firstAvailable") or []:
            if isinstance(sub, dict):
                _defaults_for_request(sub)


def _default_pod(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", DEFAULT_POD_GRACE_SECONDS)
    spec.setdefault("dnsPolicy", "ClusterFirst")


def _default_workload(rt: ResourceType, obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    template = spec.get("template")
    if isinstance(template, dict):
        _default_pod(template)
    if rt.kind in ("Deployment", "ReplicaSet"):
        spec.setdefault("replicas", 1)
    if rt.kind == "Deployment":
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        spec.setdefault("strategy", {"type": "RollingUpdate",
                                     "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})
    if rt.kind == "DaemonSet":
        # SetDefaults_DaemonSet (pkg/apis/apps/v1/defaults.go).
        strategy = spec.setdefault("updateStrategy", {})
        if isinstance(strategy, dict):
            strategy.setdefault("type", "RollingUpdate")
            if strategy["type"] == "RollingUpdate":
                rolling = strategy.setdefault("rollingUpdate", {})
                if isinstance(rolling, dict):
                    rolling.setdefault("maxUnavailable", 1)
                    rolling.setdefault("maxSurge", 0)
        spec.setdefault("revisionHistoryLimit", 10)
    if rt.kind == "Job":
        parallelism = spec.setdefault("parallelism", 1)
        if "completions" not in spec and isinstance(parallelism, int):
            spec["completions"] = 1
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)


def _job_selector(obj: dict[str, Any]) -> None:
    """A Job selects its pods by its uid (`manualSelector` unset), as the apiserver's Job strategy sets it."""
    spec = obj.get("spec")
    if not isinstance(spec, dict) or spec.get("manualSelector"):
        return
    uid, name = str(obj["metadata"]["uid"]), str(obj["metadata"].get("name"))
    labels = {"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": name,
              "controller-uid": uid, "job-name": name}
    spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    template = spec.setdefault("template", {})
    if isinstance(template, dict):
        tmeta = template.setdefault("metadata", {})
        if isinstance(tmeta, dict):
            tmeta["labels"] = {**(tmeta.get("labels") or {}), **labels}


DEFAULT_TOLERATION_SECONDS = 300
NODE_NOT_READY_TAINT = "node.kubernetes.io/not-ready"
NODE_UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"


def _default_toleration_seconds(pod: dict[str, Any]) -> None:
    """The DefaultTolerationSeconds admission plugin (on by default; upstream
    `plugin/pkg/admission/defaulttolerationseconds/admission.go`): a new pod that does not tolerate the not-ready or
    unreachable NoExecute taint gets a 300 s toleration of it, so the kubelet admits it on a node that has them."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return
    tolerations = [t for t in spec.get("tolerations") or [] if isinstance(t, dict)]
    for key in (NODE_NOT_READY_TAINT, NODE_UNREACHABLE_TAINT):
        if any(t.get("key") in (key, "", None) and t.get("effect") in ("NoExecute", "", None) for t in tolerations):
            continue
        spec["tolerations"] = [*(spec.get("tolerations") or []), {
            "key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": DEFAULT_TOLERATION_SECONDS}]


def _default_taint_rule(obj: dict[str, Any], now: datetime) -> None:
    """A DeviceTaintRule's taint without `timeAdded` gets the time of the write (`SetDefaults_DeviceTaint` in
    kubernetes/kubernetes pkg/apis/resource/v1alpha3, v1beta2 and v1 defaults.go: the decoder defaults it)."""
    spec = obj.get("spec")
    taint = spec.get("taint") if isinstance(spec, dict) else None
    if isinstance(taint, dict) and not taint.get("timeAdded"):
        taint["timeAdded"] = timestamp(now)


def apply_defaults(rt: ResourceType, obj: dict[str, Any], now: datetime | None = None) -> None:
    """Fields the apiserver defaults while decoding (claim request counts, pod restart policy...)."""
    if rt.group == RESOURCE_GROUP and rt.kind == "DeviceTaintRule":
        _default_taint_rule(obj, now or datetime.now(UTC))
    elif rt.group == RESOURCE_GROUP and rt.kind == "ResourceClaim":
        _default_claim_spec(obj.get("spec"))
    elif rt.group == RESOURCE_GROUP and rt.kind == "ResourceClaimTemplate":
        inner = obj.get("spec")
        if isinstance(inner, dict):
            _default_claim_spec(inner.get("spec"))
    elif rt.key == POD_KEY:
        _default_pod(obj)
    elif rt.group in ("apps", "batch"):
        _default_workload(rt, obj)


def prepare_create(rt: ResourceType, obj: dict[str, Any], now: datetime) -> None:
    """Status and finalizers a new object starts with."""
    if rt.has_status and not rt.keep_status_on_create:
        obj.pop("status", None)
    if rt.key == NAMESPACE_KEY:
        spec = obj.setdefault("spec", {})
        finalizers = list(spec.get("finalizers") or [])
        if NAMESPACE_FINALIZER not in finalizers:
            finalizers.append(NAMESPACE_FINALIZER)
        spec["finalizers"] = finalizers
        obj["status"] = {"phase": "Active"}
    elif rt.key == POD_KEY:
        obj["status"] = {"phase": "Pending"}
        _default_toleration_seconds(obj)
    elif rt.group == "batch" and rt.kind == "Job":
        _job_selector(obj)
    elif rt.key == CRD_KEY:
        meta = obj["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if CRD_CLEANUP_FINALIZER not in finalizers:
            finalizers.append(CRD_CLEANUP_FINALIZER)
        meta["finalizers"] = finalizers
        obj["status"] = established_status(obj, now)


def prepare_update(rt: ResourceType, new: dict[str, Any], old: Mapping[str, Any], now: datetime) -> None:
    if rt.key == CRD_KEY:
        status = established_status(new, now)
        old_status = old.get("status") if isinstance(old.get("status"), Mapping) else {}
        assert isinstance(old_status, Mapping)
        stored = list(old_status.get("storedVersions") or [])
        for v in status["storedVersions"]:
            if v not in stored:
                stored.append(v)
        status["storedVersions"] = stored
        if isinstance(old_status.get("conditions"), list):
            status["conditions"] = old_status["conditions"]
        new["status"] = status


_POD_MUTABLE_MESSAGE: Final = (
    "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,"
    "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative); "
    "set spec.nodeName with the pods/binding subresource"
)


def _pod_spec_skeleton(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The pod spec minus what an update may change, for comparison."""
    out = {k: v for k, v in spec.items()
           if k not in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds", "schedulingGates")}
    for list_name in ("containers", "initContainers"):
        if isinstance(out.get(list_name), list):
            out[list_name] = [{k: v for k, v in c.items() if k != "image"} if isinstance(c, Mapping) else c
                              for c in out[list_name]]
    return out


def pod_update_problems(new: Mapping[str, Any], old: Mapping[str, Any]) -> str | None:
    """Why a pod update is refused (its spec is immutable but for a few fields), or None."""
    new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    if _pod_spec_skeleton(new_spec) != _pod_spec_skeleton(old_spec):
        return _POD_MUTABLE_MESSAGE
    old_tolerations = list(old_spec.get("tolerations") or [])
    if list(new_spec.get("tolerations") or [])[: len(old_tolerations)] != old_tolerations:
        return _POD_MUTABLE_MESSAGE
    old_gates = [g.get("name") for g in old_spec.get("schedulingGates") or [] if isinstance(g, Mapping)]
    if any(g.get("name") not in old_gates for g in new_spec.get("schedulingGates") or [] if isinstance(g, Mapping)):
        return "spec.schedulingGates: only deletion is allowed, but found new scheduling gates"
    return None


def pending_finalizers(rt: ResourceType, obj: Mapping[str, Any]) -> list[str]:
    """Everything that still holds a deleted object: metadata finalizers, plus a namespace's spec finalizers."""
    meta = obj.get("metadata") or {}
    out = list(meta.get("finalizers") or [])
    if rt.key == NAMESPACE_KEY:
        out += list((obj.get("spec") or {}).get("finalizers") or [])
    return out


def pod_grace_seconds(obj: Mapping[str, Any], requested: int | None) -> int:
    """Grace period for deleting a pod; 0 means remove now.

    As in Kubernetes: an unscheduled pod or one that already finished goes at once; a running pod
    keeps existing, marked with deletionTimestamp, until its kubelet confirms with gracePeriodSeconds=0.
    """
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
        return 0
    if requested is not None:
        return max(requested, 0)
    configured = spec.get("terminationGracePeriodSeconds")
    return int(configured) if isinstance(configured, int) and configured >= 0 else DEFAULT_POD_GRACE_SECONDS


def deletion_deadline(now: datetime, grace: int) -> str:
    return timestamp(now + timedelta(seconds=grace))


def drop_deallocated_status_devices(new: dict[str, Any], old: Mapping[str, Any]) -> None:
    """pkg/registry/resource/resourceclaim/strategy.go dropDeallocatedStatusDevices (the status strategy's
    PrepareForUpdate, before validation): entries for devices allocated in the old claim and no longer in the new
    one are removed, so that clients unaware of status.devices need not clean up after a deallocation. The
    DRAResourceClaimDeviceStatus gate is on by default in every version the sandbox reports (1.34-1.37)."""

    def results(obj: Mapping[str, Any]) -> set[tuple[str, str, str, str]]:
        alloc = (obj.get("status") or {}).get("allocation") if isinstance(obj.get("status"), Mapping) else None
        found = ((alloc or {}).get("devices") or {}).get("results") if isinstance(alloc, Mapping) else None
        return {(str(r.get("driver") or ""), str(r.get("pool") or ""), str(r.get("device") or ""),
                 str(r.get("shareID") or "")) for r in found or [] if isinstance(r, Mapping)}

    status = new.get("status")
    if not isinstance(status, dict) or not isinstance(status.get("devices"), list):
        return
    gone = results(old) - results(new)
    kept = [e for e in status["devices"] if not (isinstance(e, Mapping) and (
        str(e.get("driver") or ""), str(e.get("pool") or ""), str(e.get("device") or ""),
        str(e.get("shareID") or "")) in gone)]
    if kept:
        status["devices"] = kept
    else:
        status.pop("devices")



def prepare_status_update(rt: ResourceType, new: dict[str, Any], old: Mapping[str, Any]) -> None:
    """What a kind's status strategy changes before validation (PrepareForUpdate)."""
    if rt.key == CLAIM_KEY:
        drop_deallocated_status_devices(new, old)
