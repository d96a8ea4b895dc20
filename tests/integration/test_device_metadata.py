"""KEP-5304 device metadata end to end on the sandbox: the scheduler allocates, the kubelet simulator prepares with the
plugin process, and a pod's container reads its metadata file at the in-container path upstream's library defines:
`resourceclaimtemplates/<podClaimName>/…` for a claim made from a template (the claim controller's pod-claim-name
annotation), `resourceclaims/<claimName>/…` for a claim the pod names. With the CDI-check runtime (the host file
behind the CDI mount) and, where podman runs containers, inside a real container."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.k8s.client import JsonObject, KubeRest
from dra_sandbox.cluster import NodeSpec
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.runtime.podman import PodmanRuntime
from tests.integration.conftest import claim_object, sandbox
from tests.narrow import present
from tests.polling import wait_for

ATTRS = "/var/run/kubernetes.io/dra-device-attributes"
TEMPLATE_FILE = f"{ATTRS}/resourceclaimtemplates/gpu/gpu/{DRIVER_NAME}-metadata.json"
CLAIM_FILE = f"{ATTRS}/resourceclaims/direct/gpu/{DRIVER_NAME}-metadata.json"


def _pod(name: str, claim_source: dict[str, str], path: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "vm", "image": "busybox:1.36", "command": ["cat", path],
                            "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", **claim_source}],
        },
    }


def _template() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME}}]}}},
    }


def _finished(api: KubeRest, name: str) -> JsonObject | None:
    pod = api.get(f"/api/v1/namespaces/default/pods/{name}")
    return pod if pod and pod["status"].get("phase") in ("Succeeded", "Failed") else None


def _runtime(name: str) -> str:
    if name == "podman":
        availability = PodmanRuntime().availability()
        if not availability.usable:
            pytest.skip(f"podman cannot run containers here: {availability.reason}")
    return name


@pytest.mark.parametrize("runtime", ["cdi-check", pytest.param("podman", marks=pytest.mark.xdist_group("system-cdi"))])
def test_a_pods_container_reads_its_device_metadata(runtime: str) -> None:
    nodes = [NodeSpec("node-a", "fake:l4x2")]
    with sandbox("dra-meta-", nodes, runtime=_runtime(runtime), device_classes=device_classes(DRIVER_NAME)) as cluster:
        cluster.apply(_template())
        cluster.apply(claim_object("direct"))
        cluster.apply(_pod("from-template", {"resourceClaimTemplateName": "one-gpu"}, TEMPLATE_FILE))
        cluster.apply(_pod("direct", {"resourceClaimName": "direct"}, CLAIM_FILE))
        pci = {
            d["name"]: d["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
            for s in present(cluster.api.get("/apis/resource.k8s.io/v1/resourceslices"))["items"]
            for d in s["spec"].get("devices") or []
        }
        for pod_name, path in (("from-template", TEMPLATE_FILE), ("direct", CLAIM_FILE)):
            pod = wait_for(partial(_finished, cluster.api, pod_name), 60, f"pod {pod_name} to finish")
            seen = json.loads(pod["metadata"]["annotations"]["sandbox.dra.dev/containers"])["vm"]
            assert pod["status"]["phase"] == "Succeeded", seen
            assert seen["executed"] is (runtime == "podman")
            statuses = pod["status"].get("resourceClaimStatuses") or [{"resourceClaimName": "direct"}]
            claim_name = statuses[0]["resourceClaimName"]
            claim = present(cluster.api.get(f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{claim_name}"))
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            uid = claim["metadata"]["uid"]
            assert f"{DRIVER_NAME}/metadata={uid}_gpu" in seen["cdiDevices"]
            mount = next(m for m in seen["mounts"] if m["target"] == path)
            assert "ro" in mount["options"]

            text = seen["files"][path]
            assert text is not None, seen["files"]
            doc = json.JSONDecoder().raw_decode(text)[0]  # the first object of the stream: the newest version
            assert doc["apiVersion"] == "metadata.resource.k8s.io/v1alpha1" and doc["kind"] == "DeviceMetadata"
            assert doc["metadata"]["uid"] == uid
            assert doc.get("podClaimName") == ("gpu" if pod_name == "from-template" else None)
            (request,) = doc["requests"]
            assert request["name"] == "gpu"
            (device,) = request["devices"]
            assert (device["driver"], device["pool"], device["name"]) == (DRIVER_NAME, "node-a", result["device"])
            assert device["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": pci[result["device"]]}

        # The pods are done: deleting them unprepares the claims, and their metadata goes with them.
        for pod_name in ("from-template", "direct"):
            cluster.api.request("DELETE", f"/api/v1/namespaces/default/pods/{pod_name}")
        metadata_dir = cluster.plugins["node-a"].plugin_dir / "dra-device-metadata"
        wait_for(lambda: metadata_dir.is_dir() and not any(metadata_dir.iterdir()), 60, "metadata removed")
        assert not list(cluster.cdi_root.glob(f"{DRIVER_NAME}_metadata_*"))
