"""Object metadata, the part every kind shares (the sandbox applies it to all of them)."""

from __future__ import annotations

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


def validate_object_meta(
    meta: object,
    path: str = "metadata",
    *,
    name_check: NameCheck = dns_subdomain_problems,
    require_name: bool = True,
    namespaced: bool | None = None,
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
    for i, fin in enumerate(as_list(errs, m.get("finalizers"), child(path, "finalizers"))):
        fin_text = as_str(errs, fin, index(child(path, "finalizers"), i))
        if fin_text is not None:
            for problem in qualified_name_problems(fin_text):
                errs.invalid(index(child(path, "finalizers"), i), fin_text, problem)
    return errs.items


def has_meta(obj: Mapping[str, Any]) -> bool:
    # Namespace checks only make sense for objects that came through the API (the sandbox fills
    # metadata.namespace from the URL); a builder's bare dict is validated without them.
    return isinstance(obj.get("metadata"), Mapping)


def namespace_known(obj: Mapping[str, Any]) -> bool:
    meta = obj.get("metadata")
    return isinstance(meta, Mapping) and "namespace" in meta
