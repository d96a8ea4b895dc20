"""The `scale` subresource of Deployments and ReplicaSets (`kubectl scale`), as kube-apiserver serves it.

`GET|PUT|PATCH /apis/apps/v1/namespaces/<ns>/{deployments,replicasets}/<name>/scale` reads and writes an
`autoscaling/v1` `Scale` made from the parent (pkg/registry/apps/{deployment,replicaset}/storage/storage.go,
`ScaleREST` and `scaleFrom*`): metadata name, namespace, uid, resourceVersion and creationTimestamp, `spec.replicas`,
`status.replicas` and `status.selector` (the parent's label selector as a string, `LabelSelectorAsSelector(...)
.String()`). A write moves `spec.replicas` and `metadata.resourceVersion` onto the parent, which is then written as
any update (optimistic concurrency on a resourceVersion given, generation bumped when the spec changes); a PATCH is
applied to the current Scale first. `ValidateScale` (pkg/apis/autoscaling/validation) refuses negative replicas as
`Scale.autoscaling "<name>" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0`.

Pure: the HTTP layer (handlers.py) reads the body and `Resources.write_replicas` writes the parent.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from . import errors
from .lifecycle import JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, patched_object
from .registry import ResourceType
from .store import Obj, meta
from .validation.fielderrors import INVALID, FieldError

SCALE_GROUP: Final = "autoscaling"
SCALE_VERSION: Final = "v1"
SCALE_API_VERSION: Final = f"{SCALE_GROUP}/{SCALE_VERSION}"
SCALE_KIND: Final = "Scale"
# The kinds whose scale subresource is served (kube-apiserver also serves it for StatefulSets and
# ReplicationControllers, which the sandbox does not serve at all).
SCALABLE: Final = frozenset({("apps", "deployments"), ("apps", "replicasets")})
_INT32_MAX: Final = 2**31 - 1
# apimachinery's IsNegativeErrorMsg (pkg/api/validation/generic.go).
NEGATIVE: Final = "must be greater than or equal to 0"


@dataclass(frozen=True)
class ScaleWrite:
    """What a PUT or PATCH asks of the parent: its replicas, and the resourceVersion it was read at ("" for
    unconditional: Deployments and ReplicaSets allow unconditional updates)."""

    replicas: int
    resource_version: str


def _requirement(key: str, op: str, values: list[str]) -> str:
    """labels.Requirement.String() for the operators a metav1.LabelSelector converts to."""
    if op == "DoesNotExist":
        return "!" + key
    if op == "Exists":
        return key
    joined = values[0] if len(values) == 1 else ",".join(sorted(values))
    if op == "=":
        return f"{key}={joined}"
    return f"{key} {'in' if op == 'In' else 'notin'} ({joined})"


def selector_string(selector: Any) -> str:
    """metav1.LabelSelectorAsSelector(selector).String(): requirements sorted by key, joined by commas; an empty
    or missing selector is "" (labels.Everything() and labels.Nothing() both print as nothing)."""
    if not isinstance(selector, Mapping):
        return ""
    reqs: list[tuple[str, str]] = []
    for key, value in sorted((selector.get("matchLabels") or {}).items()):
        reqs.append((str(key), _requirement(str(key), "=", [str(value)])))
    for expr in selector.get("matchExpressions") or ():
        if not isinstance(expr, Mapping):
            continue
        op = str(expr.get("operator") or "")
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            # The parent's validation refuses such an operator; as ScaleREST.Get, a 400 if one is there anyway.
            raise errors.bad_request(f'"{op}" is not a valid label selector operator')
        key = str(expr.get("key") or "")
        reqs.append((key, _requirement(key, op, [str(v) for v in expr.get("values") or ()])))
    reqs.sort(key=lambda r: r[0])  # ByKey; stable, so matchLabels come before expressions on the same key
    return ",".join(text for _, text in reqs)


def scale_of(parent: Mapping[str, Any]) -> Obj:
    """The parent's Scale, as scaleFromDeployment / scaleFromReplicaSet build it and autoscaling/v1 encodes it
    (`spec.replicas` omitted when 0, `status.replicas` always there, `status.selector` omitted when empty)."""
    m = meta(parent)
    spec = parent.get("spec") or {}
    status = parent.get("status") or {}
    scale_meta = {k: m[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if m.get(k)}
    replicas = spec.get("replicas") or 0
    out: Obj = {
        "kind": SCALE_KIND,
        "apiVersion": SCALE_API_VERSION,
        "metadata": scale_meta,
        "spec": {"replicas": replicas} if replicas else {},
        "status": {"replicas": int(status.get("replicas") or 0)},
    }
    selector = selector_string(spec.get("selector"))
    if selector:
        out["status"]["selector"] = selector
    return out


def _decode_error(value: Any) -> errors.ApiError:
    """As the apiserver's decoder words a replicas it cannot read (encoding/json's UnmarshalTypeError, put
    through transformDecodeError)."""
    if isinstance(value, bool):
        what = "bool"
    elif isinstance(value, int | float):
        what = f"number {value}"
    elif isinstance(value, str):
        what = "string"
    elif isinstance(value, Mapping):
        what = "object"
    else:
        what = "array"
    return errors.bad_request(f'{SCALE_KIND} in version "{SCALE_VERSION}" cannot be handled as a {SCALE_KIND}: '
                              f"json: cannot unmarshal {what} into Go struct field ScaleSpec.spec.replicas of "
                              "type int32")


def _replicas(scale: Mapping[str, Any]) -> int:
    spec = scale.get("spec")
    if spec is None:
        return 0
    if not isinstance(spec, Mapping):
        raise errors.bad_request(f'{SCALE_KIND} in version "{SCALE_VERSION}" cannot be handled as a {SCALE_KIND}: '
                                 "json: cannot unmarshal into Go struct field Scale.spec of type v1.ScaleSpec")
    value = spec.get("replicas", 0)
    if value is None:
        return 0
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON 3.0 is read as 3 by Go's decoder
    if isinstance(value, bool) or not isinstance(value, int) or not -_INT32_MAX - 1 <= value <= _INT32_MAX:
        raise _decode_error(value)
    return value


def decode_put(body: Any, name: str) -> Obj:
    """A PUT body: a Scale object naming the URL's object."""
    if not isinstance(body, dict):
        raise errors.bad_request(f"the request body must be a JSON object describing a {SCALE_KIND}")
    if body.get("apiVersion") not in (None, "", SCALE_API_VERSION):
        raise errors.bad_request(f"the API version in the data ({body.get('apiVersion')}) does not match the "
                                 f"expected API version ({SCALE_API_VERSION})")
    if body.get("kind") not in (None, "", SCALE_KIND):
        raise errors.bad_request(f"the kind in the data ({body.get('kind')}) does not match the expected kind "
                                 f"({SCALE_KIND})")
    m = body.get("metadata")
    got = m.get("name") if isinstance(m, Mapping) else None
    if got != name:
        raise errors.bad_request(f"the name of the object ({got or ''}) does not match the name on the URL ({name})")
    return copy.deepcopy(body)


