"""Objects the sandbox's tests and benchmarks write straight into the API, bypassing the scheduler."""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

from dra_driver.k8s.client import JsonObject, KubeRest

# The longest name Kubernetes accepts for a ResourceClaim (a DNS-1123 subdomain: `validation.IsDNS1123Subdomain`).
CLAIM_NAME_MAX: Final = 253


def claim_name(prefix: str, rng: random.Random, long_share: float) -> str:
    """A unique claim name `<prefix>-<hex>`; with probability `long_share` stretched to CLAIM_NAME_MAX bytes, so
    that every file or directory the plugins derive from it is tested past the kernel's 255-byte NAME_MAX once
    the namespace is added (docs/kubelet-plugin.md "File names from API names")."""
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    if rng.random() < long_share:
        name = f"{name}-{'x' * (CLAIM_NAME_MAX - len(name) - 3)}-z"
    return name


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
