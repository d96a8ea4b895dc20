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
CHART_COMPONENTS: Final = ("kubelet-plugin", "controller", "compute-domain-kubelet-plugin", "compute-domain-daemon")
CLI: Final = frozenset({"explain", "status"})
PLUGIN: Final = frozenset({"kubelet-plugin"})
CD_PLUGIN: Final = frozenset({"compute-domain-kubelet-plugin"})
# Both kubelet plugins: the compute-domain plugin is a second container of the plugin pod and shares the slice
# publisher, the claim source, Events and discovery with the GPU plugin.
PLUGINS: Final = PLUGIN | CD_PLUGIN
# Components that run under another component's service account, so its roles grant them too: the compute-domain
# plugin runs in the plugin pod (its own roles add only what the GPU plugin does not need).
SAME_ACCOUNT: Final[dict[str, tuple[str, ...]]] = {"compute-domain-kubelet-plugin": ("kubelet-plugin",)}
CONTROLLER: Final = frozenset({"controller"})
HEALTH: Final = frozenset({"health"})
CD_DAEMON: Final = frozenset({"compute-domain-daemon"})

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
WATCH_LIST: Final = ("staging/src/k8s.io/apiserver/pkg/storage/cacher/cacher.go (sendInitialEvents, WatchList gate: "
                     "staging/src/k8s.io/apiserver/pkg/features/kube_features.go)")
RESOURCE_REGISTRY: Final = "pkg/registry/resource/{plural}/storage/storage.go"

WATCH: Final = ("watch", "allowWatchBookmarks", "resourceVersion", "timeoutSeconds")
SLICE_LABELS: Final = "pkg/apis/resource/v1/conversion.go (ResourceSlice field labels)"
CORE_LABELS: Final = "pkg/apis/core/v1/conversion.go (Pod field labels)"
RS: Final = "resource.k8s.io"
POLICY_GROUP: Final = "gpu.dra.dev"
CRD_HANDLER: Final = "staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/customresource_handler.go"
HANDLERS: Final = "staging/src/k8s.io/apiserver/pkg/endpoints/handlers/"
CRUD: Final = HANDLERS + "{get,create,update,delete}.go"
PLUGIN_EVENTS: Final = "k8s/events.py: Events on claims and Nodes"
# DeviceTaintRule: v1alpha3 (1.33+, alpha), v1beta2 (1.36+), v1 (1.37); each only where its gate is on. The product
# sends none of these before discovery found the kind in that version (tests/apirequests/test_table.py).
TAINT_RULES: Final = "pkg/registry/resource/devicetaintrule/storage/storage.go"
TAINT_RULE_VERSIONS: Final = ("v1", "v1beta2", "v1alpha3")
# ResourcePoolStatusRequest: v1alpha3 from 1.36, where the gate DRAResourcePoolStatus is on (its status is filled by
# pkg/controller/resourcepoolstatusrequest/controller.go).
POOL_STATUS: Final = "pkg/registry/resource/resourcepoolstatusrequest/storage/storage.go"