def apply_patch(current: Mapping[str, Any], content_type: str, body: Any) -> Obj:
    """A PATCH applied to the current Scale (what ScaleREST hands the patcher as the old object)."""
    if content_type not in (MERGE_PATCH, JSON_PATCH, STRATEGIC_PATCH):
        raise errors.unsupported_media_type(
            "server-side apply is not supported by the sandbox API server: scale with `kubectl scale`, a merge "
            "patch or an update")
    patched = patched_object(copy.deepcopy(dict(current)), content_type, body, SCALE_KIND)
    m = patched.get("metadata")
    if not isinstance(m, Mapping) or m.get("name") != meta(current).get("name"):
        got = m.get("name") if isinstance(m, Mapping) else None
        raise errors.bad_request(f"the name of the object ({got or ''}) does not match the name on the URL "
                                 f"({meta(current).get('name')})")
    return patched


def requested(rt: ResourceType, parent: Mapping[str, Any], scale: Mapping[str, Any]) -> ScaleWrite:
    """The new Scale checked as scaleUpdatedObjectInfo.UpdatedObject checks it: ValidateScale (422), then the
    uid precondition (409); the resourceVersion is compared by the parent's write."""
    replicas = _replicas(scale)
    name = str(meta(parent).get("name"))
    if replicas < 0:
        raise errors.invalid(SCALE_KIND, SCALE_GROUP, name, [FieldError("spec.replicas", INVALID, NEGATIVE,
                                                                        replicas)])
    m = scale.get("metadata") if isinstance(scale.get("metadata"), Mapping) else {}
    assert isinstance(m, Mapping)
    uid, parent_uid = m.get("uid"), meta(parent).get("uid")
    if uid and uid != parent_uid:
        raise errors.conflict(f"{rt.plural}/scale", rt.group, name,
                              f"Precondition failed: UID in precondition: {uid}, UID in object meta: {parent_uid}")
    rv = m.get("resourceVersion")
    return ScaleWrite(replicas, str(rv) if rv else "")
