"""The table of served resources: built-in kinds plus whatever CustomResourceDefinitions declare.

One `ResourceType` row carries everything the generic handlers need (scope, subresources, field
selectors, per-kind quirks), so adding a built-in kind is one line in `BUILTIN_TYPES`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Final

from .fieldlabels import FieldLabel, FieldLabelRules, builtin_rules

__all__ = ["FieldLabel"]  # re-exported: selectors and tests read labels from here

ALL_VERBS: Final = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
# subresource -> verbs it serves
SUBRESOURCE_VERBS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType({
    "status": ("get", "patch", "update"),
    "binding": ("create",),
    "log": ("get",),
    "scale": ("get", "patch", "update"),
})
# Subresources kube-apiserver serves that this one does not: asked for, they get a 405 naming them and where to go
# instead of a 404 that reads as a missing object (docs/sandbox.md, "Fidelity").
UNSERVED_SUBRESOURCES: Final[Mapping[str, frozenset[str]]] = MappingProxyType({
    "pods": frozenset({"exec", "attach", "portforward", "proxy", "eviction", "ephemeralcontainers", "resize"}),
    "nodes": frozenset({"proxy"}),
    "services": frozenset({"proxy"}),
})

# How an object's metadata.name is checked.
NAME_SUBDOMAIN: Final = "subdomain"
NAME_LABEL: Final = "label"
NAME_PATH_SEGMENT: Final = "path"
DEVICE_TAINT_RULE_KEY: Final = ("resource.k8s.io", "devicetaintrules")


@dataclass(frozen=True)
class PrinterColumn:
    """A `kubectl get` column declared by a CRD (additionalPrinterColumns)."""

    name: str
    json_path: str
    type: str = "string"
    description: str = ""
    priority: int = 0


@dataclass(frozen=True)
class ResourceType:
    group: str
    versions: tuple[str, ...]  # served versions, preferred first
    plural: str
    singular: str
    kind: str
    namespaced: bool
    subresources: frozenset[str] = frozenset()
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    # Field selectors this kind accepts, per Kubernetes version, and its refusal text (fieldlabels.py);
    # None: the built-in table's row for (group, plural).
    field_rules: FieldLabelRules | None = None
    name_format: str = NAME_SUBDOMAIN
    # Kubernetes keeps status on create for nodes only; other kinds with a status subresource reset it.
    keep_status_on_create: bool = False
    # DELETE returns the deleted object instead of a Success Status (as the apiserver's OpenAPI
    # declares per kind: pods, services, resource.k8s.io kinds, custom resources...).
    return_deleted_object: bool = False
    # Custom resources refuse PUT without metadata.resourceVersion and strategic-merge patches.
    custom: bool = False
    printer_columns: tuple[PrinterColumn, ...] = ()
    # A CRD being deleted: its resources stay readable and deletable, but creates are refused.
    terminating: bool = False
    # Custom resources: the CRD's openAPIV3Schema (of the storage version), enforced on writes (crschema.py).
    schema: Mapping[str, Any] | None = None
    # Another kind's storage this kind serves (events.k8s.io Events are core Events converted; conversion.py).
    storage: tuple[str, str] | None = None

    @property
    def key(self) -> tuple[str, str]:
        """Storage key, the same for every served version (no conversion, as with CRD strategy None)."""
        return self.storage or (self.group, self.plural)

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    def api_version(self, version: str) -> str:
        return f"{self.group}/{version}" if self.group else version

    @property
    def field_selectors(self) -> FieldLabelRules:
        return self.field_rules if self.field_rules is not None else builtin_rules(self.group, self.plural)

    @property
    def field_labels(self) -> Mapping[str, FieldLabel]:
        return self.field_selectors.labels


def _rt(
    group: str,
    plural: str,
    kind: str,
    *,
    namespaced: bool,
    version: str = "v1",
    versions: tuple[str, ...] = (),
    status: bool = False,
    short: tuple[str, ...] = (),
    **extra: Any,
) -> ResourceType:
    extra.setdefault("subresources", frozenset({"status"}) if status else frozenset())
    return ResourceType(
        group=group,
        versions=versions or (version,),
        plural=plural,
        singular=kind.lower(),
        kind=kind,
        namespaced=namespaced,
        short_names=short,
        **extra,
    )


# resource.k8s.io: v1 is stored and preferred; v1beta2 and v1beta1 are converted (conversion.py).
_DRA_VERSIONS: Final = ("v1", "v1beta2", "v1beta1")

BUILTIN_TYPES: Final[tuple[ResourceType, ...]] = (
    _rt("", "namespaces", "Namespace", namespaced=False, status=True, short=("ns",), name_format=NAME_LABEL),
    _rt("", "nodes", "Node", namespaced=False, status=True, short=("no",), keep_status_on_create=True),
    _rt("", "pods", "Pod", namespaced=True, status=True, short=("po",), return_deleted_object=True,
        categories=("all",), subresources=frozenset({"status", "binding", "log"})),
    _rt("", "events", "Event", namespaced=True, short=("ev",)),
    _rt("", "services", "Service", namespaced=True, status=True, short=("svc",), name_format=NAME_LABEL,
        return_deleted_object=True, categories=("all",)),
    _rt("", "configmaps", "ConfigMap", namespaced=True, short=("cm",)),
    _rt("", "secrets", "Secret", namespaced=True),
    _rt("", "serviceaccounts", "ServiceAccount", namespaced=True, short=("sa",), return_deleted_object=True),
    _rt("resource.k8s.io", "resourceslices", "ResourceSlice", namespaced=False,
        return_deleted_object=True, versions=_DRA_VERSIONS),
    _rt("resource.k8s.io", "deviceclasses", "DeviceClass", namespaced=False, return_deleted_object=True,
        versions=_DRA_VERSIONS),
    _rt("resource.k8s.io", "resourceclaims", "ResourceClaim", namespaced=True, status=True,
        return_deleted_object=True, versions=_DRA_VERSIONS),
    _rt("resource.k8s.io", "resourceclaimtemplates", "ResourceClaimTemplate", namespaced=True,
        return_deleted_object=True, versions=_DRA_VERSIONS),
    # Every version any supported release serves; `builtin_types(minor)` keeps those of the reported release.
    _rt("resource.k8s.io", "devicetaintrules", "DeviceTaintRule", namespaced=False, status=True,
        return_deleted_object=True, versions=("v1", "v1beta2", "v1alpha3")),
    _rt("apiextensions.k8s.io", "customresourcedefinitions", "CustomResourceDefinition", namespaced=False,
        status=True, short=("crd", "crds"), categories=("api-extensions",)),
    _rt("coordination.k8s.io", "leases", "Lease", namespaced=True),
    _rt("admissionregistration.k8s.io", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration",
        namespaced=False, categories=("api-extensions",)),
    _rt("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration",
        namespaced=False, categories=("api-extensions",)),
    _rt("admissionregistration.k8s.io", "validatingadmissionpolicies", "ValidatingAdmissionPolicy",
        namespaced=False, status=True, categories=("api-extensions",)),
    _rt("admissionregistration.k8s.io", "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding",
        namespaced=False, categories=("api-extensions",)),
    # kube-apiserver serves one storage under both groups (pkg/registry/events/rest): the same objects, converted,
    # with the core kind's field selectors.
    _rt("events.k8s.io", "events", "Event", namespaced=True, short=("ev",), storage=("", "events"),
        field_rules=builtin_rules("", "events")),
    _rt("apps", "deployments", "Deployment", namespaced=True, short=("deploy",), categories=("all",),
        subresources=frozenset({"status", "scale"})),
    _rt("apps", "replicasets", "ReplicaSet", namespaced=True, short=("rs",), categories=("all",),
        subresources=frozenset({"status", "scale"})),
    _rt("apps", "daemonsets", "DaemonSet", namespaced=True, status=True, short=("ds",), categories=("all",)),
    _rt("batch", "jobs", "Job", namespaced=True, status=True, categories=("all",)),
)

# DeviceTaintRule (KEP-5055) per release, as the cluster the kind recipe builds serves it (e2e/kind,
# dra_sandbox.e2e.kindrecipe: the DRADeviceTaints/DRADeviceTaintRules gates on, resource.k8s.io/v1alpha3 in
# --runtime-config where no beta or GA version has the kind): v1alpha3 from 1.33, v1beta2 from 1.36, v1 from 1.37
# (kubernetes/kubernetes pkg/registry/resource/rest/storage_resource.go serves each only with the gate on).
DEVICE_TAINT_RULE_VERSIONS: Final[Mapping[int, tuple[str, ...]]] = MappingProxyType({
    34: ("v1alpha3",), 35: ("v1alpha3",), 36: ("v1beta2",), 37: ("v1", "v1beta2"),
})


# KEP-5729 PodGroups (scheduling.k8s.io/v1beta1 in 1.37): served only with the GenericWorkload gate (beta, off by
# default; kube-apiserver also needs `scheduling.k8s.io/v1beta1=true` in --runtime-config, which the sandbox implies).
POD_GROUP_TYPE: Final = _rt("scheduling.k8s.io", "podgroups", "PodGroup", namespaced=True, status=True,
                            version="v1beta1")


def builtin_types(minor: int, gates: frozenset[str] = frozenset()) -> tuple[ResourceType, ...]:
    """The built-in kinds a release serves (1.<minor>; below 1.34 as 1.34, above 1.37 as 1.37) with the feature
    gates `gates` on beyond its defaults."""
    dtr_versions = DEVICE_TAINT_RULE_VERSIONS[min(max(minor, 34), 37)]
    out: list[ResourceType] = []
    for rt in BUILTIN_TYPES:
        if rt.key == DEVICE_TAINT_RULE_KEY:
            rt = replace(rt, versions=dtr_versions)
        out.append(rt)
    if minor >= 37 and "GenericWorkload" in gates:
        out.append(POD_GROUP_TYPE)
    return tuple(out)


_VERSION_RE: Final = re.compile(r"v(\d+)(?:(alpha|beta)(\d+))?")


def version_priority(version: str) -> tuple[int, int, int, str]:
    """Sort key in Kubernetes' order: GA > beta > alpha, higher numbers first, odd names last."""
    m = _VERSION_RE.fullmatch(version)
    if not m:
        return (3, 0, 0, version)
    major, stage, minor = int(m.group(1)), m.group(2), int(m.group(3) or 0)
    rank = {None: 0, "beta": 1, "alpha": 2}[stage]
    return (rank, -major, -minor, "")


