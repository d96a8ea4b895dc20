"""OpenAPI v3 (`/openapi/v3` and `/openapi/v3/<api|apis/group>/<version>`) for the built-in kinds served.

The schemas are Kubernetes' own, from the `kubernetes_validate` package (its JSON-schema rendering of each
release's OpenAPI, `_definitions.json`), turned back into OpenAPI: `type: [T, "null"]` becomes `type: T`,
`$ref`s point at `#/components/schemas/`, `IntOrString` and `Quantity` get their OpenAPI shapes. Paths carry
what kubectl looks for: each item path's PATCH operation has the kind's `x-kubernetes-group-version-kind`
and a `fieldValidation` query parameter, so `kubectl apply`/`create` leave field validation to the server
(which refuses unknown fields with `fieldValidation=Strict`); `kubectl explain` reads the schemas.
Custom resources are not listed (kubectl then checks the namespace document, as for any CRD).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from .registry import Registry

_PARAMS: Final = ("dryRun", "fieldManager", "fieldValidation", "pretty")


@functools.lru_cache(maxsize=4)
def definitions(kube_version: str) -> Mapping[str, Any]:
    import kubernetes_validate

    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    parts = kube_version.lstrip("v").split(".")
    want = (int(parts[0]), int(parts[1]) if len(parts) > 1 else 0)
    available = sorted(
        (tuple(int(x) for x in d.name[1:].split("-")[0].split(".")[:2]), d)
        for d in root.iterdir() if d.name.endswith("-local") and d.name.startswith("v")
    )
    chosen = [d for v, d in available if v <= want] or [available[0][1]]
    data = json.loads((chosen[-1] / "_definitions.json").read_text())
    defs = data["$defs"]
    assert isinstance(defs, dict)
    return defs


def from_json_schema(node: Any, ref_prefix: str, with_ref: Callable[[dict[str, Any], str], dict[str, Any]]) -> Any:
    """kubernetes_validate's JSON-schema node as an OpenAPI schema node: `type: [T, "null"]` as `type: T`, no
    `enum` (the JSON-schema rendering's apiVersion/kind enums; Kubernetes' OpenAPI has none there), and a `$ref`
    to `ref_prefix` + the definition's name, set beside the node's other keys by `with_ref` (each OpenAPI version
    has its own rule)."""
    if isinstance(node, list):
        return [from_json_schema(x, ref_prefix, with_ref) for x in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k in ("$ref", "enum", "$schema"):
            continue
        if k == "type" and isinstance(v, list):
            types = [t for t in v if t != "null"]
            out[k] = types[0] if types else "object"
        elif k == "properties" and isinstance(v, dict):
            out[k] = {name: from_json_schema(sub, ref_prefix, with_ref) for name, sub in v.items()}
        else:
            out[k] = from_json_schema(v, ref_prefix, with_ref)
    ref = node.get("$ref")
    return with_ref(out, ref_prefix + ref.rsplit("/", 1)[-1]) if isinstance(ref, str) else out


def _with_ref_v3(out: dict[str, Any], target: str) -> dict[str, Any]:
    # OpenAPI v3 ignores a $ref's siblings too; kube-openapi wraps it in allOf where the node says more.
    return {**out, "allOf": [{"$ref": target}]} if out else {"$ref": target}


SPECIAL_SCHEMAS: Final[Mapping[str, Mapping[str, Any]]] = {
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"type": "string", "format": "int-or-string"},
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {"type": "string"},
}


def _schema(defs: Mapping[str, Any], name: str) -> dict[str, Any]:
    special = SPECIAL_SCHEMAS.get(name)
    if special is not None:
        return {"description": defs.get(name, {}).get("description", ""), **special}
    converted = from_json_schema(defs[name], "#/components/schemas/", _with_ref_v3)
    assert isinstance(converted, dict)
    return converted


def _refs(node: Any, into: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            into.add(ref.rsplit("/", 1)[-1])
        for v in node.values():
            _refs(v, into)
    elif isinstance(node, list):
        for v in node:
            _refs(v, into)


def definition_name(defs: Mapping[str, Any], group: str, version: str, kind: str) -> str | None:
    for name, schema in defs.items():
        for gvk in schema.get("x-kubernetes-group-version-kind") or ():
            if gvk.get("group") == group and gvk.get("version") == version and gvk.get("kind") == kind:
                return name
    return None


def closure(defs: Mapping[str, Any], roots: list[str]) -> list[str]:
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name not in defs:
            continue
        seen.add(name)
        found: set[str] = set()
        _refs(defs[name], found)
        todo.extend(found - seen)
    return sorted(seen)


def _prefix(group: str, version: str) -> str:
    return f"/apis/{group}/{version}" if group else f"/api/{version}"


def _operation(action: str, gvk: Mapping[str, str], ref: str, kind: str, params: tuple[str, ...]) -> dict[str, Any]:
    body = {"content": {"application/json": {"schema": {"$ref": ref}}}}
    op: dict[str, Any] = {
        "operationId": f"{action}{kind}",
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": dict(gvk),
        "parameters": [{"name": p, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
                       for p in params],
        "responses": {"200": {"description": "OK", **body}},
    }
    if action in ("post", "put"):
        op["requestBody"] = body
    if action == "patch":
        op["requestBody"] = {"content": {t: {"schema": {"type": "object"}} for t in (
            "application/json-patch+json", "application/merge-patch+json", "application/strategic-merge-patch+json")}}
    return op


def _paths(group: str, version: str, plural: str, kind: str, namespaced: bool, ref: str) -> dict[str, Any]:
    gvk = {"group": group, "version": version, "kind": kind}
    base = _prefix(group, version) + ("/namespaces/{namespace}" if namespaced else "") + "/" + plural
    path_params = [{"name": "namespace", "in": "path", "required": True, "schema": {"type": "string"}}] \
        if namespaced else []
    name_param = [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}]
    write = _PARAMS
    return {
        base: {"parameters": path_params,
               "get": _operation("list", gvk, ref, kind, ("labelSelector", "fieldSelector", "limit")),
               "post": _operation("post", gvk, ref, kind, write)},
        base + "/{name}": {"parameters": path_params + name_param,
                           "get": _operation("get", gvk, ref, kind, ("pretty",)),
                           "put": _operation("put", gvk, ref, kind, write),
                           "patch": _operation("patch", gvk, ref, kind, (*write, "force")),
                           "delete": _operation("delete", gvk, ref, kind, ("dryRun", "propagationPolicy"))},
    }


def _builtin_group_versions(registry: Registry) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for rt in registry.all():
        if rt.custom:
            continue
        for v in rt.versions:
            if (rt.group, v) not in out:
                out.append((rt.group, v))
    return out


def document(registry: Registry, kube_version: str, group: str, version: str) -> dict[str, Any] | None:
    """The OpenAPI v3 document of one built-in group/version, or None when it is not served."""
    if (group, version) not in _builtin_group_versions(registry):
        return None
    rows = tuple((rt.plural, rt.kind, rt.namespaced) for rt in registry.in_group_version(group, version)
                 if not rt.custom)
    doc: dict[str, Any] = json.loads(_build(kube_version, group, version, rows))  # a fresh copy per answer
    return doc


@functools.lru_cache(maxsize=64)
def _build(kube_version: str, group: str, version: str, rows: tuple[tuple[str, str, bool], ...]) -> str:
    defs = definitions(kube_version)
    paths: dict[str, Any] = {}
    roots = ["io.k8s.apimachinery.pkg.apis.meta.v1.Status", "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions"]
    for plural, kind, namespaced in rows:
        name = definition_name(defs, group, version, kind)
        if name is None:
            continue
        roots.append(name)
        list_name = definition_name(defs, group, version, kind + "List")
        if list_name:
            roots.append(list_name)
        paths.update(_paths(group, version, plural, kind, namespaced, "#/components/schemas/" + name))
    schemas = {n: _schema(defs, n) for n in closure(defs, roots)}
    return json.dumps({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v" + kube_version.lstrip("v")},
        "paths": paths,
        "components": {"schemas": schemas},
    }, sort_keys=True)


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


@functools.lru_cache(maxsize=64)
def _digest(text: str) -> str:
    return hashlib.sha512(text.encode()).hexdigest()[:128].upper()


def index(registry: Registry, kube_version: str) -> dict[str, Any]:
    """`/openapi/v3`: one entry per served built-in group/version, with a content hash as real servers give."""
    paths: dict[str, Any] = {}
    for group, version in _builtin_group_versions(registry):
        rows = tuple((rt.plural, rt.kind, rt.namespaced) for rt in registry.in_group_version(group, version)
                     if not rt.custom)
        digest = _digest(_build(kube_version, group, version, rows))
        paths[_gv_path(group, version)] = {"serverRelativeURL": f"/openapi/v3/{_gv_path(group, version)}?hash={digest}"}
    return {"paths": paths}


def document_for_path(registry: Registry, kube_version: str, segments: list[str]) -> dict[str, Any] | None:
    """`segments` after `openapi/v3`: `["api", "v1"]` or `["apis", group, version]`."""
    if segments[:1] == ["api"] and len(segments) == 2:
        return document(registry, kube_version, "", segments[1])
    if segments[:1] == ["apis"] and len(segments) == 3:
        return document(registry, kube_version, segments[1], segments[2])
    return None
