"""The three patch formats: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge.

Strategic merge patch needs to know which lists merge by key. Kubernetes reads that from Go struct
tags; here a table lists the merge keys of the fields the sandbox's clients touch (pod containers,
conditions, ownerReferences, finalizers, reservedFor, ...). A `$setElementOrder/<list>` directive in
the patch also reveals the key, so lists that kubectl patches are merged right even if not listed.
Every other list is replaced, which is what Kubernetes does for atomic lists.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final


class PatchError(ValueError):
    """The patch cannot be applied; `code` is the HTTP status the apiserver uses (400 or 422)."""

    def __init__(self, message: str, code: int = 422) -> None:
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------------------------
# RFC 7386 JSON merge patch
# ---------------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v)
    return result


# ---------------------------------------------------------------------------------------------
# RFC 6902 JSON patch
# ---------------------------------------------------------------------------------------------


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(f"invalid JSON pointer {path!r}: must be empty or start with '/'", 400)
    if path == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _list_index(container: list[Any], segment: str, *, allow_end: bool) -> int:
    if segment == "-" and allow_end:
        return len(container)
    if not segment.isdigit() or (segment != "0" and segment.startswith("0")):
        raise PatchError(f"invalid array index {segment!r}")
    i = int(segment)
    if i > len(container) or (i == len(container) and not allow_end):
        raise PatchError(f"array index {i} out of bounds (length {len(container)})")
    return i


def _parent(doc: Any, parts: list[str], op: str) -> tuple[Any, str]:
    cur = doc
    for token in parts[:-1]:
        if isinstance(cur, dict):
            if token not in cur:
                raise PatchError(f"{op} operation does not apply: doc is missing path: /{'/'.join(parts)}")
            cur = cur[token]
        elif isinstance(cur, list):
            cur = cur[_list_index(cur, token, allow_end=False)]
        else:
            raise PatchError(f"{op} operation does not apply: doc is missing path: /{'/'.join(parts)}")
    return cur, parts[-1]


def _get(doc: Any, parts: list[str], op: str) -> Any:
    if not parts:
        return doc
    parent, last = _parent(doc, parts, op)
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list):
        return parent[_list_index(parent, last, allow_end=False)]
    raise PatchError(f"{op} operation does not apply: doc is missing path: /{'/'.join(parts)}")


def _remove(doc: Any, parts: list[str], op: str) -> Any:
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent, last = _parent(doc, parts, op)
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"{op} operation does not apply: doc is missing key: /{'/'.join(parts)}")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_list_index(parent, last, allow_end=False))
    raise PatchError(f"{op} operation does not apply: doc is missing path: /{'/'.join(parts)}")


def _add(doc: Any, parts: list[str], value: Any, *, replace: bool) -> Any:
    op = "replace" if replace else "add"
    if not parts:
        return value
    parent, last = _parent(doc, parts, op)
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise PatchError(f"replace operation does not apply: doc is missing key: /{'/'.join(parts)}")
        parent[last] = value
    elif isinstance(parent, list):
        i = _list_index(parent, last, allow_end=not replace)
        if replace:
            parent[i] = value
        else:
            parent.insert(i, value)
    else:
        raise PatchError(f"{op} operation does not apply: doc is missing path: /{'/'.join(parts)}")
    return doc


def json_patch(doc: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations like [{\"op\": \"add\", \"path\": ..., "
                         "\"value\": ...}]", 400)
    result = copy.deepcopy(doc)
    for n, raw in enumerate(operations):
        if not isinstance(raw, Mapping) or "op" not in raw:
            raise PatchError(f"operation {n} is not an object with an 'op' field", 400)
        op = raw["op"]
        parts = _pointer(raw.get("path"))
        if op in ("add", "replace", "test") and "value" not in raw:
            raise PatchError(f"operation {n} ({op}) has no 'value'", 400)
        if op == "add":
            result = _add(result, parts, copy.deepcopy(raw["value"]), replace=False)
        elif op == "replace":
            result = _add(result, parts, copy.deepcopy(raw["value"]), replace=True)
        elif op == "remove":
            _remove(result, parts, op)
        elif op in ("move", "copy"):
            source = _pointer(raw.get("from"))
            value = _remove(result, source, op) if op == "move" else copy.deepcopy(_get(result, source, op))
            result = _add(result, parts, value, replace=False)
        elif op == "test":
            if _get(result, parts, op) != raw["value"]:
                raise PatchError(f"testing value /{'/'.join(parts)} failed")
        else:
            raise PatchError(f"unexpected operation {op!r}: use add, remove, replace, move, copy or test", 400)
    return result


# ---------------------------------------------------------------------------------------------
# Strategic merge patch
# ---------------------------------------------------------------------------------------------

PRIMITIVE: Final = "<primitive>"  # a merging list of scalars (union), e.g. metadata.finalizers

_CONTAINER_LISTS: Final = {"ports": "containerPort", "env": "name", "volumeMounts": "mountPath",
                           "volumeDevices": "devicePath"}


def _pod_spec_keys(prefix: str) -> dict[str, str]:
    keys = {
        f"{prefix}.volumes": "name",
        f"{prefix}.imagePullSecrets": "name",
        f"{prefix}.hostAliases": "ip",
        f"{prefix}.resourceClaims": "name",
        f"{prefix}.schedulingGates": "name",
    }
    for containers in ("containers", "initContainers", "ephemeralContainers"):
        keys[f"{prefix}.{containers}"] = "name"
        for list_name, k in _CONTAINER_LISTS.items():
            keys[f"{prefix}.{containers}[].{list_name}"] = k
    return keys


# Paths are dotted field names from the object root, `[]` marking "inside a list element".
MERGE_KEYS: Final[Mapping[str, Mapping[str, str]]] = {
    "*": {"metadata.finalizers": PRIMITIVE, "metadata.ownerReferences": "uid"},
    "Pod": {
        **_pod_spec_keys("spec"),
        "status.conditions": "type",
        "status.podIPs": "ip",
        "status.hostIPs": "ip",
        "status.resourceClaimStatuses": "name",
    },
    "Node": {"status.conditions": "type", "status.addresses": "type", "spec.podCIDRs": PRIMITIVE},
    "Namespace": {"status.conditions": "type"},
    "Service": {"spec.ports": "port"},
    "ResourceClaim": {"status.reservedFor": "uid"},
}


def strategic_merge_patch(doc: Mapping[str, Any], patch: Any, kind: str) -> dict[str, Any]:
    if not isinstance(patch, Mapping):
        raise PatchError("a strategic merge patch must be a JSON object", 400)
    keys = {**MERGE_KEYS["*"], **MERGE_KEYS.get(kind, {})}
    result = _smp_map(doc, patch, "", keys)
    if result is None:
        raise PatchError("$patch: delete of the whole object is not supported", 400)
    return result


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _smp_map(original: Any, patch: Mapping[str, Any], path: str, keys: Mapping[str, str]) -> dict[str, Any] | None:
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive not in (None, "merge"):
        raise PatchError(f"unknown patch type {directive!r} in $patch: use merge, replace or delete", 400)
    result: dict[str, Any] = dict(original) if isinstance(original, Mapping) else {}
    retain = patch.get("$retainKeys")
    orders = {k.split("/", 1)[1]: v for k, v in patch.items() if k.startswith("$setElementOrder/")}
    deletes = {k.split("/", 1)[1]: v for k, v in patch.items() if k.startswith("$deleteFromPrimitiveList/")}
    for k, v in patch.items():
        if k.startswith("$"):
            continue
        sub = _join(path, k)
        if v is None:
            result.pop(k, None)
        elif isinstance(v, Mapping):
            merged = _smp_map(result.get(k), v, sub, keys)
            if merged is None:
                result.pop(k, None)
            else:
                result[k] = merged
        elif isinstance(v, list):
            result[k] = _smp_list(result.get(k), v, sub, keys, orders.get(k))
        else:
            result[k] = copy.deepcopy(v)
    for k, order in orders.items():
        if k not in patch and isinstance(result.get(k), list):
            result[k] = _smp_list(result[k], [], _join(path, k), keys, order)
    for k, removed in deletes.items():
        if isinstance(result.get(k), list) and isinstance(removed, list):
            result[k] = [x for x in result[k] if x not in removed]
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _infer_key(order: Any) -> str | None:
    if isinstance(order, list) and order and all(isinstance(o, Mapping) and len(o) == 1 for o in order):
        names = {next(iter(o)) for o in order}
        if len(names) == 1:
            return str(names.pop())
    return None


def _smp_list(original: Any, patch: list[Any], path: str, keys: Mapping[str, str], order: Any) -> list[Any]:
    merge_key = keys.get(path) or _infer_key(order)
    if merge_key is None and isinstance(order, list) and order and all(not isinstance(o, Mapping) for o in order):
        merge_key = PRIMITIVE
    if any(isinstance(p, Mapping) and p.get("$patch") == "replace" for p in patch):
        return [copy.deepcopy(p) for p in patch if not (isinstance(p, Mapping) and p.get("$patch") == "replace")]
    if merge_key is None:
        return copy.deepcopy(patch)
    base = list(original) if isinstance(original, list) else []
    if merge_key == PRIMITIVE:
        result = base + [copy.deepcopy(p) for p in patch if p not in base]
        if isinstance(order, list):
            result = _reorder(result, order, lambda x: x)
        return result
    result = list(base)
    for item in patch:
        if not isinstance(item, Mapping) or merge_key not in item:
            raise PatchError(f"{path}: every element of a strategic merge list needs the merge key {merge_key!r}",
                             400)
        found = next((i for i, o in enumerate(result) if isinstance(o, Mapping) and
                      o.get(merge_key) == item[merge_key]), None)
        if item.get("$patch") == "delete":
            if found is not None:
                result.pop(found)
            continue
        merged = _smp_map(result[found] if found is not None else {}, item, path + "[]", keys)
        if merged is None:
            continue
        if found is None:
            result.append(merged)
        else:
            result[found] = merged
    if isinstance(order, list):
        result = _reorder(result, [o.get(merge_key) for o in order if isinstance(o, Mapping)],
                          lambda x: x.get(merge_key) if isinstance(x, Mapping) else None)
    return result


def _reorder(items: list[Any], order: list[Any], key_of: Any) -> list[Any]:
    """Items named in `order` take that order; the rest (server-side only) keep theirs, after them."""
    position = {repr(k): i for i, k in enumerate(order)}
    named = sorted((x for x in items if repr(key_of(x)) in position), key=lambda x: position[repr(key_of(x))])
    others = [x for x in items if repr(key_of(x)) not in position]
    return named + others
