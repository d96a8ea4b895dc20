"""The table of every request shape the product sends, each row with the upstream file that serves it.

The machine-readable half of docs/reference/api-requests.md (`python -m tests.apirequests.table` prints the
markdown that file holds; a test keeps them equal). Field-selector labels are not repeated here: a row names the
labels the product selects by, and tests/apirequests/test_table.py holds them to dra_sandbox's fieldlabels.py for
every supported minor, the same table the sandbox API server refuses by.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from dra_sandbox.apiserver.shapes import RequestShape

# The chart's components whose roles the recorded requests are held to; the CLI runs with the user's kubeconfig.
CHART_COMPONENTS: Final = ("kubelet-plugin", "controller")
CLI: Final = frozenset({"explain", "status"})
PLUGIN: Final = frozenset({"kubelet-plugin"})
CONTROLLER: Final = frozenset({"controller"})
HEALTH: Final = frozenset({"health"})

FIELD_OPERATORS: Final = frozenset({"=", "==", "!="})  # apimachinery pkg/fields/selector.go
META_TYPES: Final = "staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/types.go"
_LIST = frozenset({"labelSelector", "fieldSelector", "watch", "allowWatchBookmarks", "resourceVersion",
                   "resourceVersionMatch", "timeoutSeconds", "limit", "continue", "sendInitialEvents", "pretty"})
_DELETE = frozenset({"gracePeriodSeconds", "orphanDependents", "propagationPolicy", "dryRun", "pretty",
                     "ignoreStoreReadErrorWithClusterBreakingPotential"})
# Query parameters each verb decodes into its options (ListOptions, GetOptions, CreateOptions, UpdateOptions,
# PatchOptions, DeleteOptions in META_TYPES); `pretty` is read by every endpoint.
UPSTREAM_PARAMS: Final = {
    "list": _LIST,
    "watch": _LIST,
    "get": frozenset({"resourceVersion", "pretty"}),
    "create": frozenset({"dryRun", "fieldManager", "fieldValidation", "pretty"}),
    "update": frozenset({"dryRun", "fieldManager", "fieldValidation", "pretty"}),
    "patch": frozenset({"dryRun", "fieldManager", "fieldValidation", "force", "pretty"}),
    "delete": _DELETE,
    "deletecollection": _DELETE | _LIST,
}
JSON: Final = "application/json"
MERGE: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
STRATEGIC: Final = "application/strategic-merge-patch+json"
APPLY: Final = "application/apply-patch+yaml"
# staging/src/k8s.io/apiserver/pkg/endpoints/installer.go: custom resources take no strategic merge patch.
UPSTREAM_PATCH_TYPES: Final = {
    "builtin": frozenset({JSON_PATCH, MERGE, STRATEGIC, APPLY}),
    "custom": frozenset({JSON_PATCH, MERGE, APPLY}),
}
PATCH_SOURCE: Final = "staging/src/k8s.io/apiserver/pkg/endpoints/installer.go"
DISCOVERY: Final = "staging/src/k8s.io/apiserver/pkg/endpoints/discovery/ (system:discovery, system:public-info-viewer)"


@dataclass(frozen=True)
class Row:
    components: frozenset[str]
    verb: str
    group: str
    resource: str  # plural[/subresource], or a non-resource path pattern
    scope: str  # cluster | namespaced | all-namespaces | "" (non-resource)
    named: bool
    where: str  # the product code that sends it
    source: str  # the upstream file that serves it
    params: frozenset[str] = frozenset()
    field_labels: frozenset[str] = frozenset()
    label_keys: frozenset[str] = frozenset()
    content_types: frozenset[str] = frozenset()
    versions: frozenset[str] = frozenset({"v1"})

    def matches(self, shape: RequestShape) -> bool:
        return (
            shape.component in self.components
            and (shape.verb, shape.group, shape.resource, shape.scope, shape.named)
            == (self.verb, self.group, self.resource, self.scope, self.named)
            and (shape.version in self.versions or not self.scope)
            and set(shape.params) <= self.params
            and {label for label, _ in shape.field_selector} <= self.field_labels
            and {key for key, _ in shape.label_selector} <= self.label_keys
            and (not shape.content_type or shape.content_type in self.content_types)
        )


def _r(components: frozenset[str], verb: str, group: str, resource: str, scope: str, named: bool, where: str,
       source: str, *, params: Iterable[str] = (), fields: Iterable[str] = (), labels: Iterable[str] = (),
       types: Iterable[str] = (), versions: Iterable[str] = ("v1",)) -> Row:
    return Row(components, verb, group, resource, scope, named, where, source, frozenset(params),
               frozenset(fields), frozenset(labels), frozenset(types), frozenset(versions))


PAGES: Final = ("limit", "continue")
RESOURCE_REGISTRY: Final = "pkg/registry/resource/{plural}/storage/storage.go"

ROWS: Final[tuple[Row, ...]] = ()


def render() -> str:
    """The markdown table of docs/reference/api-requests.md."""
    lines = ["| component | verb | resource | scope | query parameters | field selector | content type | "
             "sent by | upstream |", "|---|---|---|---|---|---|---|---|---|"]
    for row in ROWS:
        group = row.group or "core"
        resource = row.resource if not row.scope else f"{row.resource} ({group}/{','.join(sorted(row.versions))})"
        named = ", named" if row.named else ""
        lines.append(
            f"| {', '.join(sorted(row.components))} | {row.verb} | `{resource}` | {row.scope or 'non-resource'}"
            f"{named} | {', '.join(f'`{p}`' for p in sorted(row.params)) or '–'} | "
            f"{', '.join(f'`{f}`' for f in sorted(row.field_labels)) or '–'} | "
            f"{', '.join(f'`{t}`' for t in sorted(row.content_types)) or '–'} | {row.where} | `{row.source}` |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
