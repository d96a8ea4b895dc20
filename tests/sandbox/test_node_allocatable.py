"""KEP-5517's 1.37 field `Device.nodeAllocatableResources` on the sandbox API server, as kube-apiserver 1.37.2
answers it: without `DRANodeAllocatableResources` (the default) dropped silently, also under `Strict` field
validation (the strategy's dropDisabledFields runs before validation); with the gate kept. docs/sandbox.md."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.k8s.client import KubeRest
from dra_sandbox.apiserver import ApiServer

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
OVERHEAD = {"memory": {"overhead": {"perPod": "1Gi"}}}


def _slice(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
        "spec": {"driver": "gpu.dra.dev", "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                 "nodeName": "n", "devices": [{"name": "gpu-0", "nodeAllocatableResources": OVERHEAD}]},
    }  # fmt: skip


@pytest.fixture(scope="module", params=[True, False], ids=["gate-on", "gate-off"])
def rest(request: pytest.FixtureRequest) -> Iterator[tuple[KubeRest, bool]]:
    gates = {"DRANodeAllocatableResources": request.param}
    with ApiServer(garbage_collection=False, kube_version="1.37.2", feature_gates=gates) as srv:
        yield srv.rest(), request.param


def test_the_field_is_kept_only_with_the_gate_and_never_refused(rest: tuple[KubeRest, bool]) -> None:
    client, on = rest
    stored = client.request("POST", SLICES, body=_slice(f"s-{str(on).lower()}"), query={"fieldValidation": "Strict"})
    assert stored["spec"]["devices"][0].get("nodeAllocatableResources") == (OVERHEAD if on else None)
