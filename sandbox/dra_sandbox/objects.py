"""Objects the sandbox's tests and benchmarks write straight into the API, bypassing the scheduler."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver.k8s.client import JsonObject, KubeRest


def create_allocated_claim(
    rest: KubeRest,
    *,
    namespace: str,
    name: str,
    driver: str,
    pool: str,
    devices: Sequence[str],
    config: Sequence[Any] = (),
    result_fields: Sequence[Mapping[str, Any]] = (),
    reserved_for: str | None = None,
) -> JsonObject:
    """A ResourceClaim with one request `r<i>` per device, allocated to those devices of `pool` on node `pool`
    (as kube-scheduler would write it), returned as stored. `result_fields[i]` is merged into result i (e.g. a
    share's `shareID` and `consumedCapacity`); `reserved_for` names the pod the claim is reserved for
    (`status.reservedFor`, as the scheduler writes it before the kubelet prepares the claim)."""
    base = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    requests = [{"name": f"r{i}", "exactly": {"deviceClassName": driver}} for i in range(len(devices))]
    claim = rest.request(
        "POST",
        base,
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": requests}},
        },
    )
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": f"r{i}",
                        "driver": driver,
                        "pool": pool,
                        "device": d,
                        **(result_fields[i] if i < len(result_fields) else {}),
                    }
                    for i, d in enumerate(devices)
                ],
                "config": list(config),
            },
            "nodeSelector": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [pool]}]}]
            },
        }
    }
    if reserved_for is not None:
        claim["status"]["reservedFor"] = [{"resource": "pods", "name": reserved_for, "uid": f"uid-{reserved_for}"}]
    return rest.request("PUT", f"{base}/{name}/status", body=claim)
