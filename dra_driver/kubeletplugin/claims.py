"""Reading ResourceClaims from the API server (the kubelet request carries only their identity).

API calls made here (the chart's ClusterRole allows exactly these on `resource.k8s.io/resourceclaims`; the chart
test derives them from this code):
- `get`: one claim, on prepare and in the stale-claim sweep;
- `list` (all namespaces, paginated): only when the checkpoint was lost or corrupt and ownership of what
  exists on the node has to be rebuilt.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote

from dra_driver.k8s.client import JsonObject, KubeRest
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.kubeletplugin.names import (
    InvalidNameError,
    claim_ref_problem,
    dns1123_label_problem,
    dns1123_subdomain_problem,
)
from dra_driver.resourceapi import parse_resource_claim

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


@dataclass(frozen=True)
class AllocatedClaim:
    """A claim the API server allocated to this node's pool: who owns what on the node when the checkpoint cannot
    say (used only to rebuild ownership after the checkpoint was lost or found corrupt)."""

    ref: ClaimRef
    claim: JsonObject
    devices: tuple[str, ...]  # names of the devices allocated from our pool


def claims_allocated_here(claims: Iterable[JsonObject], driver: str, pool: str) -> dict[str, AllocatedClaim]:
    """UID -> claim, for every claim with at least one allocation result of our driver and pool. The API objects
    are untrusted input: a claim is considered only if its identity is one Kubernetes could have produced.

    Raises InvalidObjectError (naming the claim and field) for a claim the strict parser refuses: what it holds
    cannot be known, so ownership is unknown and the caller must delete and destroy nothing."""
    found: dict[str, AllocatedClaim] = {}
    for obj in claims:
        claim = parse_resource_claim(obj)
        ref = ClaimRef(claim.namespace, claim.name, claim.uid)
        if claim_ref_problem(ref) is not None:
            continue
        devices = tuple(r.device for r in claim.for_driver(driver, pool).results)
        if devices:
            found[ref.uid] = AllocatedClaim(ref, obj, devices)
    return found