ROWS: Final[tuple[Row, ...]] = (
    # --- the kubelet plugin (charts/dra-driver/README.md, "Every API request the plugin makes") ---
    _r(PLUGINS, "list", RS, "resourceslices", "cluster", False, "slices/publisher.py: its node's slices, each pass",
       SLICE_LABELS, params=("fieldSelector", "resourceVersion", *PAGES), fields=("spec.nodeName", "spec.driver")),
    _r(PLUGINS, "watch", RS, "resourceslices", "cluster", False, "slices/publisher.py: wakes on foreign changes",
       SLICE_LABELS, params=("fieldSelector", *WATCH), fields=("spec.nodeName", "spec.driver")),
    _r(PLUGINS, "create", RS, "resourceslices", "cluster", False, "slices/publisher.py: new slices", CRUD,
       types=(JSON,)),
    _r(PLUGINS, "update", RS, "resourceslices", "cluster", True, "slices/publisher.py: repair in place", CRUD,
       types=(JSON,)),
    _r(PLUGINS, "delete", RS, "resourceslices", "cluster", True,
       "slices/publisher.py: old generations, strays (UID precondition in the body)", CRUD, types=(JSON,)),
    _r(PLUGINS, "get", RS, "resourceslices", "cluster", True, "slices/publisher.py: re-read after a 409", CRUD),
    _r(PLUGIN, "create", RS, "resourceslices", "cluster", False,
       "k8s/serverfeatures.py: at start, a dry-run create per gated field the flags ask for (nothing is stored)", CRUD,
       params=("dryRun", "fieldValidation"), types=(JSON,)),
    _r(PLUGINS, "get", RS, "resourceclaims", "namespaced", True, "kubeletplugin/claims.py: prepare, stale-claim sweep", CRUD),
    _r(PLUGIN, "list", RS, "resourceclaims", "all-namespaces", False,
       "plugin: claim ownership after a lost checkpoint", CRUD, params=PAGES),
    _r(PLUGINS, "get", "", "nodes", "cluster", True, "plugin/app.py: its Node, once at start (no polling)", CRUD),
    _r(PLUGIN, "patch", "", "nodes", "cluster", True,
       "plugin/driverreport.py: the gpu.dra.dev/nvidia-driver annotation, on each driver state change", PATCH_SOURCE,
       types=(MERGE,)),
    _r(PLUGINS, "create", "", "events", "namespaced", False, PLUGIN_EVENTS, CRUD, types=(JSON,)),
    _r(PLUGINS, "patch", "", "events", "namespaced", True, PLUGIN_EVENTS + " (series count)", PATCH_SOURCE,
       types=(MERGE,)),
    _r(PLUGIN, "patch", RS, "resourceclaims/status", "namespaced", True,
       "plugin/devicestatus.py: this driver's status.devices entries (resourceVersion precondition in the body)",
       PATCH_SOURCE, types=(MERGE,)),
    _r(PLUGINS, "get", "", "/version", "", False, "slices: the layout for the cluster's minor", DISCOVERY),
    # --- the compute-domain kubelet plugin (its own roles in the chart: templates/computedomains.yaml) ---
    _r(CD_PLUGIN, "list", "gpu.dra.dev", "computedomains", "all-namespaces", False,
       "computedomain/plugin/domains.py: a claim's domain by UID", CRD_HANDLER, versions=("v1beta1",)),
    _r(CD_PLUGIN, "get", "gpu.dra.dev", "computedomaincliques", "namespaced", True,
       "computedomain/plugin/domains.py: readiness of this node's IMEX daemon", CRD_HANDLER, versions=("v1beta1",)),
    _r(CD_PLUGIN, "list", "gpu.dra.dev", "computedomaincliques", "namespaced", False,
       "computedomain/plugin/domains.py: one domain per clique", CRD_HANDLER, versions=("v1beta1",)),
    _r(CD_PLUGIN, "patch", "", "nodes", "cluster", True,
       "computedomain/plugin/domains.py: the computeDomain (and clique) label, resourceVersion precondition",
       PATCH_SOURCE, types=(MERGE,)),
    # --- the controller: its reconcilers and kopf (User-Agent kopf/<version>) ---
    *(_r(CONTROLLER, "get", "", path, "", False, "kopf: API discovery", DISCOVERY)
      for path in ("/api", "/api/v1", "/apis", "/apis/{group}", "/apis/{group}/{version}", "/version")),
    _r(CONTROLLER, "list", POLICY_GROUP, "gpusharingpolicies", "cluster", False, "kopf: the policies' watch-list",
       CRD_HANDLER, params=PAGES, versions=("v1beta1",)),
    _r(CONTROLLER, "watch", POLICY_GROUP, "gpusharingpolicies", "cluster", False, "kopf: the policies' watch",
       CRD_HANDLER, params=WATCH, versions=("v1beta1",)),
    _r(CONTROLLER, "patch", POLICY_GROUP, "gpusharingpolicies", "cluster", True,
       "kopf: finalizer and progress annotations", PATCH_SOURCE, types=(MERGE, JSON_PATCH), versions=("v1beta1",)),
    _r(CONTROLLER, "patch", POLICY_GROUP, "gpusharingpolicies/status", "cluster", True,
       "controller/operator.py: the policy's status", PATCH_SOURCE, types=(MERGE,), versions=("v1beta1",)),
    _r(CONTROLLER, "get", RS, "deviceclasses", "cluster", True, "controller/reconcile.py: the rendered class", CRUD),
    _r(CONTROLLER, "create", RS, "deviceclasses", "cluster", False, "controller/reconcile.py", CRUD, types=(JSON,)),
    _r(CONTROLLER, "update", RS, "deviceclasses", "cluster", True, "controller/reconcile.py", CRUD, types=(JSON,)),
    *(_r(CONTROLLER, verb, RS, "resourceclaims", "all-namespaces", False,
         f"controller/informer.py: claims, for the policies' status ({why})", CRUD,
         params=WATCH if verb == "watch" else PAGES) for verb, why in (("list", "paged; again after 410"),
                                                                       ("watch", "from the LIST's version"))),
    *(_r(CONTROLLER, verb, RS, "resourceslices", "cluster", False,
         f"controller/informer.py: the driver's slices, for the policies' status ({why})", SLICE_LABELS,
         params=("fieldSelector", *(WATCH if verb == "watch" else PAGES)), fields=("spec.driver",))
      for verb, why in (("list", "paged; again after 410"), ("watch", "from the LIST's version"))),
    _r(CONTROLLER, "delete", RS, "resourceslices", "cluster", True,
       "controller: slices of Nodes that are gone (UID precondition)", CRUD, types=(JSON,)),
    _r(CONTROLLER, "get", "", "nodes", "cluster", True, "controller: is a slice's Node gone", CRUD),
    *(_r(CONTROLLER, verb, "", "nodes", "cluster", False, "controller/informer.py: Nodes, for slice hygiene", CRUD,
         params=WATCH if verb == "watch" else PAGES) for verb in ("list", "watch")),
    *(_r(CONTROLLER, verb, "apiextensions.k8s.io", "customresourcedefinitions", "cluster", False,
         "kopf: CRDs (resource discovery)", CRUD, params=WATCH if verb == "watch" else PAGES)
      for verb in ("list", "watch")),
    _r(CONTROLLER, "create", "", "events", "namespaced", False, "kopf: Events on policies", CRUD, types=(JSON,)),
    _r(CONTROLLER, "get", "coordination.k8s.io", "leases", "namespaced", True, "controller/leader.py", CRUD),
    _r(CONTROLLER, "create", "coordination.k8s.io", "leases", "namespaced", False, "controller/leader.py", CRUD,
       types=(JSON,)),
    _r(CONTROLLER, "update", "coordination.k8s.io", "leases", "namespaced", True, "controller/leader.py", CRUD,
       types=(JSON,)),
    # --- the controller's ComputeDomain reconciler (controller/computedomains/loop.py; docs/compute-domains.md) ---
    *(_r(CONTROLLER, verb, POLICY_GROUP, "computedomains", "all-namespaces", False, why, CRD_HANDLER,
         params=WATCH if verb == "watch" else PAGES, versions=("v1beta1",))
      for verb, why in (("list", "computedomains/loop.py: every pass (and kopf's watch-list)"),
                        ("watch", "kopf: wakes the ComputeDomain loop"))),
    _r(CONTROLLER, "patch", POLICY_GROUP, "computedomains", "namespaced", True,
       "computedomains/loop.py: the finalizer (resourceVersion precondition in the body)", PATCH_SOURCE,
       types=(MERGE,), versions=("v1beta1",)),
    _r(CONTROLLER, "patch", POLICY_GROUP, "computedomains/status", "namespaced", True,
       "computedomains/loop.py: status.status, status.nodes, the Ready condition", PATCH_SOURCE, types=(MERGE,),
       versions=("v1beta1",)),
    _r(CONTROLLER, "list", POLICY_GROUP, "computedomaincliques", "namespaced", False,
       "computedomains/loop.py: the driver namespace's cliques, every pass", CRD_HANDLER, params=PAGES,
       versions=("v1beta1",)),
    *(_r(CONTROLLER, verb, POLICY_GROUP, "computedomaincliques", "namespaced", True,
         f"computedomains/loop.py: {why}", CRD_HANDLER, types=(JSON,) if verb == "update" else (),
         versions=("v1beta1",))
      for verb, why in (("get", "prune: re-read"), ("update", "prune entries without a daemon pod (resourceVersion)"),
                        ("delete", "the domain's cliques, on deletion"))),
    _r(CONTROLLER, "list", "", "pods", "namespaced", False,
       "computedomains/loop.py: the daemon pods (label gpu.dra.dev/computeDomain)", CRUD,
       params=("labelSelector", *PAGES),
       labels=("gpu.dra.dev/computeDomain",)),
    *(_r(CONTROLLER, verb, RS, "resourceclaimtemplates", "namespaced", named, f"computedomains/loop.py: {why}",
         PATCH_SOURCE if verb == "patch" else CRUD, types=types)
      for verb, named, why, types in (
          ("get", True, "the domain's workload and daemon templates", ()),
          ("create", False, "the templates", (JSON,)),
          ("patch", True, "the finalizer, on deletion", (MERGE,)),
          ("delete", True, "the templates, on deletion (UID precondition)", (JSON,)))),
    *(_r(CONTROLLER, verb, "apps", "daemonsets", "namespaced", named, f"computedomains/loop.py: {why}", CRUD,
         types=types)
      for verb, named, why, types in (
          ("get", True, "the IMEX daemon DaemonSet", ()), ("create", False, "the IMEX daemon DaemonSet", (JSON,)),
          ("update", True, "a changed pod template", (JSON,)), ("delete", True, "on deletion", (JSON,)))),
    _r(CONTROLLER, "list", "", "nodes", "cluster", False,
       "computedomains/loop.py: nodes labelled for a deleted domain", CRUD, params=("labelSelector", *PAGES),
       labels=("gpu.dra.dev/computeDomain",)),
    _r(CONTROLLER, "list", RS, "resourceslices", "cluster", False,
       "computedomains/loop.py: a waiting channel's clique (its node's compute-domain slices)", SLICE_LABELS,
       params=("fieldSelector", *PAGES), fields=("spec.nodeName", "spec.driver")),
    _r(CONTROLLER, "patch", "", "nodes", "cluster", True,
       "computedomains/loop.py: the gpu.dra.dev/computeDomain label", PATCH_SOURCE, types=(MERGE,)),
    _r(CONTROLLER, "patch", RS, "resourceclaims/status", "namespaced", True,
       "computedomains/loop.py: binding conditions in status.devices (resourceVersion precondition in the body)",
       PATCH_SOURCE, types=(MERGE,)),
    _r(CONTROLLER, "patch", "", "events", "namespaced", True,
       "k8s/events.py: Events on ComputeDomains (series count)", PATCH_SOURCE, types=(MERGE,)),
    # --- `dra-driver explain` and `dra-driver status` (the user's kubeconfig; commands/listing.py pages) ---
    _r(CLI, "list", RS, "resourceslices", "cluster", False,
       "explain (all nodes: every slice, in pages by default); explain/status --node: spec.nodeName per node and "
       "= (none), spec.driver to complete pools", SLICE_LABELS,
       params=("fieldSelector", *PAGES), fields=("spec.nodeName", "spec.driver")),
    # KEP-3157 watch-list (explain --watch-list): 1.34-1.37 serve it with the WatchList gate on by default; refused
    # (422 with the gate off, 403 without `watch`) or cut short, explain falls back to the paged LIST above
    # (k8s/liststream.py).
    _r(frozenset({"explain"}), "watch", RS, "resourceslices", "cluster", False,
       "explain --watch-list (all nodes): every slice as a watch-list (sendInitialEvents, ends at the "
       "initial-events-end bookmark)",
       WATCH_LIST, params=("watch", "sendInitialEvents", "allowWatchBookmarks", "resourceVersionMatch",
                           "resourceVersion", "timeoutSeconds")),
    _r(CLI, "list", RS, "resourceclaims", "all-namespaces", False, "explain: claims in use; status: holders", CRUD,
       params=PAGES),
    _r(frozenset({"explain"}), "get", RS, "resourceclaims", "namespaced", True, "explain: the claim", CRUD),
    _r(frozenset({"explain"}), "get", "", "nodes", "cluster", True, "explain --node", CRUD),
    _r(frozenset({"explain"}), "list", "", "nodes", "cluster", False, "explain", CRUD, params=PAGES),
    _r(frozenset({"explain"}), "get", "", "namespaces", "cluster", True, "explain: the claim's namespace labels",
       CRUD),
    _r(frozenset({"explain"}), "list", RS, "deviceclasses", "cluster", False, "explain", CRUD, params=PAGES),
    _r(frozenset({"status"}), "list", "", "nodes", "cluster", False,
       "status: the gpu.dra.dev/nvidia-driver annotation of every Node", CRUD, params=PAGES),
    _r(frozenset({"status"}), "get", "", "nodes", "cluster", True, "status --node: that Node's driver annotation",
       CRUD),
    _r(frozenset({"status"}), "list", "", "pods", "all-namespaces", False, "status: pods (one node: spec.nodeName)",
       CORE_LABELS, params=("fieldSelector", *PAGES), fields=("spec.nodeName",)),
    _r(CLI, "list", RS, "devicetaintrules", "cluster", False,
       "explain/status: their taints count as the slices' (k8s/taintrules.py)", TAINT_RULES, params=PAGES,
       versions=TAINT_RULE_VERSIONS),
    # `status --pool-status` (KEP-5677, alpha): only after discovery found the kind (commands/poolstatus.py).
    *(_r(frozenset({"status"}), verb, RS, "resourcepoolstatusrequests", "cluster", named,
         f"status --pool-status: {why}", POOL_STATUS, types=(JSON,) if verb == "create" else (), params=params,
         fields=("metadata.name",) if params else (), versions=("v1alpha3",))
      for verb, named, params, why in (
          ("create", False, (), "one request for the driver's pools"),
          ("get", True, (), "the answer, if already there"),
          ("watch", False, ("fieldSelector", *WATCH), "until kube-controller-manager answers"),
          ("delete", True, (), "the request, whatever happened"))),
    # --- `dra-driver health` (the admin's kubeconfig) ---
    *(_r(HEALTH, verb, RS, "devicetaintrules", "cluster", named, f"commands/health.py: {why}", TAINT_RULES,
         types=(JSON,) if verb in ("create", "update") else (), params=PAGES if verb == "list" else (),
         versions=TAINT_RULE_VERSIONS)
      for verb, named, why in (("create", False, "taint"), ("get", True, "taint: re-read after 409"),
                               ("update", True, "taint: replace an existing rule"), ("delete", True, "clear"),
                               ("list", False, "show"))),
    _r(HEALTH, "list", "", "nodes", "cluster", False, "commands/health.py migrate: the legacy annotation", CRUD,
       params=PAGES),
    _r(HEALTH, "patch", "", "nodes", "cluster", True, "commands/health.py migrate: removes the legacy annotation",
       PATCH_SOURCE, types=(MERGE,)),
    # DeviceTaintRule discovery before any request to the kind (k8s/taintrules.py): the group, then served versions.
    *(_r(frozenset({"health", "explain", "status"}), "get", "", path, "", False, "k8s/taintrules.py: which version serves "
         "devicetaintrules", DISCOVERY) for path in ("/apis/{group}", "/apis/{group}/{version}")),
    # --- `dra-driver compute-domain-daemon run` (the daemon pod's service account): its own clique entry ---
    *(_r(CD_DAEMON, verb, POLICY_GROUP, "computedomaincliques", "namespaced", named,
         f"computedomain/daemon/: {why}", CRD_HANDLER, types=(JSON,) if verb in ("create", "update") else (),
         params=params, fields=("metadata.name",) if params else (), versions=("v1beta1",))
      for verb, named, params, why in (
          ("get", True, (), "read before each write of the own entry"),
          ("create", False, (), "the first daemon of a clique creates it"),
          ("update", True, (), "the own entry (resourceVersion in the body; again on 409)"),
          ("list", False, ("fieldSelector",), "the clique, before watching"),
          ("watch", False, ("fieldSelector", *WATCH), "peers joining and leaving"))),
)


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
            f"{named} | {', '.join(f'`{p}`' for p in sorted(row.params)) or '-'} | "
            f"{', '.join(f'`{f}`' for f in sorted(row.field_labels)) or '-'} | "
            f"{', '.join(f'`{t}`' for t in sorted(row.content_types)) or '-'} | {row.where} | `{row.source}` |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
