"""What the compute-domain plugin reads and writes in the API besides claims and slices.

Requests (the chart's ClusterRole for the compute-domain plugin needs exactly these):
- `computedomains` (gpu.dra.dev): `list` across namespaces — a claim's config names its domain by UID only;
- `computedomaincliques` (gpu.dra.dev, the driver's namespace): `get` one (readiness), `list` (one domain per
  clique);
- `nodes`: `get` and `patch` this node (the label `gpu.dra.dev/computeDomain=<uid>`, and with
  `--gpu-clique-label` `nvidia.com/gpu.clique`). Label writes are JSON merge patches that carry the Node's
  `resourceVersion`, so a concurrent writer makes them fail with 409 (re-read and decided again) instead of one
  overwriting the other's decision.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

from dra_driver.computedomain.model import (
    ComputeDomain,
    ComputeDomainClique,
    parse_clique,
    parse_compute_domain,
)
from dra_driver.computedomain.names import CLIQUE_PLURAL, COMPUTE_DOMAIN_PLURAL, GROUP_VERSION
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest

MERGE_PATCH = "application/merge-patch+json"
# The paths below spell out /apis/<GROUP_VERSION>/<plural>: the RBAC test reads them from the source.
assert (GROUP_VERSION, COMPUTE_DOMAIN_PLURAL, CLIQUE_PLURAL) == ("gpu.dra.dev/v1beta1", "computedomains",
                                                                  "computedomaincliques")
LABEL_RETRIES = 5


def _q(part: str) -> str:
    return quote(part, safe="")


class DomainReader:
    def __init__(self, rest: KubeRest, *, driver_namespace: str, timeout: float = 10.0) -> None:
        self._rest = rest
        self.driver_namespace = driver_namespace
        self._timeout = timeout

    def domain(self, uid: str) -> ComputeDomain | None:
        """The ComputeDomain with this UID, None when there is none. Raises ApiError."""
        # Paths written out in full: tests/chart/test_rbac.py derives the chart's RBAC rules from them.
        page = self._rest.request("GET", "/apis/gpu.dra.dev/v1beta1/computedomains", timeout=self._timeout)
        for item in page.get("items") or ():
            if isinstance(item, dict) and (item.get("metadata") or {}).get("uid") == uid:
                return parse_compute_domain(item)
        return None

    def clique(self, name: str) -> ComputeDomainClique | None:
        obj = self._rest.get(
            f"/apis/gpu.dra.dev/v1beta1/namespaces/{_q(self.driver_namespace)}/computedomaincliques/{_q(name)}",
            timeout=self._timeout)
        return parse_clique(obj) if obj is not None else None

    def cliques(self) -> list[ComputeDomainClique]:
        page = self._rest.request(
            "GET", f"/apis/gpu.dra.dev/v1beta1/namespaces/{_q(self.driver_namespace)}/computedomaincliques",
            timeout=self._timeout)
        return [parse_clique(i) for i in page.get("items") or () if isinstance(i, dict)]


class NodeLabels:
    """This node's labels, written with the Node's resourceVersion as a precondition."""

    def __init__(self, rest: KubeRest, node_name: str, *, timeout: float = 10.0) -> None:
        self._rest = rest
        self.node_name = node_name
        self._timeout = timeout

    def node(self) -> JsonObject | None:
        return self._rest.get(f"/api/v1/nodes/{_q(self.node_name)}", timeout=self._timeout)

    def value(self, key: str) -> str | None:
        node = self.node()
        labels = ((node or {}).get("metadata") or {}).get("labels") or {}
        value = labels.get(key) if isinstance(labels, dict) else None
        return str(value) if value is not None else None

    def update(self, key: str, decide: Callable[[str | None], str | None]) -> str | None:
        """Set the label to `decide(current)` (None: remove it) and return what it is now. `decide` may raise
        to refuse; it is called again after a conflict (someone else wrote the Node in between)."""
        for _ in range(LABEL_RETRIES):
            node = self.node()
            if node is None:
                raise ApiError(404, f"Node {self.node_name} does not exist")
            meta = node.get("metadata") or {}
            labels = meta.get("labels") or {}
            current = labels.get(key) if isinstance(labels, dict) else None
            current = str(current) if current is not None else None
            wanted = decide(current)
            if wanted == current:
                return current
            body = {"metadata": {"labels": {key: wanted}, "resourceVersion": meta.get("resourceVersion")}}
            try:
                self._rest.request("PATCH", f"/api/v1/nodes/{_q(self.node_name)}", body=body,
                                   content_type=MERGE_PATCH, timeout=self._timeout)
            except ApiError as exc:
                if exc.status == 409:
                    continue
                raise
            return wanted
        raise ApiError(409, f"Node {self.node_name}: label {key} kept changing under us ({LABEL_RETRIES} tries)")
