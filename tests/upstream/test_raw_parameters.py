"""kube-apiserver keeps an opaque config's `parameters` as the bytes it was sent (a RawExtension) and re-encodes
the object the Go way for a JSON merge patch: bytes Go would write differently then read as a change of
`status.allocation`, and a write of only `status.devices` (the kubelet plugin's device status, the ComputeDomain
controller's binding conditions) is refused. The product's client writes Go's bytes (docs/kubelet-plugin.md
"Device status in the claim"); this module shows both outcomes on the real API server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_sandbox.upstream.controlplane import ControlPlane, ControlPlaneConfig
from tests.upstream.conftest import DRIVER, release_binaries

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
MERGE = "application/merge-patch+json"

pytestmark = pytest.mark.xdist_group("upstream")  # one control plane at a time on the 2-core machines


@pytest.fixture(scope="module")
def admin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeRest]:
    binaries = release_binaries()
    work: Path = tmp_path_factory.mktemp("rawparams")
    with ControlPlane(ControlPlaneConfig(work / "controlplane", binaries)) as plane:
        yield plane.admin()


def _allocated_claim(admin: KubeRest, name: str, encode: object) -> JsonObject:
    """A claim with an opaque config, allocated with that config as kube-scheduler copies it (the bytes as
    stored), both written with `encode` (a function of the object to the request body)."""
    assert callable(encode)
    parameters = {"apiVersion": "gpu.dra.dev/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
             "spec": {"devices": {"requests": [{"name": "r0", "exactly": {"deviceClassName": "gpu.dra.dev"}}],
                                  "config": [{"requests": ["r0"], "opaque": {"driver": DRIVER,
                                                                             "parameters": parameters}}]}}}
    stored = admin.request("POST", CLAIMS, body=encode(claim))
    stored["status"] = {"allocation": {
        "devices": {"results": [{"request": "r0", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}],
                    "config": [{"source": "FromClaim", "requests": ["r0"],
                                "opaque": {"driver": DRIVER, "parameters": parameters}}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}}}
    return admin.request("PUT", f"{CLAIMS}/{name}/status", body=encode(stored))


def _write_device_status(admin: KubeRest, claim: JsonObject) -> JsonObject:
    """The kubelet plugin's write: a JSON merge patch of only `status.devices`, on the resourceVersion read."""
    name = claim["metadata"]["name"]
    devices = [{"driver": DRIVER, "pool": "node-a", "device": "gpu-0",
                "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared", "message": "",
                                "lastTransitionTime": "2026-12-02T08:00:00Z"}]}]
    return admin.request("PATCH", f"{CLAIMS}/{name}/status", content_type=MERGE, body={
        "metadata": {"resourceVersion": claim["metadata"]["resourceVersion"]}, "status": {"devices": devices}})


def test_a_claim_the_product_wrote_takes_a_device_status_patch(admin: KubeRest) -> None:
    claim = _allocated_claim(admin, "written-by-the-product", lambda obj: obj)  # the client's own encoding
    patched = _write_device_status(admin, claim)
    assert [d["device"] for d in patched["status"]["devices"]] == ["gpu-0"]
    assert patched["status"]["allocation"] == claim["status"]["allocation"]


def test_a_claim_written_with_spaces_refuses_every_json_status_write(admin: KubeRest) -> None:
    """Python's default json.dumps (as the `kubernetes` package sends): the allocation's stored bytes no longer
    match their Go encoding, so kube-apiserver sees the patch change `status.allocation`."""
    claim = _allocated_claim(admin, "written-with-spaces", lambda obj: json.dumps(obj).encode())
    with pytest.raises(ApiError) as refused:
        _write_device_status(admin, claim)
    assert refused.value.status == 422
    # 1.37's declarative rule says "field cannot be modified once set"; 1.35's handwritten one "field is immutable".
    message = str(refused.value)
    assert "status.allocation" in message
    assert "field cannot be modified once set" in message or "field is immutable" in message, message
