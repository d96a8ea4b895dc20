"""Reading ResourceClaims from the API server (the kubelet request carries only their identity)."""

from __future__ import annotations

from dra_driver.k8s.client import JsonObject, KubeRest


class KubeClaimSource:
    def __init__(self, rest: KubeRest, timeout: float = 10.0) -> None:
        self._rest = rest
        self._timeout = timeout

    def get_claim(self, namespace: str, name: str) -> JsonObject | None:
        return self._rest.get(
            f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}", timeout=self._timeout
        )
