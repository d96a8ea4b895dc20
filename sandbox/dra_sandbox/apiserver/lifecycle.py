"""The semantics of each verb on one resource (the apiserver's generic registry), free of HTTP.

Create, update, patch and delete follow Kubernetes' rules for server-set metadata, optimistic
concurrency (409 on a stale resourceVersion), generation, the status subresource, finalizers and
deletion. Controllers (garbage collection, namespace and CRD cleanup) observe every write through
`ChangeListener`s and act through these same methods.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import secrets
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Protocol

from . import conversion, errors, kinds, patch
from .labelselector import LabelSelector
from .registry import Registry, ResourceType
from .selectors import FieldSelector
from .store import Obj, Store, TooOldError, meta
from .validation.adminaccess import admin_access_spec_errors, admin_access_status_errors
from .validation.admission import WARN, Admission
from .validation.fielderrors import FORBIDDEN, INVALID, FieldError
from .webhooks import ValidatingWebhooks

_CLAIM_TEMPLATE_KEY: Final = ("resource.k8s.io", "resourceclaimtemplates")

MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
STRATEGIC_PATCH: Final = "application/strategic-merge-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"
# The apiserver's limit on one JSON patch (maxJSONPatchOperations, k8s.io/apiserver handlers/patch.go).
MAX_JSON_PATCH_OPERATIONS: Final = 10000
# etcd's default --max-request-bytes: a larger object fails in storage, after admission and validation.
ETCD_MAX_REQUEST_BYTES: Final = 1536 * 1024

_GENERATE_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"  # the apiserver's: no vowels, no look-alikes
_SERVER_META: Final = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation")


@dataclass(frozen=True)
class Target:
    """One addressed resource: `name`/`namespace` empty for collections, `subresource` "" or one served."""

    rt: ResourceType
    version: str
    namespace: str = ""
    name: str = ""
    subresource: str = ""


@dataclass(frozen=True)
class WriteOptions:
    dry_run: bool = False
    field_validation: str = WARN


@dataclass(frozen=True)
class DeleteOptions:
    propagation: str | None = None  # Orphan, Background, Foreground
    grace_period: int | None = None
    uid: str | None = None  # preconditions
    resource_version: str | None = None
    dry_run: bool = False


@dataclass
class Result:
    obj: Obj
    warnings: list[str] = field(default_factory=list)
    removed: bool = False  # a DELETE took the object out of storage


@dataclass(frozen=True)
class ListResult:
    items: list[Obj]
    resource_version: int
    continue_token: str = ""
    remaining: int | None = None


def accepted_patch_types(rt: ResourceType) -> tuple[str, ...]:
    """The patch content types the apiserver serves for `rt`, in its order: strategic merge for built-in kinds
    only (apiextensions-apiserver's CR handler leaves it out), apply-patch+cbor only behind the alpha
    CBORServingAndStorage gate, which is off (k8s.io/apiserver endpoints/installer.go)."""
    if rt.custom:
        return (JSON_PATCH, MERGE_PATCH, APPLY_PATCH)
    return (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, APPLY_PATCH)


class ChangeListener(Protocol):
    def on_change(self, rt: ResourceType, old: Obj | None, new: Obj | None) -> None: ...


Clock = Callable[[], datetime]


def render(obj: Mapping[str, Any], rt: ResourceType, version: str) -> Obj:
    """The object as served at one version (apiVersion/kind set; storage is version-agnostic)."""
    out = conversion.from_storage(rt.group, rt.kind, version, dict(obj))
    out["apiVersion"] = rt.api_version(version)
    out["kind"] = rt.kind
    return out


def _comparable(obj: Mapping[str, Any]) -> Obj:
    """The object minus fields that change on every write, to detect no-op updates."""
    out = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    m = {k: v for k, v in meta(obj).items() if k not in ("resourceVersion", "managedFields")}
    out["metadata"] = m
    return out


def _spec_part(rt: ResourceType, obj: Mapping[str, Any]) -> Obj:
    skip = {"metadata", "apiVersion", "kind"} | ({"status"} if rt.has_status else set())
    return {k: v for k, v in obj.items() if k not in skip}


# Texts of k8s.io/apiserver pkg/storage/etcd3/store.go (expired, inconsistentContinue).
LIST_EXPIRED: Final = "The resourceVersion for the provided list is too old."
CONTINUE_EXPIRED: Final = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new list "
    "without the continue parameter, or use the continue token in this response to retrieve the remainder of the "
    "results. Continuing with the provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may show up in the list.")
LATEST_CONTINUE: Final = -1  # a continue token's revision meaning "the latest", as the apiserver encodes it


def encode_continue(resource_version: int, last_key: tuple[str, str]) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": resource_version, "after": list(last_key)})
    return base64.urlsafe_b64encode(raw.encode()).decode()


def decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        namespace, name = data["after"]
        return int(data["rv"]), (str(namespace), str(name))
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise errors.bad_request(f"invalid continue token: continue key is not valid: {exc}") from exc


class Resources:
    def __init__(self, store: Store, registry: Registry, admission: Admission, clock: Clock) -> None:
        self.store = store
        self.registry = registry
        self._admission = admission
        self._clock = clock
        self._listeners: list[ChangeListener] = []
        self.webhooks: ValidatingWebhooks | None = None  # called on create/update when set

    def add_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    def _notify(self, rt: ResourceType, old: Obj | None, new: Obj | None) -> None:
        for listener in self._listeners:
            listener.on_change(rt, old, new)

    def now(self) -> datetime:
        return self._clock()

    # -- reads ------------------------------------------------------------------------------

    def get(self, t: Target) -> Obj:
        obj = self.store.get(t.rt.key, t.namespace, t.name)
        if obj is None:
            raise errors.not_found(t.rt.plural, t.rt.group, t.name)
        return obj

    def list_objects(self, t: Target, labels: LabelSelector, fields: FieldSelector, limit: int | None = None,
                     continue_token: str | None = None, *, exact_version: int | None = None) -> ListResult:
        """One page of a list. Without a version it reads the latest state; `exact_version`
        (resourceVersionMatch=Exact) and a continue token read the state at their revision, as etcd does,
        and fail with 410 Expired once the history back to it is gone (etcd3/store.go interpretListError)."""
        rv = self.store.resource_version
        after: tuple[str, str] | None = None
        at: int | None = exact_version
        if continue_token:
            token_rv, after = decode_continue(continue_token)
            at = None if token_rv == LATEST_CONTINUE else token_rv
        if at is None:
            source = self.store.objects(t.rt.key, t.namespace or None)
        else:
            try:
                source = [o for o in self.store.snapshot(t.rt.key, at)
                          if not t.namespace or meta(o).get("namespace") == t.namespace]
            except TooOldError:
                if after is None:
                    raise errors.expired(LIST_EXPIRED) from None
                # The apiserver offers a token that continues from the same key at the latest revision.
                raise errors.expired(CONTINUE_EXPIRED,
                                     list_meta={"continue": encode_continue(LATEST_CONTINUE, after)}) from None
            rv = at
        items = [o for o in source
                 if labels.matches(meta(o).get("labels")) and fields.matches(o, t.rt.field_labels)]
        if after is not None:
            items = [o for o in items if _okey(o) > after]
        if limit and limit > 0 and len(items) > limit:
            page = items[:limit]
            return ListResult(page, rv, encode_continue(rv, _okey(page[-1])), len(items) - limit)
        return ListResult(items, rv)

    # -- create -----------------------------------------------------------------------------

    def create(self, t: Target, body: Any, opts: WriteOptions = WriteOptions()) -> Result:
        rt = t.rt
        obj = self._decode(t, body)
        if rt.terminating:
            raise errors.method_not_allowed("create not allowed while custom resource definition is terminating")
        m = obj.setdefault("metadata", {})
        if not isinstance(m, dict):
            raise errors.bad_request("metadata must be an object")
        if rt.namespaced:
            ns = m.get("namespace") or t.namespace
            if t.namespace and ns != t.namespace:
                raise errors.bad_request("the namespace of the provided object does not match the namespace sent "
                                         "on the request")
            m["namespace"] = ns
            self._check_namespace_open(rt, str(ns), str(m.get("name") or m.get("generateName") or ""))
        else:
            m.pop("namespace", None)
        if not m.get("name") and m.get("generateName"):
            m["name"] = self._generate_name(rt, str(m.get("namespace") or ""), str(m["generateName"]))
        for f in (*_SERVER_META, "resourceVersion", "selfLink", "managedFields"):
            m.pop(f, None)
        m["uid"] = str(uuid.uuid4())
        m["creationTimestamp"] = kinds.timestamp(self.now())
        m["generation"] = 1
        kinds.apply_defaults(rt, obj, self.now())
        kinds.prepare_create(rt, obj, self.now())
        obj, warnings = self._admission.prune(rt, obj, opts.field_validation, decoded_as=t.version)
        self._admission.validate_create(rt, obj)
        self._check_admin_access(rt, obj, None)
        self._call_webhooks(t, "CREATE", obj, None, opts)
        name = str(obj["metadata"]["name"])
        if self.store.get(rt.key, str(obj["metadata"].get("namespace") or ""), name) is not None:
            raise errors.already_exists(rt.plural, rt.group, name)
        if opts.dry_run:
            return Result(obj, warnings)
        _check_storable(obj)
        stored = self.store.insert(rt.key, obj)
        self._notify(rt, None, stored)
        return Result(stored, warnings)

    def _call_webhooks(self, t: Target, operation: str, obj: Obj, old: Obj | None, opts: WriteOptions) -> None:
        if self.webhooks is not None:
            self.webhooks.admit(t.rt, t.version, operation, render(obj, t.rt, t.version),
                                None if old is None else render(old, t.rt, t.version), dry_run=opts.dry_run)

    def _check_admin_access(self, rt: ResourceType, obj: Obj, old: Obj | None) -> None:
        """A request (or a status granting it) for admin access only in a labelled namespace (adminaccess.py)."""
        if rt.key not in (kinds.CLAIM_KEY, _CLAIM_TEMPLATE_KEY):
            return
        ns = self.store.get(kinds.NAMESPACE_KEY, "", str(meta(obj).get("namespace") or ""))
        labels = (meta(ns).get("labels") or {}) if ns is not None else {}
        outer = obj.get("spec")
        spec: Mapping[str, Any] = outer if isinstance(outer, Mapping) else {}
        if rt.key == _CLAIM_TEMPLATE_KEY:
            inner = spec.get("spec")
            spec = inner if isinstance(inner, Mapping) else {}
        if old is None:
            found = admin_access_spec_errors(spec, labels)
        else:
            found = admin_access_status_errors(obj.get("status") or {}, old.get("status") or {}, labels)
        if found:
            raise errors.invalid(rt.kind, rt.group, str(meta(obj).get("name") or ""), found)

    def _check_namespace_open(self, rt: ResourceType, namespace: str, name: str) -> None:
        if not namespace:
            raise errors.bad_request("the namespace of the object is empty: set metadata.namespace or use a "
                                     "namespaced URL")
        ns = self.store.get(kinds.NAMESPACE_KEY, "", namespace)
        if ns is None:
            raise errors.not_found("namespaces", "", namespace)
        if meta(ns).get("deletionTimestamp"):
            raise errors.forbidden(rt.plural, rt.group, name, f"unable to create new content in namespace "
                                   f"{namespace} because it is being terminated")

    def _generate_name(self, rt: ResourceType, namespace: str, prefix: str) -> str:
        for _ in range(8):
            name = prefix[: 63 - 5] + "".join(secrets.choice(_GENERATE_ALPHABET) for _ in range(5))
            if self.store.get(rt.key, namespace, name) is None:
                return name
        raise errors.ApiError(500, "ServerTimeout", f"could not generate a unique name from {prefix!r}")

    def _decode(self, t: Target, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise errors.bad_request(f"the request body must be a JSON object describing a {t.rt.kind}")
        obj = copy.deepcopy(body)
        expected = t.rt.api_version(t.version)
        if obj.get("apiVersion") not in (None, "", expected):
            raise errors.bad_request(f"the API version in the data ({obj.get('apiVersion')}) does not match the "
                                     f"expected API version ({expected})")
        if obj.get("kind") not in (None, "", t.rt.kind):
            raise errors.bad_request(f"the kind in the data ({obj.get('kind')}) does not match the expected kind "
                                     f"({t.rt.kind})")
        obj["apiVersion"], obj["kind"] = expected, t.rt.kind
        obj = conversion.to_storage(t.rt.group, t.rt.kind, t.version, obj)
        return obj if t.rt.custom else kinds.drop_empty(obj)

    # -- update / patch ---------------------------------------------------------------------

    def update(self, t: Target, body: Any, opts: WriteOptions = WriteOptions()) -> Result:
        current = self.get(t)
        new = self._decode(t, body)
        m = new.get("metadata")
        if not isinstance(m, dict) or m.get("name") != t.name:
            got = m.get("name") if isinstance(m, dict) else None
            raise errors.bad_request(f"the name of the object ({got or ''}) does not match the name on the URL "
                                     f"({t.name})")
        if t.rt.namespaced and m.get("namespace") not in (None, "", t.namespace):
            raise errors.bad_request(f"the namespace of the object ({m.get('namespace')}) does not match the "
                                     f"namespace on the request ({t.namespace})")
        return self._write(t, current, new, opts, from_patch=False)

    def patch(self, t: Target, content_type: str, body: Any, opts: WriteOptions = WriteOptions()) -> Result:
        rt = t.rt
        accepted = accepted_patch_types(rt)
        if content_type not in accepted:
            raise errors.unsupported_media_type(
                f"the body of the request was in an unknown format - accepted media types include: "
                f"{', '.join(accepted)}")
        if content_type == APPLY_PATCH:
            # A real apiserver applies it (server-side apply is GA and cannot be switched off); the sandbox keeps
            # no managedFields, so it refuses rather than pretend. A known gap (docs/sandbox.md, Fidelity).
            raise errors.unsupported_media_type(
                "server-side apply is not supported by the sandbox API server: use client-side apply "
                "(kubectl apply without --server-side), a merge patch or an update")
        if content_type == JSON_PATCH and isinstance(body, list) and len(body) > MAX_JSON_PATCH_OPERATIONS:
            raise errors.request_entity_too_large(
                f"The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {len(body)}")
        current = self.get(t)
        doc = copy.deepcopy(render(current, rt, t.version))
        patched = patched_object(doc, content_type, body, rt.kind)
        m = patched.get("metadata")
        if not isinstance(m, dict):
            raise errors.bad_request("the patch removed metadata")
        if m.get("name") != t.name:
            raise errors.bad_request(f"the name of the object ({m.get('name')}) does not match the name on the URL "
                                     f"({t.name})")
        if not m.get("resourceVersion"):
            m["resourceVersion"] = meta(current).get("resourceVersion")
        patched["apiVersion"], patched["kind"] = rt.api_version(t.version), rt.kind
        patched = conversion.to_storage(rt.group, rt.kind, t.version, patched)
        return self._write(t, current, patched, opts, from_patch=True)

    def _write(self, t: Target, current: Obj, new: Obj, opts: WriteOptions, *, from_patch: bool) -> Result:
        rt = t.rt
        cur_meta = meta(current)
        new_meta = new.setdefault("metadata", {})
        requested_rv = new_meta.get("resourceVersion")
        if requested_rv in (None, ""):
            if rt.custom and not from_patch:
                raise errors.invalid(rt.kind, rt.group, t.name, [_rv_required()])
        elif str(requested_rv) != cur_meta.get("resourceVersion"):
            raise errors.conflict(rt.plural, rt.group, t.name)
        if t.subresource == "status":
            result = copy.deepcopy(current)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
            if rt.key == kinds.POD_KEY:
                # kube-apiserver's podStatusStrategy resets only the spec, deletionTimestamp and ownerReferences:
                # labels and annotations sent to pods/status are kept. A kubelet, whose RBAC (system:node) allows
                # pods/status but not pods, annotates its pods this way (the simulator's container record).
                for key in ("labels", "annotations"):
                    if new_meta.get(key):
                        result["metadata"][key] = copy.deepcopy(new_meta[key])
                    else:
                        result["metadata"].pop(key, None)
            kinds.prepare_status_update(rt, result, current)
        else:
            result = new
            rm = result["metadata"]
            for f in _SERVER_META:
                if f in cur_meta:
                    rm[f] = cur_meta[f]
                else:
                    rm.pop(f, None)
            rm["name"] = cur_meta.get("name")
            if rt.namespaced:
                rm["namespace"] = cur_meta.get("namespace")
            else:
                rm.pop("namespace", None)
            if rt.has_status:
                # The main endpoint ignores status for kinds with a status subresource.
                if "status" in current:
                    result["status"] = copy.deepcopy(current["status"])
                else:
                    result.pop("status", None)
            if cur_meta.get("deletionTimestamp"):
                added = set(rm.get("finalizers") or []) - set(cur_meta.get("finalizers") or [])
                if added:
                    raise errors.invalid(rt.kind, rt.group, t.name, [_no_new_finalizers(sorted(added))])
            kinds.apply_defaults(rt, result, self.now())
            kinds.prepare_update(rt, result, current, self.now())
            if _spec_part(rt, result) != _spec_part(rt, current):
                rm["generation"] = int(cur_meta.get("generation") or 0) + 1
        result["apiVersion"], result["kind"] = rt.api_version(t.version), rt.kind
        if not rt.custom:
            result = kinds.drop_empty(result)
        result.setdefault("metadata", {})["resourceVersion"] = cur_meta.get("resourceVersion")
        # A patch's unknown fields are refused in the patch handler's own words upstream; this keeps the short form.
        result, warnings = self._admission.prune(rt, result, opts.field_validation,
                                                 decoded_as="" if from_patch else t.version)
        if t.subresource == "status":
            self._admission.validate_status_update(rt, result, current)
            self._check_admin_access(rt, result, current)
        else:
            self._admission.validate_update(rt, result, current)
            if not t.subresource:
                # Webhooks are matched on the main resource only; `scale` writes reach none (docs/sandbox.md).
                self._call_webhooks(t, "UPDATE", result, current, opts)
        if _comparable(result) == _comparable(current):
            return Result(current, warnings)  # no-op: no new resourceVersion, no watch event
        if opts.dry_run:
            return Result(result, warnings)
        if self._should_remove(rt, current, result):
            final = self.store.remove(rt.key, t.namespace, t.name)
            self._notify(rt, current, None)
            return Result(final, warnings, removed=True)
        _check_storable(result)
        stored = self.store.replace(rt.key, result)
        self._notify(rt, current, stored)
        return Result(stored, warnings)

    def write_replicas(self, t: Target, replicas: int, resource_version: str,
                       opts: WriteOptions = WriteOptions()) -> Result:
        """The scale subresource's write (scale.py): `spec.replicas` of the parent `t` names, checked against
        `resource_version` when one is given, written as an update of the parent (validation, generation)."""
        current = self.get(Target(t.rt, t.version, t.namespace, t.name))
        new = copy.deepcopy(current)
        spec = new.get("spec")
        if not isinstance(spec, dict):
            spec = new["spec"] = {}
        spec["replicas"] = replicas
        new["metadata"]["resourceVersion"] = resource_version
        return self._write(Target(t.rt, t.version, t.namespace, t.name, "scale"), current, new, opts,
                           from_patch=True)

    @staticmethod
    def _should_remove(rt: ResourceType, old: Obj, new: Obj) -> bool:
        # As the apiserver: an object whose deletion is due (grace period 0) goes once its finalizers are gone.
        return meta(old).get("deletionGracePeriodSeconds") == 0 and not kinds.pending_finalizers(rt, new)

    def mutate(self, rt: ResourceType, obj: Obj, change: Callable[[Obj], None], *, status: bool = False) -> Obj | None:
        """Controller-side read-modify-write on the stored object; None if it vanished meanwhile."""
        namespace, name = str(meta(obj).get("namespace") or ""), str(meta(obj).get("name"))
        current = self.store.get(rt.key, namespace, name)
        if current is None:
            return None
        new = copy.deepcopy(current)
        change(new)
        t = Target(rt, rt.versions[0], namespace, name, "status" if status else "")
        return self._write(t, current, new, WriteOptions(field_validation="Ignore"), from_patch=True).obj

    def bind_pod(self, t: Target, body: Any, opts: WriteOptions = WriteOptions()) -> Obj:
        """POST pods/<name>/binding: what the scheduler does to place a pod on a node."""
        if not isinstance(body, dict) or not isinstance(body.get("target"), dict) or not body["target"].get("name"):
            raise errors.bad_request("a Binding needs target.name, e.g. {target: {kind: Node, name: node-1}}")
        node = str(body["target"]["name"])
        current = self.get(Target(t.rt, t.version, t.namespace, t.name))
        cur_meta = meta(current)
        if cur_meta.get("deletionTimestamp"):
            raise errors.conflict(t.rt.plural, t.rt.group, t.name,
                                  f"pod {t.name} is being deleted, cannot be assigned to a host")
        assigned = (current.get("spec") or {}).get("nodeName")
        if assigned:
            raise errors.conflict(t.rt.plural, t.rt.group, t.name,
                                  f"pod {t.name} is already assigned to node {assigned!r}")
        new = copy.deepcopy(current)
        new.setdefault("spec", {})["nodeName"] = node
        status = new.setdefault("status", {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                           "lastTransitionTime": kinds.timestamp(self.now())})
        status["conditions"] = conditions
        if opts.dry_run:
            return new
        stored = self.store.replace(t.rt.key, new)
        self._notify(t.rt, current, stored)
        return stored

    # -- delete -----------------------------------------------------------------------------

    def delete(self, t: Target, opts: DeleteOptions = DeleteOptions()) -> Result:
        rt = t.rt
        current = self.get(t)
        cur_meta = meta(current)
        if opts.uid is not None and opts.uid != cur_meta.get("uid"):
            raise errors.conflict(rt.plural, rt.group, t.name, f"Precondition failed: UID in precondition: "
                                  f"{opts.uid}, UID in object meta: {cur_meta.get('uid')}")
        if opts.resource_version is not None and opts.resource_version != cur_meta.get("resourceVersion"):
            raise errors.conflict(rt.plural, rt.group, t.name, f"Precondition failed: ResourceVersion in "
                                  f"precondition: {opts.resource_version}, ResourceVersion in object meta: "
                                  f"{cur_meta.get('resourceVersion')}")
        if rt.key == kinds.NAMESPACE_KEY and t.name in kinds.PROTECTED_NAMESPACES:
            raise errors.forbidden(rt.plural, rt.group, t.name, "this namespace may not be deleted")
        if opts.propagation not in (None, "Orphan", "Background", "Foreground"):
            raise errors.bad_request(f"propagationPolicy {opts.propagation!r} is not supported: use Orphan, "
                                     "Background or Foreground")
        if opts.dry_run:
            return Result(current)
        new = copy.deepcopy(current)
        nm = new["metadata"]
        finalizers = list(nm.get("finalizers") or [])
        if opts.propagation == "Foreground" and kinds.FOREGROUND_FINALIZER not in finalizers:
            finalizers.append(kinds.FOREGROUND_FINALIZER)
        if opts.propagation == "Orphan" and kinds.ORPHAN_FINALIZER not in finalizers:
            finalizers.append(kinds.ORPHAN_FINALIZER)
        grace = kinds.pod_grace_seconds(current, opts.grace_period) if rt.key == kinds.POD_KEY else 0
        current_grace = cur_meta.get("deletionGracePeriodSeconds")
        if grace > 0:
            if current_grace is not None and current_grace <= grace and finalizers == list(cur_meta.get(
                    "finalizers") or []):
                return Result(current)  # already terminating at least this fast
            nm["deletionTimestamp"] = kinds.deletion_deadline(self.now(), grace)
            nm["deletionGracePeriodSeconds"] = grace
        else:
            nm["deletionGracePeriodSeconds"] = 0
            if not nm.get("deletionTimestamp"):
                nm["deletionTimestamp"] = kinds.timestamp(self.now())
        if finalizers:
            nm["finalizers"] = finalizers
        if rt.key == kinds.NAMESPACE_KEY:
            new.setdefault("status", {})["phase"] = "Terminating"
        if grace > 0 or kinds.pending_finalizers(rt, new):
            if _comparable(new) == _comparable(current):
                return Result(current)
            stored = self.store.replace(rt.key, new)
            self._notify(rt, current, stored)
            return Result(stored)
        final = self.store.remove(rt.key, t.namespace, t.name)
        self._notify(rt, current, None)
        return Result(final, removed=True)

    def delete_collection(self, t: Target, labels: LabelSelector, fields: FieldSelector,
                          opts: DeleteOptions = DeleteOptions()) -> list[Obj]:
        out: list[Obj] = []
        for obj in self.list_objects(t, labels, fields).items:
            namespace, name = _okey(obj)
            try:
                out.append(self.delete(Target(t.rt, t.version, namespace, name), opts).obj)
            except errors.ApiError as exc:
                if exc.code != 404:
                    raise
        return out


def _check_storable(obj: Mapping[str, Any]) -> None:
    """etcd's size limit. Kubernetes stores protobuf, usually smaller than this JSON: stricter, never kinder."""
    if len(json.dumps(obj, separators=(",", ":")).encode()) > ETCD_MAX_REQUEST_BYTES:
        raise errors.storage_too_large()


def _okey(obj: Mapping[str, Any]) -> tuple[str, str]:
    m = meta(obj)
    return str(m.get("namespace") or ""), str(m.get("name") or "")


def _rv_required() -> FieldError:
    return FieldError("metadata.resourceVersion", INVALID, "must be specified for an update", 0)


def _no_new_finalizers(added: list[str]) -> FieldError:
    return FieldError("metadata.finalizers", FORBIDDEN,
                      f"no new finalizers can be added if the object is being deleted, found new finalizers "
                      f"{json.dumps(added)}")


def patched_object(doc: Obj, content_type: str, body: Any, kind: str) -> Obj:
    """`doc` with the PATCH `body` applied: a merge or JSON patch by `content_type`, else a strategic merge patch
    (the caller refused what is none of these). A patch that cannot be applied is refused as the apiserver's
    patcher refuses it (400 or 422), one that does not give an object with 400."""
    try:
        if content_type == MERGE_PATCH:
            patched = patch.merge_patch(doc, body)
        elif content_type == JSON_PATCH:
            patched = patch.json_patch(doc, body)
        else:
            patched = patch.strategic_merge_patch(doc, body, kind)
    except patch.PatchError as exc:
        if exc.code == 400:
            raise errors.bad_request(str(exc)) from exc
        raise errors.ApiError(422, "Invalid", str(exc)) from exc
    if not isinstance(patched, dict):
        raise errors.bad_request("the patch did not produce an object")
    return patched
