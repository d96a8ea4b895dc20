"""Object metadata, the part every kind shares (the sandbox applies it to all of them)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from dra_driver.k8s.names import (
    dns_label_problems,
    dns_subdomain_problems,
    label_value_problems,
    qualified_name_problems,
)

from .common import as_list, as_map, as_str
from .fielderrors import Errors, FieldError, child, index, key

NameCheck = Callable[[str], list[str]]
MAX_ANNOTATIONS_BYTES: Final = 256 * 1024


# pkg/apis/core/helper IsStandardFinalizerName: the namespace finalizer and the garbage collector's two.
STANDARD_FINALIZERS: Final = frozenset({"kubernetes", "orphan", "foregroundDeletion"})

def validate_object_meta(
    meta: object,
    path: str = "metadata",
    *,
    name_check: NameCheck = dns_subdomain_problems,
    require_name: bool = True,
    namespaced: bool | None = None,
    builtin: bool = True,
) -> list[FieldError]:
    """Checks every kind shares: name present and well-formed, labels/annotations/ownerReferences valid.

    `namespaced=True` requires a namespace, `False` forbids one, `None` (client-side use) skips it.
    """
    errs = Errors()
    m = as_map(errs, meta, path)
    name = as_str(errs, m.get("name"), child(path, "name"))
    generate = as_str(errs, m.get("generateName"), child(path, "generateName"))
    if name:
        for problem in name_check(name):
            errs.invalid(child(path, "name"), name, problem)
    elif require_name and not generate:
        errs.required(child(path, "name"), "name or generateName is required")
    namespace = as_str(errs, m.get("namespace"), child(path, "namespace"))
    if namespaced is True:
        if not namespace:
            errs.required(child(path, "namespace"))
        else:
            for problem in dns_label_problems(namespace):
                errs.invalid(child(path, "namespace"), namespace, problem)
    elif namespaced is False and namespace:
        errs.forbidden(child(path, "namespace"), "not allowed on this type")
    labels = as_map(errs, m.get("labels"), child(path, "labels"))
    for k, v in labels.items():
        for problem in qualified_name_problems(k):
            errs.invalid(child(path, "labels"), k, problem)
        if not isinstance(v, str):
            errs.type_invalid(key(child(path, "labels"), k), v, "a string")
            continue
        for problem in label_value_problems(v):
            errs.invalid(key(child(path, "labels"), k), v, problem)
    annotations = as_map(errs, m.get("annotations"), child(path, "annotations"))
    total = 0
    for k, v in annotations.items():
        for problem in qualified_name_problems(k.lower()):
            errs.invalid(child(path, "annotations"), k, problem)
        if not isinstance(v, str):
            errs.type_invalid(key(child(path, "annotations"), k), v, "a string")
            continue
        total += len(k) + len(v)
    if total > MAX_ANNOTATIONS_BYTES:
        errs.too_long(child(path, "annotations"), MAX_ANNOTATIONS_BYTES)
    refs_path = child(path, "ownerReferences")
    controllers = 0
    for i, ref in enumerate(as_list(errs, m.get("ownerReferences"), refs_path)):
        ref_path = index(refs_path, i)
        r = as_map(errs, ref, ref_path)
        for f in ("apiVersion", "kind", "name", "uid"):
            if not r.get(f):
                errs.required(child(ref_path, f))
        if r.get("controller") is True:
            controllers += 1
    if controllers > 1:
        errs.invalid(refs_path, controllers, "Only one reference can have Controller set to true")
    # apimachinery's ValidateFinalizers names the list, not the entry; a built-in kind's ValidateObjectMeta
    # (pkg/apis/core/validation) then refuses at the entry a name without "/" that is no standard finalizer.
    for i, fin in enumerate(as_list(errs, m.get("finalizers"), child(path, "finalizers"))):
        fin_text = as_str(errs, fin, index(child(path, "finalizers"), i))
        if fin_text is not None:
            for problem in qualified_name_problems(fin_text):
                errs.invalid(child(path, "finalizers"), fin_text, problem)
    listed = m.get("finalizers")
    for i, fin in enumerate(listed if builtin and isinstance(listed, list) else []):
        if isinstance(fin, str) and "/" not in fin and fin not in STANDARD_FINALIZERS:
            errs.invalid(index(child(path, "finalizers"), i), fin,
                         "name is neither a standard finalizer name nor is it fully qualified")
    return errs.items


def has_meta(obj: Mapping[str, Any]) -> bool:
    # Namespace checks only make sense for objects that came through the API (the sandbox fills
    # metadata.namespace from the URL); a builder's bare dict is validated without them.
    return isinstance(obj.get("metadata"), Mapping)


def namespace_known(obj: Mapping[str, Any]) -> bool:
    meta = obj.get("metadata")
    return isinstance(meta, Mapping) and "namespace" in meta


# --- metav1.Condition: apimachinery pkg/apis/meta/v1/validation/validation.go ------------------------------------

_CONDITION_STATUSES: Final = ("False", "True", "Unknown")  # sets.NewString(...).List(): sorted
_CONDITION_REASON_RE: Final = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")
_CONDITION_REASON_FMT: Final = "[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?"
_CONDITION_REASON_MSG: Final = (
    "a condition reason must start with alphabetic character, optionally followed by a string of alphanumeric "
    "characters or '_,:', and must end with an alphanumeric character or '_' (e.g. 'my_name',  or 'MY_NAME',  or "
    "'MyName',  or 'ReasonA,ReasonB',  or 'ReasonA:ReasonB', regex used for validation is '"
    + _CONDITION_REASON_FMT + "')"
)
_MAX_REASON: Final = 1024  # apimachinery pkg/apis/meta/v1/validation maxReasonLen
_MAX_MESSAGE: Final = 32 * 1024  # maxMessageLen


def validate_conditions(errs: Errors, value: object, path: str) -> None:
    """apimachinery pkg/apis/meta/v1/validation ValidateConditions (and ValidateCondition for each): the one
    check of metav1.Condition lists, for every kind that has them."""
    seen: set[str] = set()
    for i, raw in enumerate(as_list(errs, value, path)):
        cpath = index(path, i)
        cond = as_map(errs, raw, cpath)
        ctype = as_str(errs, cond.get("type"), child(cpath, "type")) or ""
        if ctype in seen:
            errs.duplicate(child(cpath, "type"), ctype)
        seen.add(ctype)
        for problem in qualified_name_problems(ctype):
            errs.invalid(child(cpath, "type"), ctype, problem)
        if cond.get("status") not in _CONDITION_STATUSES:
            errs.not_supported(child(cpath, "status"), cond.get("status") or "", _CONDITION_STATUSES)
        generation = cond.get("observedGeneration")
        if isinstance(generation, int) and not isinstance(generation, bool) and generation < 0:
            errs.invalid(child(cpath, "observedGeneration"), generation, "must be greater than or equal to zero")
        if not cond.get("lastTransitionTime"):
            errs.required(child(cpath, "lastTransitionTime"), "must be set")
        reason = as_str(errs, cond.get("reason"), child(cpath, "reason")) or ""
        if not reason:
            errs.required(child(cpath, "reason"), "must be set")
        else:
            if not _CONDITION_REASON_RE.fullmatch(reason):
                errs.invalid(child(cpath, "reason"), reason, _CONDITION_REASON_MSG)
            if len(reason) > _MAX_REASON:
                errs.too_long(child(cpath, "reason"), _MAX_REASON)
        message = as_str(errs, cond.get("message"), child(cpath, "message")) or ""
        if len(message) > _MAX_MESSAGE:
            errs.too_long(child(cpath, "message"), _MAX_MESSAGE)
