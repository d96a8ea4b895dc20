"""Discovery documents (/version, /api, /apis, /api/v1, /apis/<group>/<version>), legacy format.

Clients that ask for aggregated discovery (kubectl) read the plain `application/json` answer as the
legacy format, exactly as they do with an apiserver that has aggregated discovery switched off.
"""

from __future__ import annotations

from typing import Any

from .registry import ALL_VERBS, SUBRESOURCE_VERBS, Registry, ResourceType, version_priority
from .scale import SCALE_GROUP, SCALE_KIND, SCALE_VERSION


def version_info(kube_version: str) -> dict[str, str]:
    text = kube_version.lstrip("v")
    parts = text.split(".")
    major, minor = parts[0], parts[1] if len(parts) > 1 else "0"
    return {
        "major": major,
        "minor": minor,
        "gitVersion": f"v{text}",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _group_doc(name: str, versions: list[str]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": entries, "preferredVersion": entries[0]}


def api_group_list(registry: Registry) -> dict[str, Any]:
    groups = registry.groups()
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group_doc(g, groups[g]) for g in sorted(groups) if g],
    }


def api_group(registry: Registry, group: str) -> dict[str, Any] | None:
    versions = registry.groups().get(group)
    if not group or not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(group, sorted(versions, key=version_priority))}


def _resource_entries(rt: ResourceType) -> list[dict[str, Any]]:
    main: dict[str, Any] = {
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": list(ALL_VERBS),
    }
    if rt.short_names:
        main["shortNames"] = list(rt.short_names)
    if rt.categories:
        main["categories"] = list(rt.categories)
    out = [main]
    for sub in sorted(rt.subresources):
        entry: dict[str, Any] = {"name": f"{rt.plural}/{sub}", "singularName": "", "namespaced": rt.namespaced}
        if sub == "scale":
            # Another group's kind: client-go's scale client reads group and version from here (discovery's
            # ScaleForResource), as kube-apiserver lists them for deployments/scale.
            entry.update(group=SCALE_GROUP, version=SCALE_VERSION, kind=SCALE_KIND)
        else:
            entry["kind"] = "Binding" if sub == "binding" else rt.kind
        entry["verbs"] = list(SUBRESOURCE_VERBS.get(sub, ()))
        out.append(entry)
    return out


def api_resource_list(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    rows = registry.in_group_version(group, version)
    if not rows:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": [entry for rt in sorted(rows, key=lambda r: r.plural) for entry in _resource_entries(rt)],
    }
