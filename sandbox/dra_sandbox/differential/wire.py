"""Part (a): the requests of the wire inventory (tests/apirequests/table.py, docs/reference/api-requests.md), each
sent as a concrete request (verb, path, query, patch type, body), plus the refusals a real API server gives to the
same shapes with bad values: a field label it does not serve, a patch type the kind refuses, a stale
resourceVersion or UID precondition, an invalid body, a missing object.

The steps run in order on each side, from an empty cluster; a step's body may be built from what earlier steps got
back (a resourceVersion, a uid). Compared per step: the status code, and for a refusal its `reason` and the
sorted `details.causes[].field` paths. Messages are recorded for the report but not compared.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from dra_driver.defaults import DRIVER_NAME
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_sandbox.polling import wait_for

from .fleet import Fleet

REPO_ROOT: Final = Path(__file__).resolve().parents[3]
CRD_DIR: Final = REPO_ROOT / "charts" / "dra-driver" / "crds"
NS: Final = "wire"
NODE: Final = "wire-node"
RS: Final = "/apis/resource.k8s.io/v1"
GPU_GROUP: Final = "/apis/gpu.dra.dev/v1beta1"
JSON: Final = "application/json"
MERGE: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
STRATEGIC: Final = "application/strategic-merge-patch+json"

Body = JsonObject | list[Any] | Callable[[Mapping[str, JsonObject]], Any] | None


@dataclass(frozen=True)
class Step:
    id: str
    method: str
    path: str
    body: Body = None
    query: Mapping[str, str | int | bool] = field(default_factory=dict)
    content_type: str = JSON
    row: str = ""  # the inventory row it exercises (verb resource)


@dataclass(frozen=True)
class Outcome:
    id: str
    status: int
    reason: str  # "" on success
    fields: tuple[str, ...]
    message: str = ""

    def compared(self) -> str:
        if 200 <= self.status < 300:
            return str(self.status)
        return f"{self.status} {self.reason} {list(self.fields)}"


def _rv(state: Mapping[str, JsonObject], step: str) -> str:
    return str(state[step]["metadata"]["resourceVersion"])


def _uid(state: Mapping[str, JsonObject], step: str) -> str:
    return str(state[step]["metadata"]["uid"])


def _with(obj: JsonObject, **meta: Any) -> JsonObject:
    out = copy.deepcopy(obj)
    out["metadata"].update(meta)
    return out


def _grouped(slice_obj: JsonObject, name: str, groups: list[str]) -> JsonObject:
    """A one-device slice whose device draws from a counter set with these KEP-5963 compatibility groups."""
    out = _with(slice_obj, name=name)
    out["spec"] = {k: v for k, v in slice_obj["spec"].items() if k not in ("devices", "sharedCounters")}
    out["spec"]["sharedCounters"] = [{"name": "set", "counters": {"gpu": {"value": "1"}}}]
    out["spec"]["devices"] = [{"name": "gpu-0", "consumesCounters": [
        {"counterSet": "set", "counters": {"gpu": {"value": "1"}}, "compatibilityGroups": groups}]}]
    return out


def _typed(slice_obj: JsonObject, name: str, attributes: JsonObject) -> JsonObject:
    """A one-device slice naming a KEP-5677 partition type attribute; its counter-consuming device has `attributes`."""
    out = _grouped(slice_obj, name, [])
    del out["spec"]["devices"][0]["consumesCounters"][0]["compatibilityGroups"]
    out["spec"]["devices"][0]["attributes"] = attributes
    out["spec"]["partitionTypeAttribute"] = f"{DRIVER_NAME}/partitionType"
    return out


def crds() -> list[JsonObject]:
    return [yaml.safe_load(p.read_text()) for p in sorted(CRD_DIR.glob("*.yaml"))]


def steps(fleet: Fleet) -> list[Step]:
    [slice_obj, *_] = fleet.slices(NODE, "l4")
    node = fleet.node(NODE, "l4")
    claim: JsonObject = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                         "metadata": {"name": "c", "namespace": NS},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME}}]}}}
    template: JsonObject = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "t", "namespace": NS}, "spec": {"spec": claim["spec"]}}
    device_class: JsonObject = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                    "metadata": {"name": "wire.gpu.dra.dev"},
                    "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER_NAME}'"}}]}}
    lease: JsonObject = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                         "metadata": {"name": "l", "namespace": NS},
                         "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}
    event: JsonObject = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e", "namespace": NS},
             "involvedObject": {"kind": "Node", "name": NODE, "apiVersion": "v1"}, "reason": "Test", "message": "m",
             "type": "Normal", "source": {"component": "dra-driver"}, "count": 1}
    policy: JsonObject = {"apiVersion": "gpu.dra.dev/v1beta1", "kind": "GpuSharingPolicy", "metadata": {"name": "p"},
              "spec": {"devices": {"type": "gpu"}, "sharing": {"strategy": "TimeSlicing"}}}
    clique: JsonObject = {"apiVersion": "gpu.dra.dev/v1beta1", "kind": "ComputeDomainClique",
              "metadata": {"name": "q", "namespace": NS},
              "daemons": [{"nodeName": NODE, "ipAddress": "10.0.0.1", "cliqueID": "c", "index": 0}]}
    daemonset: JsonObject = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d", "namespace": NS},
                 "spec": {"selector": {"matchLabels": {"app": "d"}}, "template": {
                     "metadata": {"labels": {"app": "d"}},
                     "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}
    rule: JsonObject = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": "r"},
            "spec": {"deviceSelector": {"driver": DRIVER_NAME, "pool": NODE, "device": "gpu-0"},
                     "taint": {"key": f"{DRIVER_NAME}/xid", "value": "79", "effect": "NoSchedule"}}}
    slices = f"{RS}/resourceslices"
    slice_path = f"{slices}/{slice_obj['metadata']['name']}"
    claims = f"{RS}/namespaces/{NS}/resourceclaims"
    out: list[Step] = [
        # --- what the rest needs; compared too ---
        Step("namespace create", "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                                "metadata": {"name": NS}}),
        *(Step(f"crd create {c['metadata']['name']}", "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
               c) for c in crds()),
        Step("node create", "POST", "/api/v1/nodes", node, row="create nodes"),
        Step("deviceclass create", "POST", f"{RS}/deviceclasses", device_class, row="create deviceclasses"),
        # --- discovery ---
        *(Step(f"discovery {p}", "GET", p, row="get discovery") for p in (
            "/api", "/api/v1", "/apis", "/apis/resource.k8s.io", "/apis/resource.k8s.io/v1", "/version",
            "/apis/gpu.dra.dev", "/apis/no.such.group", "/apis/resource.k8s.io/v9")),
        # --- resourceslices (the kubelet plugin's publisher, the controller, explain) ---
        Step("slice create", "POST", slices, slice_obj, row="create resourceslices"),
        Step("slice create again", "POST", slices, slice_obj, row="create resourceslices"),
        Step("slice create without driver", "POST", slices,
             _with({**slice_obj, "spec": {k: v for k, v in slice_obj["spec"].items() if k != "driver"}}, name="x1"),
             row="create resourceslices"),
        Step("slice create bad device name", "POST", slices, {**_with(slice_obj, name="x2"), "spec": {
            **slice_obj["spec"], "devices": [{"name": "GPU_0"}]}}, row="create resourceslices"),
        Step("slice create unknown field strict", "POST", slices, {**_with(slice_obj, name="x3"), "bogus": 1},
             query={"fieldValidation": "Strict"}, row="create resourceslices"),
        # KEP-5963 (1.37, DRADeviceCompatibilityGroups on for both sides): kept under Strict, at most 2 groups
        Step("slice create with compatibility groups", "POST", slices, _grouped(slice_obj, "x4", ["native"]),
             query={"fieldValidation": "Strict"}, row="create resourceslices"),
        Step("slice create three compatibility groups", "POST", slices, _grouped(slice_obj, "x5", ["a", "b", "c"]),
             row="create resourceslices"),
        # KEP-5677 partition types (1.37, DRAPartitionableDevicesType off on both sides): the field is dropped in
        # silence under Strict, before validation, so a device without the attribute is no error either
        Step("slice create with partition type attribute", "POST", slices,
             _typed(slice_obj, "x6", {"partitionType": {"string": "gpu-0/whole"}}),
             query={"fieldValidation": "Strict"}, row="create resourceslices"),
        Step("slice create partition type attribute missing", "POST", slices, _typed(slice_obj, "x7", {}),
             row="create resourceslices"),
        Step("slice get", "GET", slice_path, row="get resourceslices"),
        Step("slice get missing", "GET", f"{slices}/missing", row="get resourceslices"),
        Step("slice list by node", "GET", slices, query={"fieldSelector": f"spec.nodeName={NODE}", "limit": 10},
             row="list resourceslices"),
        Step("slice list by driver and node", "GET", slices,
             query={"fieldSelector": f"spec.driver={DRIVER_NAME},spec.nodeName!=other"}, row="list resourceslices"),
        Step("slice list by pool (not served)", "GET", slices, query={"fieldSelector": f"spec.pool.name={NODE}"},
             row="list resourceslices"),
        Step("slice list bad selector", "GET", slices, query={"fieldSelector": "spec.nodeName in (a)"},
             row="list resourceslices"),
        Step("slice list bad limit", "GET", slices, query={"limit": "many"}, row="list resourceslices"),
        Step("slice list bad continue", "GET", slices, query={"limit": 1, "continue": "garbage"},
             row="list resourceslices"),
        Step("slice update stale", "PUT", slice_path,
             lambda s: _with(s["slice get"], resourceVersion="1"), row="update resourceslices"),
        Step("slice update", "PUT", slice_path, lambda s: s["slice get"], row="update resourceslices"),
        Step("slice update name mismatch", "PUT", slice_path,
             lambda s: _with(s["slice update"], name="other"), row="update resourceslices"),
        Step("slice delete wrong uid", "DELETE", slice_path,
             {"apiVersion": "v1", "kind": "DeleteOptions",
              "preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}},
             row="delete resourceslices"),
        Step("slice delete", "DELETE", slice_path, lambda s: {
            "apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": _uid(s, "slice get")}},
            row="delete resourceslices"),
        Step("slice delete missing", "DELETE", slice_path, row="delete resourceslices"),
        # --- resourceclaims ---
        Step("claim create", "POST", claims, claim, row="create resourceclaims"),
        Step("claim create bad request name", "POST", claims, {**_with(claim, name="c2"), "spec": {"devices": {
            "requests": [{"name": "GPU", "exactly": {"deviceClassName": DRIVER_NAME}}]}}}, row="create resourceclaims"),
        Step("claim create both exactly and firstAvailable", "POST", claims, {**_with(claim, name="c3"), "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME},
                                      "firstAvailable": [{"name": "a", "deviceClassName": DRIVER_NAME}]}]}}},
             row="create resourceclaims"),
        Step("claim create bad cel", "POST", claims, {**_with(claim, name="c4"), "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME,
                                        "selectors": [{"cel": {"expression": "device.driver =="}}]}}]}}},
             row="create resourceclaims"),
        Step("claim create admin access unlabelled", "POST", claims, {**_with(claim, name="c5"), "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME, "adminAccess": True}}]}}},
             row="create resourceclaims"),
        Step("claim create config unknown request", "POST", claims, {**_with(claim, name="c6"), "spec": {"devices": {
            **claim["spec"]["devices"], "config": [{"requests": ["nope"], "opaque": {
                "driver": DRIVER_NAME, "parameters": {"kind": "GpuConfig"}}}]}}}, row="create resourceclaims"),
        Step("claim create count zero", "POST", claims, {**_with(claim, name="c7"), "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME, "count": 0}}]}}}, row="create resourceclaims"),
        Step("claim create capacity without class", "POST", claims, {**_with(claim, name="c8"), "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "",
                                                     "capacity": {"requests": {"memory": "1Gi"}}}}]}}},
             row="create resourceclaims"),
        # KEP-6080 (1.37, DRADerivedAttributes off on both sides): dropped without a word, even under Strict
        Step("claim create derived attributes", "POST", claims, {**_with(claim, name="c9"), "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME, "derivedAttributes": [
                {"name": f"{DRIVER_NAME}/socket", "expression": "1"}]}}],
            "constraints": [{"matchAttribute": f"{DRIVER_NAME}/socket"}]}}},
             query={"fieldValidation": "Strict"}, row="create resourceclaims"),
        Step("claim get", "GET", f"{claims}/c", row="get resourceclaims"),
        Step("claim get missing", "GET", f"{claims}/missing", row="get resourceclaims"),
        Step("claim list all namespaces", "GET", f"{RS}/resourceclaims", query={"limit": 1}, row="list resourceclaims"),
        Step("claim list by name", "GET", claims, query={"fieldSelector": "metadata.name=c"},
             row="list resourceclaims"),
        Step("claim list unknown label", "GET", claims, query={"fieldSelector": "status.allocation=x"},
             row="list resourceclaims"),
        Step("claim spec update (immutable)", "PUT", f"{claims}/c", lambda s: {**s["claim get"], "spec": {"devices": {
            "requests": [{"name": "other", "exactly": {"deviceClassName": DRIVER_NAME}}]}}},
             row="update resourceclaims"),
        Step("claim status patch devices without allocation", "PATCH", f"{claims}/c/status",
             {"status": {"devices": [{"driver": DRIVER_NAME, "pool": NODE, "device": "gpu-0"}]}},
             content_type=MERGE, row="patch resourceclaims/status"),
        Step("claim status patch stale", "PATCH", f"{claims}/c/status",
             {"metadata": {"resourceVersion": "1"}, "status": {}}, content_type=MERGE,
             row="patch resourceclaims/status"),
        Step("claim status patch reservedFor without allocation", "PATCH", f"{claims}/c/status",
             {"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}}, content_type=MERGE,
             row="patch resourceclaims/status"),
        Step("claim status patch allocation", "PATCH", f"{claims}/c/status", {"status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": DRIVER_NAME, "pool": NODE, "device": "gpu-0"}]}}}},
             content_type=MERGE, row="patch resourceclaims/status"),
        Step("claim status patch device status", "PATCH", f"{claims}/c/status", lambda s: {
            "metadata": {"resourceVersion": _rv(s, "claim status patch allocation")},
            "status": {"devices": [{"driver": DRIVER_NAME, "pool": NODE, "device": "gpu-0",
                                    "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared",
                                                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]}},
             content_type=MERGE, row="patch resourceclaims/status"),
        Step("claim status patch device not allocated", "PATCH", f"{claims}/c/status",
             {"status": {"devices": [{"driver": DRIVER_NAME, "pool": NODE, "device": "gpu-1"}]}}, content_type=MERGE,
             row="patch resourceclaims/status"),
        Step("claim status strategic patch", "PATCH", f"{claims}/c/status", {"metadata": {"labels": {"a": "b"}}},
             content_type=STRATEGIC, row="patch resourceclaims/status"),
        Step("claim delete while allocated", "DELETE", f"{claims}/c", row="delete resourceclaims"),
        # --- resourceclaimtemplates ---
        Step("template create", "POST", f"{RS}/namespaces/{NS}/resourceclaimtemplates", template,
             row="create resourceclaimtemplates"),
        Step("template get", "GET", f"{RS}/namespaces/{NS}/resourceclaimtemplates/t", row="get resourceclaimtemplates"),
        Step("template patch finalizer", "PATCH", f"{RS}/namespaces/{NS}/resourceclaimtemplates/t",
             {"metadata": {"finalizers": ["gpu.dra.dev/compute-domain"]}}, content_type=MERGE,
             row="patch resourceclaimtemplates"),
        Step("template patch bad finalizer", "PATCH", f"{RS}/namespaces/{NS}/resourceclaimtemplates/t",
             {"metadata": {"finalizers": ["no slash"]}}, content_type=MERGE, row="patch resourceclaimtemplates"),
        Step("template delete wrong uid", "DELETE", f"{RS}/namespaces/{NS}/resourceclaimtemplates/t",
             {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": "x"}},
             row="delete resourceclaimtemplates"),
        Step("template delete", "DELETE", f"{RS}/namespaces/{NS}/resourceclaimtemplates/t", lambda s: {
            "apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": _uid(s, "template get")}},
            row="delete resourceclaimtemplates"),
        # --- deviceclasses ---
        Step("deviceclass get", "GET", f"{RS}/deviceclasses/wire.gpu.dra.dev", row="get deviceclasses"),
        Step("deviceclass update", "PUT", f"{RS}/deviceclasses/wire.gpu.dra.dev",
             lambda s: {**s["deviceclass get"], "spec": {"selectors": [{"cel": {"expression": "true"}}]}},
             row="update deviceclasses"),
        Step("deviceclass update stale", "PUT", f"{RS}/deviceclasses/wire.gpu.dra.dev",
             lambda s: s["deviceclass get"], row="update deviceclasses"),
        Step("deviceclass create bad cel", "POST", f"{RS}/deviceclasses", {**_with(device_class, name="bad"), "spec": {
            "selectors": [{"cel": {"expression": "device.attributes['gpu.dra.dev'].index"}}]}},
             row="create deviceclasses"),
        Step("deviceclass create bad extended resource", "POST", f"{RS}/deviceclasses", {
            **_with(device_class, name="bad2"), "spec": {**device_class["spec"], "extendedResourceName": "gpu"}},
             row="create deviceclasses"),
        # --- nodes ---
        Step("node get", "GET", f"/api/v1/nodes/{NODE}", row="get nodes"),
        Step("node patch annotation", "PATCH", f"/api/v1/nodes/{NODE}",
             {"metadata": {"annotations": {f"{DRIVER_NAME}/nvidia-driver": "ready"}}}, content_type=MERGE,
             row="patch nodes"),
        Step("node patch label stale", "PATCH", f"/api/v1/nodes/{NODE}",
             {"metadata": {"resourceVersion": "1", "labels": {f"{DRIVER_NAME}/computeDomain": "x"}}},
             content_type=MERGE, row="patch nodes"),
        Step("node patch bad label", "PATCH", f"/api/v1/nodes/{NODE}",
             {"metadata": {"labels": {"bad key!": "x"}}}, content_type=MERGE, row="patch nodes"),
        Step("node json patch failed test", "PATCH", f"/api/v1/nodes/{NODE}",
             [{"op": "test", "path": "/metadata/name", "value": "other"}], content_type=JSON_PATCH, row="patch nodes"),
        Step("node patch unsupported type", "PATCH", f"/api/v1/nodes/{NODE}", {"metadata": {}},
             content_type="application/x-yaml", row="patch nodes"),
        Step("node list label selector", "GET", "/api/v1/nodes", query={"labelSelector": f"{DRIVER_NAME}/computeDomain",
                                                                          "limit": 5}, row="list nodes"),
        Step("node list bad label selector", "GET", "/api/v1/nodes", query={"labelSelector": "a in b"},
             row="list nodes"),
        Step("node list unschedulable", "GET", "/api/v1/nodes", query={"fieldSelector": "spec.unschedulable=false"},
             row="list nodes"),
        Step("node get missing", "GET", "/api/v1/nodes/missing", row="get nodes"),
        # --- events ---
        Step("event create", "POST", f"/api/v1/namespaces/{NS}/events", event, row="create events"),
        Step("event create no involved object", "POST", f"/api/v1/namespaces/{NS}/events",
             {k: v for k, v in _with(event, name="e2").items() if k != "involvedObject"}, row="create events"),
        Step("event create other namespace", "POST", f"/api/v1/namespaces/{NS}/events",
             _with(event, name="e3", namespace="default"), row="create events"),
        # A Node's Event lives in "default" (kube-apiserver refuses it elsewhere); the product records it there.
        Step("event create node event in default", "POST", "/api/v1/namespaces/default/events",
             _with(event, namespace="default"), row="create events"),
        Step("event create pod event", "POST", f"/api/v1/namespaces/{NS}/events", {**_with(event, name="e4"),
             "involvedObject": {"kind": "Pod", "name": "p", "namespace": NS, "apiVersion": "v1"}},
             row="create events"),
        Step("event patch count", "PATCH", "/api/v1/namespaces/default/events/e", {"count": 2}, content_type=MERGE,
             row="patch events"),
        Step("event list by reason", "GET", f"/api/v1/namespaces/{NS}/events",
             query={"fieldSelector": "reason=Test,involvedObject.kind=Node"}, row="list events"),
        # --- leases ---
        Step("lease create", "POST", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases", lease,
             row="create leases"),
        Step("lease get", "GET", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/l", row="get leases"),
        Step("lease update", "PUT", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/l",
             lambda s: {**s["lease get"], "spec": {**s["lease get"]["spec"], "holderIdentity": "b"}},
             row="update leases"),
        Step("lease update stale", "PUT", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/l",
             lambda s: s["lease get"], row="update leases"),
        Step("lease create negative duration", "POST", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases",
             {**_with(lease, name="l2"), "spec": {"leaseDurationSeconds": -1}}, row="create leases"),
        # --- custom resources ---
        Step("policy create", "POST", f"{GPU_GROUP}/gpusharingpolicies", policy, row="create gpusharingpolicies"),
        Step("policy create bad type", "POST", f"{GPU_GROUP}/gpusharingpolicies", {**_with(policy, name="p2"), "spec": {
            "devices": {"type": "tpu"}}}, row="create gpusharingpolicies"),
        Step("policy create no spec", "POST", f"{GPU_GROUP}/gpusharingpolicies",
             {k: v for k, v in _with(policy, name="p3").items() if k != "spec"}, row="create gpusharingpolicies"),
        Step("policy patch merge", "PATCH", f"{GPU_GROUP}/gpusharingpolicies/p",
             {"metadata": {"finalizers": ["gpu.dra.dev/policy"]}}, content_type=MERGE, row="patch gpusharingpolicies"),
        Step("policy patch json", "PATCH", f"{GPU_GROUP}/gpusharingpolicies/p",
             [{"op": "add", "path": "/metadata/annotations", "value": {"kopf": "x"}}], content_type=JSON_PATCH,
             row="patch gpusharingpolicies"),
        Step("policy patch strategic (custom resource)", "PATCH", f"{GPU_GROUP}/gpusharingpolicies/p",
             {"metadata": {"labels": {"a": "b"}}}, content_type=STRATEGIC, row="patch gpusharingpolicies"),
        Step("policy status patch", "PATCH", f"{GPU_GROUP}/gpusharingpolicies/p/status",
             {"status": {"deviceClassName": "p"}}, content_type=MERGE, row="patch gpusharingpolicies/status"),
        Step("policy list", "GET", f"{GPU_GROUP}/gpusharingpolicies", query={"limit": 10},
             row="list gpusharingpolicies"),
        Step("computedomains list all namespaces", "GET", f"{GPU_GROUP}/computedomains", row="list computedomains"),
        Step("clique create", "POST", f"{GPU_GROUP}/namespaces/{NS}/computedomaincliques", clique,
             row="create computedomaincliques"),
        Step("clique create bad index", "POST", f"{GPU_GROUP}/namespaces/{NS}/computedomaincliques", {
            **_with(clique, name="q2"), "daemons": [{"nodeName": NODE, "index": -1}]},
             row="create computedomaincliques"),
        Step("clique get", "GET", f"{GPU_GROUP}/namespaces/{NS}/computedomaincliques/q",
             row="get computedomaincliques"),
        Step("clique get missing", "GET", f"{GPU_GROUP}/namespaces/{NS}/computedomaincliques/missing",
             row="get computedomaincliques"),
        Step("clique list by name", "GET", f"{GPU_GROUP}/namespaces/{NS}/computedomaincliques",
             query={"fieldSelector": "metadata.name=q"}, row="list computedomaincliques"),
        Step("clique list unknown label", "GET", f"{GPU_GROUP}/namespaces/{NS}/computedomaincliques",
             query={"fieldSelector": "daemons.nodeName=x"}, row="list computedomaincliques"),
        Step("clique update", "PUT", f"{GPU_GROUP}/namespaces/{NS}/computedomaincliques/q",
             lambda s: {**s["clique get"], "daemons": []}, row="update computedomaincliques"),
        Step("clique update stale", "PUT", f"{GPU_GROUP}/namespaces/{NS}/computedomaincliques/q",
             lambda s: s["clique get"], row="update computedomaincliques"),
        Step("clique delete", "DELETE", f"{GPU_GROUP}/namespaces/{NS}/computedomaincliques/q",
             row="delete computedomaincliques"),
        # --- daemonsets, pods, namespaces, CRDs ---
        Step("daemonset create", "POST", f"/apis/apps/v1/namespaces/{NS}/daemonsets", daemonset,
             row="create daemonsets"),
        Step("daemonset create selector mismatch", "POST", f"/apis/apps/v1/namespaces/{NS}/daemonsets", {
            **_with(daemonset, name="d2"), "spec": {**daemonset["spec"], "selector": {"matchLabels": {"app": "x"}}}},
             row="create daemonsets"),
        Step("daemonset get", "GET", f"/apis/apps/v1/namespaces/{NS}/daemonsets/d", row="get daemonsets"),
        Step("daemonset update selector", "PUT", f"/apis/apps/v1/namespaces/{NS}/daemonsets/d",
             lambda s: {**s["daemonset get"], "spec": {**s["daemonset get"]["spec"],
                                                       "selector": {"matchLabels": {"app": "d", "x": "y"}}}},
             row="update daemonsets"),
        Step("daemonset delete", "DELETE", f"/apis/apps/v1/namespaces/{NS}/daemonsets/d", row="delete daemonsets"),
        Step("pods list by label", "GET", f"/api/v1/namespaces/{NS}/pods",
             query={"labelSelector": f"{DRIVER_NAME}/computeDomain=x", "limit": 5}, row="list pods"),
        Step("pods list by node", "GET", "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={NODE}"},
             row="list pods"),
        Step("pods list unknown label", "GET", "/api/v1/pods", query={"fieldSelector": "spec.priority=1"},
             row="list pods"),
        Step("namespace get", "GET", f"/api/v1/namespaces/{NS}", row="get namespaces"),
        Step("crds list", "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", query={"limit": 2},
             row="list customresourcedefinitions"),
        # --- DeviceTaintRules (health) ---
        Step("taint rule create", "POST", f"{RS}/devicetaintrules", rule, row="create devicetaintrules"),
        Step("taint rule create bad effect", "POST", f"{RS}/devicetaintrules", {**_with(rule, name="r2"), "spec": {
            **rule["spec"], "taint": {"key": "k", "effect": "Sometimes"}}}, row="create devicetaintrules"),
        Step("taint rule get", "GET", f"{RS}/devicetaintrules/r", row="get devicetaintrules"),
        Step("taint rule update", "PUT", f"{RS}/devicetaintrules/r", lambda s: {**s["taint rule get"], "spec": {
            **s["taint rule get"]["spec"], "taint": {**s["taint rule get"]["spec"]["taint"], "value": "48"}}},
             row="update devicetaintrules"),
        Step("taint rule list", "GET", f"{RS}/devicetaintrules", query={"limit": 10}, row="list devicetaintrules"),
        Step("taint rule delete", "DELETE", f"{RS}/devicetaintrules/r", row="delete devicetaintrules"),
        # Gone before the scheduling corpus runs in the same cluster (its FitError counts every Node).
        Step("node delete", "DELETE", f"/api/v1/nodes/{NODE}", row="delete nodes"),
    ]
    return out


def _refusal(step: Step, status: int, body: Any) -> Outcome:
    body = body if isinstance(body, dict) else {}
    details = body.get("details") if isinstance(body.get("details"), dict) else {}
    fields = tuple(sorted({str(c.get("field", "")) for c in (details or {}).get("causes") or []
                           if isinstance(c, dict) and c.get("field")}))
    return Outcome(step.id, status, str(body.get("reason", "")), fields, str(body.get("message", "")))


def _wait_for_custom_resources(rest: KubeRest) -> None:
    def served() -> bool:
        try:
            found = rest.request("GET", GPU_GROUP)
        except ApiError:
            return False
        names = {r.get("name") for r in found.get("resources") or []}
        return {"gpusharingpolicies", "computedomains", "computedomaincliques"} <= names

    wait_for(served, 60.0, "the chart's CRDs to be served", interval=0.2)


def send(rest: KubeRest, step: Step, body: Any) -> tuple[int, Any]:
    """The request as written (the product's transport, no retries), and the status with the decoded answer."""
    headers = {"Accept": "application/json", "User-Agent": rest.user_agent}
    payload = None
    if body is not None:
        headers["Content-Type"] = step.content_type
        payload = json.dumps(body).encode()
    query = [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in step.query.items()]
    response = rest.transport.send(step.method, step.path, query=query, headers=headers, body=payload,
                                   timeout=rest.timeout, stream=False)
    try:
        decoded = json.loads(response.data or b"null")
    except ValueError:
        decoded = None
    return response.status, decoded


def run(rest: KubeRest, all_steps: Sequence[Step]) -> list[Outcome]:
    """Every step in order; a success's body is kept for later steps' bodies."""
    state: dict[str, JsonObject] = {}
    outcomes = []
    crds_waited = False
    for step in all_steps:
        if step.path.startswith(GPU_GROUP) and not crds_waited:
            _wait_for_custom_resources(rest)  # kube-apiserver serves a new CRD only once it is Established
            crds_waited = True
        try:
            body = step.body(state) if callable(step.body) else step.body
        except KeyError:  # an earlier step it builds on failed: reported as not sent
            outcomes.append(Outcome(step.id, 0, "NotSent", ()))
            continue
        status, answer = send(rest, step, body)
        if 200 <= status < 300:
            if isinstance(answer, dict):
                state[step.id] = answer
            outcomes.append(Outcome(step.id, status, "", ()))
        else:
            outcomes.append(_refusal(step, status, answer))
    return outcomes
