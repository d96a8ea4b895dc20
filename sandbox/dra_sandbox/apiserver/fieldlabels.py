"""Field-selector labels per resource and Kubernetes version: the one table the sandbox API server refuses by and
the test suite checks the product's requests against (tests/apirequests/, docs/reference/api-requests.md).

Upstream, a list/watch/deletecollection first parses `fieldSelector` (apimachinery `pkg/fields/selector.go`:
`=`, `==`, `!=` only), then passes every term through the kind's field label conversion function
(`scheme.AddFieldLabelConversionFunc` in `pkg/apis/<group>/<version>/conversion.go`); a label that function
does not know is answered `400 BadRequest` with that function's own error text
(`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/get.go` ListResource, `delete.go` DeleteCollection). A
kind without such a function gets `runtime.DefaultMetaV1FieldSelectorConversion` (metadata.name and
metadata.namespace, even when cluster-scoped); custom resources get the CRD converter (metadata.name,
metadata.namespace when namespaced, and the CRD's `selectableFields`, GA since 1.32).

Each row names the upstream file it comes from. A label that arrived in a release this project cannot pin down
is dated to the next minor (stricter, as the sandbox must be): `spec.pool.name` on ResourceSlices merged after
1.37.0-beta.0 (kubernetes/kubernetes PR 138456), so 1.38.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

# Kubernetes minors this project supports; the checker holds the product's requests to every one of them.
SUPPORTED_MINORS: Final = (34, 35, 36, 37)

# How a kind's conversion function words its refusal ({label}; {gvk} is "<group>/<version>, Kind=<Kind>").
PLAIN: Final = "field label not supported: {label}"
WITH_GVK: Final = "field label not supported for {gvk}: {label}"
BATCH_JOB: Final = 'field label "{label}" not supported for batchv1.Job'
DEFAULT_META: Final = '"{label}" is not a known field selector: only "metadata.name", "metadata.namespace"'


@dataclass(frozen=True)
class FieldLabel:
    """A selectable field: where its value lives, what an absent field reads as, and the first minor serving it."""

    path: tuple[str, ...]
    default: str = ""
    since_minor: int = 0

    def served_in(self, minor: int) -> bool:
        return minor >= self.since_minor


@dataclass(frozen=True)
class FieldLabelRules:
    """One kind's field label conversion: the labels it accepts and the text of its refusal."""

    labels: Mapping[str, FieldLabel]
    refusal: str
    source: str

    def supported(self, minor: int) -> tuple[str, ...]:
        return tuple(name for name, label in self.labels.items() if label.served_in(minor))


def _meta(namespaced: bool) -> dict[str, FieldLabel]:
    out = {"metadata.name": FieldLabel(("metadata", "name"))}
    if namespaced:
        out["metadata.namespace"] = FieldLabel(("metadata", "namespace"))
    return out


def _rules(refusal: str, source: str, /, *, namespaced: bool, **labels: FieldLabel | str) -> FieldLabelRules:
    # Keyword names cannot hold dots: callers write spec__nodeName for spec.nodeName.
    out = _meta(namespaced)
    for name, spec in labels.items():
        label = FieldLabel(tuple(spec.split("."))) if isinstance(spec, str) else spec
        out[name.replace("__", ".")] = label
    return FieldLabelRules(MappingProxyType(out), refusal, source)


CORE_V1: Final = "pkg/apis/core/v1/conversion.go"
RESOURCE: Final = "pkg/apis/resource/{v1,v1beta1,v1beta2}/conversion.go"

# (group, plural) -> the kind's own conversion function. Kinds not listed have none upstream and get
# DEFAULT_RULES; custom resources get custom_rules().
BUILTIN: Final[Mapping[tuple[str, str], FieldLabelRules]] = MappingProxyType({
    ("", "pods"): _rules(
        PLAIN, CORE_V1, namespaced=True,
        spec__nodeName="spec.nodeName", spec__restartPolicy="spec.restartPolicy",
        spec__schedulerName="spec.schedulerName", spec__serviceAccountName="spec.serviceAccountName",
        spec__hostNetwork=FieldLabel(("spec", "hostNetwork"), "false"), status__phase="status.phase",
        status__podIP="status.podIP", status__nominatedNodeName="status.nominatedNodeName",
        # Old v1 clients' name for spec.nodeName, converted to it.
        spec__host="spec.nodeName",
    ),
    ("", "nodes"): _rules(PLAIN, CORE_V1, namespaced=False,
                          spec__unschedulable=FieldLabel(("spec", "unschedulable"), "false")),
    ("", "namespaces"): _rules(PLAIN, CORE_V1, namespaced=False, status__phase="status.phase"),
    ("", "events"): _rules(
        PLAIN, CORE_V1, namespaced=True,
        involvedObject__kind="involvedObject.kind", involvedObject__namespace="involvedObject.namespace",
        involvedObject__name="involvedObject.name", involvedObject__uid="involvedObject.uid",
        involvedObject__apiVersion="involvedObject.apiVersion",
        involvedObject__resourceVersion="involvedObject.resourceVersion",
        involvedObject__fieldPath="involvedObject.fieldPath", reason="reason",
        reportingComponent="reportingComponent", source="source.component", type="type",
    ),
    ("", "secrets"): _rules(PLAIN, CORE_V1, namespaced=True, type="type"),
    ("", "services"): _rules(PLAIN, CORE_V1, namespaced=True, spec__clusterIP="spec.clusterIP",
                             spec__type="spec.type"),
    ("batch", "jobs"): _rules(BATCH_JOB, "pkg/apis/batch/v1/conversion.go", namespaced=True,
                              status__successful=FieldLabel(("status", "succeeded"), "0")),
    ("resource.k8s.io", "resourceslices"): _rules(
        WITH_GVK, RESOURCE, namespaced=False,
        spec__nodeName="spec.nodeName", spec__driver="spec.driver",
        spec__pool__name=FieldLabel(("spec", "pool", "name"), since_minor=38),  # PR 138456, after 1.37.0-beta.0
    ),
})

DEFAULT_RULES: Final = FieldLabelRules(
    MappingProxyType(_meta(True)), DEFAULT_META,
    "staging/src/k8s.io/apimachinery/pkg/runtime/conversion.go (DefaultMetaV1FieldSelectorConversion)",
)
CUSTOM_SOURCE: Final = "staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/conversion/converter.go"


def builtin_rules(group: str, plural: str) -> FieldLabelRules:
    return BUILTIN.get((group, plural), DEFAULT_RULES)


def custom_rules(namespaced: bool, selectable: Mapping[str, FieldLabel]) -> FieldLabelRules:
    """A custom resource: metadata.name, metadata.namespace when namespaced, and the CRD's selectableFields."""
    return FieldLabelRules(MappingProxyType({**_meta(namespaced), **selectable}), PLAIN, CUSTOM_SOURCE)


def refusal(rules: FieldLabelRules, label: str, *, group: str, version: str, kind: str) -> str:
    gvk = f"{group}/{version}, Kind={kind}"
    return rules.refusal.format(label=label, gvk=gvk)
