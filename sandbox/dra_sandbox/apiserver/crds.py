"""CustomResourceDefinitions: the checks the apiserver makes, and the rows they add to the registry."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from dra_driver.k8s.names import dns_label_problems

from .fieldlabels import FieldLabel, custom_rules
from .registry import NAME_PATH_SEGMENT, PrinterColumn, ResourceType, version_priority
from .validation.fielderrors import INVALID, NOT_SUPPORTED, REQUIRED, FieldError


def validate_crd(obj: Mapping[str, Any]) -> list[FieldError]:
    """The structural rules that decide whether a CRD can be served at all."""
    errors: list[FieldError] = []
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    group = spec.get("group")
    names = spec.get("names") if isinstance(spec.get("names"), Mapping) else {}
    assert isinstance(names, Mapping)
    if not isinstance(group, str) or "." not in group:
        errors.append(FieldError("spec.group", INVALID, "should be a domain with at least one dot", group))
    for f in ("plural", "kind"):
        if not isinstance(names.get(f), str) or not names.get(f):
            errors.append(FieldError(f"spec.names.{f}", REQUIRED))
    plural = names.get("plural")
    if isinstance(plural, str) and plural:
        for problem in dns_label_problems(plural):
            errors.append(FieldError("spec.names.plural", INVALID, problem, plural))
    name = (obj.get("metadata") or {}).get("name")
    if isinstance(plural, str) and isinstance(group, str) and name != f"{plural}.{group}":
        errors.append(FieldError("metadata.name", INVALID, 'must be spec.names.plural+"."+spec.group', name))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        errors.append(FieldError("spec.scope", NOT_SUPPORTED, 'supported values: "Cluster", "Namespaced"',
                                 spec.get("scope")))
    versions = spec.get("versions")
    if not isinstance(versions, list) or not versions:
        errors.append(FieldError("spec.versions", REQUIRED, "list the served versions, e.g. [{name: v1, served: "
                                 "true, storage: true, schema: ...}]"))
        return errors
    storage = [v for v in versions if isinstance(v, Mapping) and v.get("storage") is True]
    if len(storage) != 1:
        errors.append(FieldError("spec.versions", INVALID, "must have exactly one version marked as storage version",
                                 len(storage)))
    for i, v in enumerate(versions):
        vname = v.get("name") if isinstance(v, Mapping) else None
        if not isinstance(vname, str) or not vname:
            errors.append(FieldError(f"spec.versions[{i}].name", REQUIRED))
    return errors


def rows_for_crd(obj: Mapping[str, Any]) -> tuple[ResourceType, ...]:
    """Registry rows for an established CRD (none while it is being deleted, as the apiserver stops serving)."""
    spec = obj.get("spec") or {}
    names = spec.get("names") or {}
    served = [v for v in spec.get("versions") or [] if v.get("served", True)]
    if not served:
        return ()
    versions = tuple(sorted((str(v["name"]) for v in served), key=version_priority))
    preferred = next(v for v in served if v["name"] == versions[0])
    subresources = frozenset(preferred.get("subresources") or {})
    labels: dict[str, FieldLabel] = {}
    for sel in preferred.get("selectableFields") or []:
        path = str(sel.get("jsonPath", "")).lstrip(".")
        if path:
            labels[path] = FieldLabel(tuple(path.split(".")))
    columns = tuple(
        PrinterColumn(
            name=str(c.get("name")),
            json_path=str(c.get("jsonPath", "")),
            type=str(c.get("type", "string")),
            description=str(c.get("description", "")),
            priority=int(c.get("priority", 0)),
        )
        for c in preferred.get("additionalPrinterColumns") or []
    )
    kind = str(names["kind"])
    return (
        ResourceType(
            group=str(spec["group"]),
            versions=versions,
            plural=str(names["plural"]),
            singular=str(names.get("singular") or kind.lower()),
            kind=kind,
            namespaced=spec.get("scope") == "Namespaced",
            subresources=frozenset(s for s in subresources if s == "status"),
            short_names=tuple(names.get("shortNames") or ()),
            categories=tuple(names.get("categories") or ()),
            field_rules=custom_rules(spec.get("scope") == "Namespaced", labels),
            name_format=NAME_PATH_SEGMENT,
            return_deleted_object=True,
            custom=True,
            printer_columns=columns,
            schema=((preferred.get("schema") or {}).get("openAPIV3Schema") or None),
        ),
    )


def established_status(obj: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The status the apiextensions controllers write once names are accepted and the CRD is served."""
    spec = obj.get("spec") or {}
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    names = dict(spec.get("names") or {})
    names.setdefault("singular", str(names.get("kind", "")).lower())
    names.setdefault("listKind", f"{names.get('kind', '')}List")
    storage = [v["name"] for v in spec.get("versions") or [] if v.get("storage")]
    return {
        "acceptedNames": names,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
             "message": "no conflicts found", "lastTransitionTime": stamp},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": stamp},
        ],
        "storedVersions": storage,
    }
