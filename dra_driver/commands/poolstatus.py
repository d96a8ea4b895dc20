"""`dra-driver status --pool-status`: ask kube-controller-manager for its count of the driver's pools (KEP-5677).

A `ResourcePoolStatusRequest` (resource.k8s.io/v1alpha3, cluster-scoped) is answered once: the controller sets its
status, which never changes after (docs/reference/dra-in-flight.md). So: discovery first (`GET
/apis/resource.k8s.io/v1alpha3` lists `resourcepoolstatusrequests` only where the gate DRAResourcePoolStatus is on
and the version is in --runtime-config; nothing else is sent where it does not), then create one request, wait for
its answer by watching that object (from the create's resourceVersion, bounded by the timeout), and delete it
whatever happened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from dra_driver.commands.poolstatusview import PoolReport, finished, parse_report
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest

GROUP_VERSION: Final = "resource.k8s.io/v1alpha3"
RESOURCE: Final = "resourcepoolstatusrequests"
PATH: Final = f"/apis/{GROUP_VERSION}/{RESOURCE}"
LIMIT_MAX: Final = 1000  # ResourcePoolStatusRequestLimitMax
DEFAULT_TIMEOUT_S: Final = 10.0
NOT_SERVED: Final = (
    "the API server does not serve ResourcePoolStatusRequest (resource.k8s.io/v1alpha3): it needs the feature gate "
    "DRAResourcePoolStatus=true on kube-apiserver and kube-controller-manager and resource.k8s.io/v1alpha3=true in "
    "--runtime-config (Kubernetes 1.36+, alpha; docs/reference/dra-in-flight.md)"
)


class PoolStatusUnavailable(Exception):
    """No answer: not served, refused, or not answered in time (the message says which and what to do)."""


def served(rest: KubeRest) -> bool:
    """Whether the server lists the kind (one discovery GET; a 404 of the group version means no)."""
    listing = rest.get(f"/apis/{GROUP_VERSION}")
    return RESOURCE in {str(r.get("name")) for r in (listing or {}).get("resources") or [] if isinstance(r, dict)}


def request_body(driver: str, pool: str | None) -> JsonObject:
    spec: JsonObject = {"driver": driver, "limit": LIMIT_MAX}
    if pool is not None:
        spec["poolName"] = pool
    return {"apiVersion": GROUP_VERSION, "kind": "ResourcePoolStatusRequest",
            "metadata": {"generateName": "dra-driver-status-"}, "spec": spec}


def _await(rest: KubeRest, created: JsonObject, timeout_s: float) -> JsonObject | None:
    """The request once answered, or None at the timeout: a watch on this one object, no polling."""
    name = str(created["metadata"]["name"])
    current = rest.get(f"{PATH}/{name}")
    if current is None or finished(current):
        return current
    version = str((current.get("metadata") or {}).get("resourceVersion") or "")
    stream = rest.watch(PATH, query={"fieldSelector": f"metadata.name={name}", "resourceVersion": version},
                        timeout_seconds=max(1, round(timeout_s)))
    try:
        for event in stream:
            obj = event.get("object")
            if event.get("type") in ("ADDED", "MODIFIED") and isinstance(obj, dict) and finished(obj):
                return obj
            if event.get("type") == "DELETED":
                return None
    finally:
        stream.close()
    return None


@dataclass(frozen=True)
class PoolStatusQuery:
    driver: str
    pool: str | None = None  # one pool (the driver names pools after nodes), or all of the driver's
    timeout_s: float = DEFAULT_TIMEOUT_S


def pool_status(rest: KubeRest, query: PoolStatusQuery) -> tuple[PoolReport, list[str]]:
    """Discovery, create, wait, delete: the report and warnings (a request it could not delete). Raises
    PoolStatusUnavailable when there is no report."""
    try:
        if not served(rest):
            raise PoolStatusUnavailable(NOT_SERVED)
        created = rest.request("POST", PATH, body=request_body(query.driver, query.pool))
    except ApiError as exc:
        raise PoolStatusUnavailable(f"could not create a ResourcePoolStatusRequest: {exc}") from exc
    name = str(created["metadata"]["name"])
    warnings: list[str] = []
    try:
        answered = _await(rest, created, query.timeout_s)
    except ApiError as exc:
        answered, problem = None, f"could not read ResourcePoolStatusRequest {name}: {exc}"
    else:
        problem = (f"kube-controller-manager did not answer ResourcePoolStatusRequest {name} within "
                   f"{query.timeout_s:g} s (is the feature gate DRAResourcePoolStatus on there too?)")
    try:
        rest.request("DELETE", f"{PATH}/{name}")
    except ApiError as exc:
        if not exc.not_found:
            warnings.append(f"could not delete ResourcePoolStatusRequest {name} (delete it by hand): {exc}")
    if answered is None:
        raise PoolStatusUnavailable("; ".join([problem, *warnings]))
    return parse_report(answered, query.driver), warnings
