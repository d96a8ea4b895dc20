"""Deletion semantics over HTTP: finalizers, ownerReference GC (background/foreground/orphan, dangling
owners, cluster-scoped owners), namespace termination, graceful pod deletion, CRDs served dynamically."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import kubernetes.client as k
import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from dra_driver.defaults import DRIVER_NAME
from dra_sandbox.apiserver import ApiServer
from tests.kube_models import HasMetadata, as_json, meta, name_of
from tests.narrow import present
from tests.polling import wait_for


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def exists(read: Callable[[], Any]) -> bool:
    try:
        read()
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def owner_ref(
    obj: HasMetadata[k.V1ObjectMeta], kind: str, api_version: str = "v1", block: bool | None = None
) -> dict[str, Any]:
    ref: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "name": name_of(obj), "uid": meta(obj).uid}
    if block is not None:
        ref["blockOwnerDeletion"] = block
    return ref


def node_slice(name: str, node: k.V1Node, **extra_meta: Any) -> k.V1ResourceSlice:
    return k.V1ResourceSlice.model_validate({
        "metadata": {"name": name, "ownerReferences": [owner_ref(node, "Node")], **extra_meta},
        "spec": {"driver": DRIVER_NAME, "nodeName": name_of(node),
                 "pool": {"name": name_of(node), "generation": 1, "resourceSliceCount": 1}}})


# -- finalizers --------------------------------------------------------------------------------


def test_finalizers_hold_a_deleted_object_until_removed(api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    name = unique("cm")
    core.create_namespaced_config_map("default", k.V1ConfigMap(
        metadata=k.V1ObjectMeta(name=name, finalizers=["example.com/hold"])))
    core.delete_namespaced_config_map(name, "default")
    held = core.read_namespaced_config_map(name, "default")
    assert meta(held).deletion_timestamp is not None
    with pytest.raises(ApiException) as err:  # no new finalizers while deleting
        core.patch_namespaced_config_map(name, "default", {"metadata": {"finalizers": ["example.com/hold",
                                                                                       "example.com/more"]}})
    assert err.value.status == 422 and "no new finalizers" in present(err.value.body)
    core.patch_namespaced_config_map(name, "default", {"metadata": {"finalizers": None}})
    assert not exists(lambda: core.read_namespaced_config_map(name, "default"))


def test_delete_preconditions(api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    name = unique("cm")
    created = core.create_namespaced_config_map("default", k.V1ConfigMap(metadata=k.V1ObjectMeta(name=name)))
    with pytest.raises(ApiException) as err:
        core.delete_namespaced_config_map(name, "default", body=k.V1DeleteOptions(
            preconditions=k.V1Preconditions(uid="not-the-uid")))
    assert err.value.status == 409 and "Precondition failed" in present(err.value.body)
    core.delete_namespaced_config_map(name, "default", body=k.V1DeleteOptions(
        preconditions=k.V1Preconditions(uid=meta(created).uid)))
    assert not exists(lambda: core.read_namespaced_config_map(name, "default"))


def test_delete_collection_by_label(api: k.ApiClient) -> None:
    res = k.ResourceV1Api(api)
    node = unique("dc")
    for i in range(3):
        res.create_resource_slice(k.V1ResourceSlice.model_validate({
            "metadata": {"name": f"{node}-{i}", "labels": {"node": node, "i": str(i)}},
            "spec": {"driver": DRIVER_NAME, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 3}}}))
    res.delete_collection_resource_slice(label_selector=f"node={node},i!=1")
    assert [name_of(s) for s in res.list_resource_slice(label_selector=f"node={node}").items] == [f"{node}-1"]


# -- garbage collection --------------------------------------------------------------------------


def test_deleting_a_node_collects_its_resource_slices(api: k.ApiClient) -> None:
    core, res = k.CoreV1Api(api), k.ResourceV1Api(api)
    node = core.create_node(k.V1Node(metadata=k.V1ObjectMeta(name=unique("node"))))
    names = [f"{name_of(node)}-{i}" for i in range(3)]
    for name in names:
        res.create_resource_slice(node_slice(name, node))
    other = core.create_node(k.V1Node(metadata=k.V1ObjectMeta(name=unique("node"))))
    survivor = res.create_resource_slice(node_slice(unique("keep"), other))
    core.delete_node(name_of(node))  # Background is the default propagation
    wait_for(lambda: not any(exists(partial(res.read_resource_slice, n)) for n in names), 5.0, "slices collected")
    assert exists(lambda: res.read_resource_slice(name_of(survivor)))


def test_cluster_scoped_owner_of_namespaced_dependents(api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    node = core.create_node(k.V1Node(metadata=k.V1ObjectMeta(name=unique("node"))))
    name = unique("cm")
    core.create_namespaced_config_map("default", k.V1ConfigMap(metadata=k.V1ObjectMeta(
        name=name, owner_references=[k.V1OwnerReference(**owner_ref(node, "Node"))])))
    core.delete_node(name_of(node))
    wait_for(lambda: not exists(lambda: core.read_namespaced_config_map(name, "default")), 5.0, "dependent gone")


def test_dependent_with_a_second_live_owner_only_loses_the_reference(api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    a = core.create_node(k.V1Node(metadata=k.V1ObjectMeta(name=unique("a"))))
    b = core.create_node(k.V1Node(metadata=k.V1ObjectMeta(name=unique("b"))))
    name = unique("cm")
    core.create_namespaced_config_map("default", k.V1ConfigMap(metadata=k.V1ObjectMeta(
        name=name, owner_references=[k.V1OwnerReference(**owner_ref(a, "Node")),
                                     k.V1OwnerReference(**owner_ref(b, "Node"))])))
    core.delete_node(name_of(a))
    wait_for(lambda: [r.name for r in meta(core.read_namespaced_config_map(name, "default")).owner_references or []]
             == [name_of(b)], 5.0, "reference to the deleted owner dropped")


def test_foreground_deletion_waits_for_blocking_dependents(api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    owner = core.create_namespaced_config_map("default", k.V1ConfigMap(metadata=k.V1ObjectMeta(name=unique("own"))))
    dep = unique("dep")
    core.create_namespaced_config_map("default", k.V1ConfigMap(metadata=k.V1ObjectMeta(
        name=dep, finalizers=["example.com/hold"],
        owner_references=[k.V1OwnerReference(**owner_ref(owner, "ConfigMap", block=True))])))
    core.delete_namespaced_config_map(name_of(owner), "default", propagation_policy="Foreground")
    wait_for(lambda: meta(core.read_namespaced_config_map(dep, "default")).deletion_timestamp is not None,
             5.0, "dependent marked for deletion")
    held = core.read_namespaced_config_map(name_of(owner), "default")
    assert "foregroundDeletion" in present(meta(held).finalizers) and meta(held).deletion_timestamp
    core.patch_namespaced_config_map(dep, "default", {"metadata": {"finalizers": None}})
    wait_for(lambda: not exists(lambda: core.read_namespaced_config_map(name_of(owner), "default")),
             5.0, "owner released once the dependent is gone")


def test_orphan_propagation_keeps_dependents(api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    owner = core.create_namespaced_config_map("default", k.V1ConfigMap(metadata=k.V1ObjectMeta(name=unique("own"))))
    dep = unique("dep")
    core.create_namespaced_config_map("default", k.V1ConfigMap(metadata=k.V1ObjectMeta(
        name=dep, owner_references=[k.V1OwnerReference(**owner_ref(owner, "ConfigMap"))])))
    core.delete_namespaced_config_map(name_of(owner), "default", propagation_policy="Orphan")
    wait_for(lambda: not exists(lambda: core.read_namespaced_config_map(name_of(owner), "default")),
             5.0, "owner deleted")
    assert not meta(core.read_namespaced_config_map(dep, "default")).owner_references


def test_dependent_of_a_missing_owner_is_collected(api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    ghost = {"apiVersion": "v1", "kind": "Node", "name": unique("ghost"), "uid": str(uuid.uuid4())}
    unknown = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "sts", "uid": str(uuid.uuid4())}
    orphan, unverifiable = unique("orphan"), unique("unverifiable")
    core.create_namespaced_config_map("default", k.V1ConfigMap.model_validate(
        {"metadata": {"name": orphan, "ownerReferences": [ghost]}}))
    core.create_namespaced_config_map("default", k.V1ConfigMap.model_validate(
        {"metadata": {"name": unverifiable, "ownerReferences": [unknown]}}))
    wait_for(lambda: not exists(lambda: core.read_namespaced_config_map(orphan, "default")), 5.0, "orphan collected")
    assert exists(lambda: core.read_namespaced_config_map(unverifiable, "default"))  # kind not served: left alone


def test_gc_can_be_switched_off() -> None:
    with ApiServer(garbage_collection=False) as srv, srv.api_client() as client:
        core = k.CoreV1Api(client)
        node = core.create_node(k.V1Node(metadata=k.V1ObjectMeta(name="n")))
        core.create_namespaced_config_map("default", k.V1ConfigMap(metadata=k.V1ObjectMeta(
            name="dep", owner_references=[k.V1OwnerReference(**owner_ref(node, "Node"))])))
        core.delete_node("n")
        core.create_namespaced_config_map("default", k.V1ConfigMap(metadata=k.V1ObjectMeta(name="barrier")))
        assert exists(lambda: core.read_namespaced_config_map("dep", "default"))


# -- namespaces and pods -----------------------------------------------------------------------


def test_namespace_deletion_empties_it_then_removes_it(api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    ns = unique("ns")
    created = core.create_namespace(k.V1Namespace(metadata=k.V1ObjectMeta(name=ns)))
    assert present(created.status).phase == "Active" and present(created.spec).finalizers == ["kubernetes"]
    core.create_namespaced_config_map(ns, k.V1ConfigMap(metadata=k.V1ObjectMeta(name="a")))
    core.create_namespaced_config_map(ns, k.V1ConfigMap(metadata=k.V1ObjectMeta(name="held",
                                                                                finalizers=["example.com/x"])))
    core.delete_namespace(ns)
    wait_for(lambda: not exists(lambda: core.read_namespaced_config_map("a", ns)), 5.0, "contents deleted")
    terminating = core.read_namespace(ns)
    assert present(terminating.status).phase == "Terminating"
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map(ns, k.V1ConfigMap(metadata=k.V1ObjectMeta(name="late")))
    assert err.value.status == 403 and "being terminated" in present(err.value.body)
    core.patch_namespaced_config_map("held", ns, {"metadata": {"finalizers": None}})
    wait_for(lambda: not exists(lambda: core.read_namespace(ns)), 5.0, "namespace removed")


def test_default_namespace_cannot_be_deleted(api: k.ApiClient) -> None:
    with pytest.raises(ApiException) as err:
        k.CoreV1Api(api).delete_namespace("default")
    assert err.value.status == 403


def test_scheduled_pod_deletion_is_graceful_until_the_kubelet_confirms(api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    pod = k.V1Pod.model_validate({"metadata": {"name": unique("pod")},
                                  "spec": {"nodeName": "node-1", "terminationGracePeriodSeconds": 20,
                                           "containers": [{"name": "c", "image": "busybox"}]}})
    created = core.create_namespaced_pod("default", pod)
    assert present(created.status).phase == "Pending" and present(created.spec).restart_policy == "Always"
    core.delete_namespaced_pod(name_of(created), "default")
    terminating = core.read_namespaced_pod(name_of(created), "default")
    assert meta(terminating).deletion_timestamp is not None
    assert meta(terminating).deletion_grace_period_seconds == 20
    core.delete_namespaced_pod(name_of(created), "default", grace_period_seconds=0)
    assert not exists(lambda: core.read_namespaced_pod(name_of(created), "default"))
    unscheduled = core.create_namespaced_pod("default", k.V1Pod.model_validate(
        {"metadata": {"name": unique("pod")}, "spec": {"containers": [{"name": "c", "image": "x"}]}}))
    core.delete_namespaced_pod(name_of(unscheduled), "default")
    assert not exists(lambda: core.read_namespaced_pod(name_of(unscheduled), "default"))



def test_pod_status_writes_keep_labels_and_annotations_but_not_spec_or_owners(api: k.ApiClient) -> None:
    """kube-apiserver's podStatusStrategy resets only spec, deletionTimestamp and ownerReferences: a kubelet (RBAC
    system:node: pods/status, not pods) annotates its pods through pods/status, as the kubelet simulator does."""
    core = k.CoreV1Api(api)
    pod = k.V1Pod.model_validate({"metadata": {"name": unique("pod"), "labels": {"keep": "me"}},
                                  "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    created = core.create_namespaced_pod("default", pod)
    patch = {"metadata": {"annotations": {"sandbox.dra.dev/containers": "{}"}, "labels": {"new": "x"},
                          "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u"}]},
             "spec": {"activeDeadlineSeconds": 5}, "status": {"message": "m"}}
    core.patch_namespaced_pod_status(name_of(created), "default", patch)
    got = core.read_namespaced_pod(name_of(created), "default")
    assert meta(got).annotations == {"sandbox.dra.dev/containers": "{}"}
    assert meta(got).labels == {"keep": "me", "new": "x"}
    assert not meta(got).owner_references and present(got.spec).active_deadline_seconds is None
    assert present(got.status).message == "m"

# -- CRDs ----------------------------------------------------------------------------------------

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "gpusharingpolicies.life.example.com"},
    "spec": {
        "group": "life.example.com",
        "scope": "Cluster",
        "names": {"plural": "gpusharingpolicies", "singular": "gpusharingpolicy", "kind": "GpuSharingPolicy",
                  "shortNames": ["gsp"]},
        "versions": [
            {"name": "v1beta1", "served": True, "storage": False,
             "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}},
            {"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
             "selectableFields": [{"jsonPath": ".spec.mode"}],
             "additionalPrinterColumns": [{"name": "Mode", "type": "string", "jsonPath": ".spec.mode"}],
             "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}},
        ],
    },
}


def test_crd_lifecycle(api: k.ApiClient) -> None:
    ext, custom = k.ApiextensionsV1Api(api), k.CustomObjectsApi(api)
    created = ext.create_custom_resource_definition(k.V1CustomResourceDefinition.model_validate(CRD))
    conditions = {c.type: c.status for c in present(present(created.status).conditions)}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}
    group = next(g for g in k.ApisApi(api).get_api_versions().groups if g.name == "life.example.com")
    assert present(group.preferred_version).version == "v1" and [v.version for v in group.versions] == ["v1", "v1beta1"]
    resources = {r.name: r for r in k.CustomObjectsApi(api).get_api_resources("life.example.com", "v1").resources}
    assert resources["gpusharingpolicies"].short_names == ["gsp"] and not resources["gpusharingpolicies"].namespaced
    assert "gpusharingpolicies/status" in resources
    body = {"apiVersion": "life.example.com/v1", "kind": "GpuSharingPolicy", "metadata": {"name": "shared"},
            "spec": {"mode": "timeslice"}, "status": {"ready": True}}
    obj = as_json(custom.create_cluster_custom_object("life.example.com", "v1", "gpusharingpolicies", body))
    assert "status" not in obj  # status subresource: dropped on create
    custom.patch_cluster_custom_object_status("life.example.com", "v1", "gpusharingpolicies", "shared",
                                              {"status": {"ready": True}})
    as_beta = as_json(custom.get_cluster_custom_object("life.example.com", "v1beta1", "gpusharingpolicies", "shared"))
    assert as_beta["apiVersion"] == "life.example.com/v1beta1" and as_beta["status"] == {"ready": True}
    selected = as_json(custom.list_cluster_custom_object("life.example.com", "v1", "gpusharingpolicies",
                                                         field_selector="spec.mode=timeslice"))
    assert [o["metadata"]["name"] for o in selected["items"]] == ["shared"]
    ext.delete_custom_resource_definition(CRD["metadata"]["name"])
    wait_for(lambda: not exists(lambda: ext.read_custom_resource_definition(CRD["metadata"]["name"])),
             5.0, "CRD removed after its objects")
    with pytest.raises(ApiException) as err:
        custom.list_cluster_custom_object("life.example.com", "v1", "gpusharingpolicies")
    assert err.value.status == 404


def test_invalid_crd_is_rejected(api: k.ApiClient) -> None:
    bad = {**CRD, "metadata": {"name": "wrong.life.example.com"}}
    with pytest.raises(ApiException) as err:
        k.ApiextensionsV1Api(api).create_custom_resource_definition(k.V1CustomResourceDefinition.model_validate(bad))
    assert err.value.status == 422 and "metadata.name" in present(err.value.body)


def test_pods_are_bound_through_the_binding_subresource(server: ApiServer, api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    name = unique("pod")
    core.create_namespaced_pod("default", k.V1Pod.model_validate(
        {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}))
    with pytest.raises(ApiException) as err:  # the pod spec is immutable apart from a few fields
        core.patch_namespaced_pod(name, "default", {"spec": {"nodeName": "node-1"}})
    assert err.value.status == 422 and "pods/binding" in present(err.value.body)
    # The apiserver answers a binding with a Success Status, which the generated client cannot read as a
    # V1Binding (a long-standing client issue); callers skip decoding, as they must with a real cluster. Without
    # decoding the client returns the raw urllib3 response, which its annotation (V1Binding) does not say.
    binding = k.V1Binding(metadata=k.V1ObjectMeta(name=name), target=k.V1ObjectReference(kind="Node", name="node-1"))
    reply: urllib3.BaseHTTPResponse = core.create_namespaced_pod_binding(  # type: ignore[assignment]
        name, "default", binding, _preload_content=False)
    assert isinstance(reply, urllib3.BaseHTTPResponse)
    assert reply.status == 201 and json.loads(reply.data)["status"] == "Success"
    bound = core.read_namespaced_pod(name, "default")
    assert present(bound.spec).node_name == "node-1"
    assert [(c.type, c.status) for c in present(present(bound.status).conditions)] == [("PodScheduled", "True")]
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod_binding(name, "default", k.V1Binding(
            metadata=k.V1ObjectMeta(name=name), target=k.V1ObjectReference(kind="Node", name="node-2")),
            _preload_content=False)
    assert err.value.status == 409 and "already assigned" in present(err.value.body)
    image = core.patch_namespaced_pod(name, "default", {"spec": {"containers": [{"name": "c", "image": "busybox:2"}]}})
    assert present(image.spec).containers[0].image == "busybox:2"
    resources = {r.name: r for r in core.get_api_resources().resources}
    assert resources["pods/binding"].verbs == ["create"] and resources["pods/binding"].kind == "Binding"
