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
        assert request["exactly"]["capacity"]["requests"] == {"shares": "1", "memory": "2048Mi", "compute": "1k"}
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
               "spec": {"containers": [{"name": "c", "image": "busybox",
                                        "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}  # fmt: skip
        rest.request("POST", "/api/v1/namespaces/ns/pods", body=pod)
        got = rest.request("GET", "/api/v1/namespaces/ns/pods/p")
        assert got["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
