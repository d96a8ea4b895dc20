"""Reading ResourceClaims from the API server (the kubelet request carries only their identity).

API calls made here (the chart's ClusterRole allows exactly these on `resource.k8s.io/resourceclaims`; the chart
test derives them from this code):
- `get`: one claim, on prepare and in the stale-claim sweep;
- `list` (all namespaces, paginated): only when the checkpoint was lost or corrupt and ownership of what
  exists on the node has to be rebuilt.
"""

from __future__ import annotations

from typing import Protocol
from urllib.parse import quote

from dra_driver.k8s.client import JsonObject, KubeRest
from dra_driver.kubeletplugin.names import InvalidNameError, dns1123_label_problem, dns1123_subdomain_problem

CLAIMS_PATH = "/apis/resource.k8s.io/v1/resourceclaims"
LIST_PAGE_SIZE = 500


def check_claim_name(namespace: str, name: str) -> None:
    """The gRPC layer admits valid names only; they are checked again here (names from the checkpoint file reach
    the stale-claim sweep too) and escaped in the URL, so that nothing (a '?', '#', '/' or '..') can ever change
    which object is read."""
    for field, problem in (("namespace", dns1123_label_problem(namespace)), ("name", dns1123_subdomain_problem(name))):
        if problem is not None:
            raise InvalidNameError(f"ResourceClaim {field}: {problem}")


class ClaimSource(Protocol):
    """Where a driver reads the claims the kubelet names (the request carries only their identity)."""

    def get_claim(self, namespace: str, name: str) -> JsonObject | None:
        """The ResourceClaim, None when it does not exist. Raises ApiError."""

    def list_claims(self) -> list[JsonObject]:
        """Every ResourceClaim (to rebuild ownership after a lost checkpoint). Raises ApiError."""


class KubeClaimSource:
    """A ClaimSource on the API server."""

    def __init__(self, rest: KubeRest, timeout: float = 10.0) -> None:
        self._rest = rest
        self._timeout = timeout

    def get_claim(self, namespace: str, name: str) -> JsonObject | None:
        check_claim_name(namespace, name)
        # The path is written out in full here: tests/chart/test_rbac.py derives the chart's RBAC rules from it.
        return self._rest.get(
            f"/apis/resource.k8s.io/v1/namespaces/{quote(namespace, safe='')}/resourceclaims/{quote(name, safe='')}",
            timeout=self._timeout,
        )

    def list_claims(self) -> list[JsonObject]:
        """Every ResourceClaim in the cluster, page by page (the API offers no server-side filter on the
        allocation's pool, so the caller filters). Raises ApiError."""
        items: list[JsonObject] = []
        token = ""
        while True:
            query: dict[str, str | int | bool] = {"limit": LIST_PAGE_SIZE}
            if token:
                query["continue"] = token
            page = self._rest.request("GET", CLAIMS_PATH, query=query, timeout=self._timeout)
            items.extend(i for i in page.get("items") or () if isinstance(i, dict))
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return items