class Registry:
    """Served resources; CRD rows come and go at run time. Touched only from the server's event loop."""

    def __init__(self, builtins: Iterable[ResourceType] = BUILTIN_TYPES) -> None:
        self._builtin = tuple(builtins)
        self._custom: dict[str, tuple[ResourceType, ...]] = {}  # CRD name -> its rows (one per CRD)

    def all(self) -> tuple[ResourceType, ...]:
        return self._builtin + tuple(rt for rows in self._custom.values() for rt in rows)

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        for rt in self.all():
            if rt.group == group and rt.plural == plural and version in rt.versions:
                return rt
        return None

    def by_key(self, key: tuple[str, str]) -> ResourceType | None:
        for rt in self.all():
            if rt.key == key:
                return rt
        return None

    def by_kind(self, group: str, kind: str) -> ResourceType | None:
        for rt in self.all():
            if rt.group == group and rt.kind == kind:
                return rt
        return None

    def set_custom(self, crd_name: str, rows: tuple[ResourceType, ...]) -> None:
        if rows:
            self._custom[crd_name] = rows
        else:
            self._custom.pop(crd_name, None)

    def groups(self) -> dict[str, list[str]]:
        """group -> served versions, preferred first (the core group "" included)."""
        out: dict[str, set[str]] = {}
        for rt in self.all():
            out.setdefault(rt.group, set()).update(rt.versions)
        return {g: sorted(vs, key=version_priority) for g, vs in out.items()}

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [rt for rt in self.all() if rt.group == group and version in rt.versions]
