"""Quantities sent as JSON numbers come back as canonical strings, as from a real API server (apimachinery's
resource.Quantity: UnmarshalJSON, then String())."""

from __future__ import annotations

from typing import Any

from dra_sandbox.apiserver import ApiServer


def _template(requests: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "t"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.dra.dev", "capacity": {"requests": requests}}}]}}}}  # fmt: skip


def test_numeric_capacity_requests_and_pod_limits_are_stored_as_canonical_strings() -> None:
    with ApiServer() as srv:
        rest = srv.rest()
        rest.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": "ns"}})  # fmt: skip
        path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaimtemplates"
        rest.request("POST", path, body=_template({"shares": 1, "memory": "2048Mi", "compute": 1000}))
        stored = rest.request("GET", f"{path}/t")
        [request] = stored["spec"]["spec"]["devices"]["requests"]
        assert request["exactly"]["capacity"]["requests"] == {"shares": "1", "memory": "2Gi", "compute": "1k"}
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
               "spec": {"containers": [{"name": "c", "image": "busybox",
                                        "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}  # fmt: skip
        rest.request("POST", "/api/v1/namespaces/ns/pods", body=pod)
        got = rest.request("GET", "/api/v1/namespaces/ns/pods/p")
        assert got["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}


def test_every_quantity_field_of_a_built_in_kind_comes_back_canonical() -> None:
    """`2048Mi` -> `2Gi`, `1000m` -> `1`, `0.5` -> `500m`, on create, update and patch, wherever the kind's OpenAPI
    schema has a resource.Quantity (and only there: a label that looks like one is left alone)."""
    with ApiServer(kube_version="1.35.0") as srv:
        rest = srv.rest()
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q", "labels": {"size": "2048Mi"}},
               "spec": {"overhead": {"cpu": "0.5"},
                        "initContainers": [{"name": "i", "image": "busybox",
                                            "resources": {"requests": {"memory": "1024Ki"}}}],
                        "containers": [{"name": "c", "image": "busybox",
                                        "resources": {"requests": {"cpu": "1000m", "memory": "2048Mi"},
                                                      "limits": {"cpu": "1.5", "ephemeral-storage": "1000M"}}}]}}
        rest.request("POST", "/api/v1/namespaces/default/pods", body=pod)
        got = rest.request("GET", "/api/v1/namespaces/default/pods/q")
        resources = got["spec"]["containers"][0]["resources"]
        assert resources == {"requests": {"cpu": "1", "memory": "2Gi"},
                             "limits": {"cpu": "1500m", "ephemeral-storage": "1G"}}
        assert got["spec"]["initContainers"][0]["resources"]["requests"] == {"memory": "1Mi"}
        assert got["spec"]["overhead"] == {"cpu": "500m"}
        assert got["metadata"]["labels"] == {"size": "2048Mi"}

        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
                "status": {"capacity": {"cpu": "4000m", "memory": "16384Mi", "pods": "110"},
                           "allocatable": {"cpu": "3.5", "memory": "0.5Gi"}}}
        rest.request("POST", "/api/v1/nodes", body=node)
        status = rest.request("GET", "/api/v1/nodes/n")["status"]
        assert status["capacity"] == {"cpu": "4", "memory": "16Gi", "pods": "110"}
        assert status["allocatable"] == {"cpu": "3500m", "memory": "512Mi"}
        rest.request("PATCH", "/api/v1/nodes/n/status", body={"status": {"allocatable": {"cpu": "2000m"}}},
                     content_type="application/merge-patch+json")
        assert rest.request("GET", "/api/v1/nodes/n")["status"]["allocatable"]["cpu"] == "2"

        pool = {"name": "n", "generation": 1, "resourceSliceCount": 2}
        counters = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "counters"},
                    "spec": {"driver": "gpu.dra.dev", "nodeName": "n", "pool": pool,
                             "sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "81920Mi"}}}]}}
        rest.request("POST", "/apis/resource.k8s.io/v1/resourceslices", body=counters)
        shared = rest.request("GET", "/apis/resource.k8s.io/v1/resourceslices/counters")["spec"]["sharedCounters"]
        assert shared[0]["counters"] == {"memory": {"value": "80Gi"}}
        slice_ = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
                  "spec": {"driver": "gpu.dra.dev", "nodeName": "n", "pool": pool,
                           "devices": [{"name": "gpu-0", "allowMultipleAllocations": True,
                                        "consumesCounters": [{"counterSet": "gpu-0",
                                                              "counters": {"memory": {"value": "40960Mi"}}}],
                                        "capacity": {"memory": {"value": "40960Mi", "requestPolicy": {
                                            "default": "1024Mi",
                                            "validRange": {"min": "1024Mi", "max": "40960Mi", "step": "1024Mi"}}},
                                            "compute": {"value": "100", "requestPolicy": {
                                                "default": "1000m", "validValues": ["0.5", "1000m"]}}}}]}}
        rest.request("POST", "/apis/resource.k8s.io/v1/resourceslices", body=slice_)
        spec = rest.request("GET", "/apis/resource.k8s.io/v1/resourceslices/s")["spec"]
        device = spec["devices"][0]
        assert device["consumesCounters"][0]["counters"] == {"memory": {"value": "40Gi"}}
        assert device["capacity"]["memory"] == {"value": "40Gi", "requestPolicy": {
            "default": "1Gi", "validRange": {"min": "1Gi", "max": "40Gi", "step": "1Gi"}}}
        assert device["capacity"]["compute"]["requestPolicy"] == {"default": "1", "validValues": ["500m", "1"]}
        # v1beta1 reads convert the stored, canonical values.
        beta = rest.request("GET", "/apis/resource.k8s.io/v1beta1/resourceslices/s")["spec"]
        assert beta["devices"][0]["basic"]["capacity"]["memory"]["value"] == "40Gi"

        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
                 "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                     "deviceClassName": "gpu.dra.dev", "capacity": {"requests": {"memory": "2048Mi"}}}}]}}}
        rest.request("POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", body=claim)
        path = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c"
        got = rest.request("GET", path)
        assert got["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"] == {"memory": "2Gi"}
        allocation = {"devices": {"results": [{"request": "gpu", "driver": "gpu.dra.dev", "pool": "n",
                                               "device": "gpu-0", "shareID": "6f1b9d1e-0c5c-4d6c-9f32-2b7a4f1e8a11",
                                               "consumedCapacity": {"memory": "2048Mi"}}]}}
        rest.request("PATCH", f"{path}/status", body={"status": {"allocation": allocation}},
                     content_type="application/merge-patch+json")
        result = rest.request("GET", path)["status"]["allocation"]["devices"]["results"][0]
        assert result["consumedCapacity"] == {"memory": "2Gi"}
