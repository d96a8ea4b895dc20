"""A CDI spec written by the plugin's prepare is injected into a REAL podman container: the container sees
the env the spec carries. Skipped only where podman cannot run containers (the reason is printed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_sandbox.cluster import NodeSpec
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.runtime.podman import PodmanRuntime
from tests.integration.conftest import claim_object, pod_object, sandbox
from tests.narrow import present
from tests.polling import wait_for

# Sandboxes whose containers run under podman share the machine's /var/run/cdi: one test worker at a time.
pytestmark = pytest.mark.xdist_group("system-cdi")


def test_prepared_claim_reaches_a_real_container() -> None:
    availability = PodmanRuntime().availability()
    if not availability.usable:
        pytest.skip(f"podman cannot run containers here: {availability.reason}")
    nodes = [NodeSpec("node-l4", "fake:l4x2")]
    with sandbox("dra-podman-", nodes, runtime="podman", device_classes=device_classes(DRIVER_NAME)) as cluster:
        cluster.apply(claim_object("one"))
        cluster.apply(pod_object("cuda", "one", restart_policy="Never"))
        pod = wait_for(
            lambda: (lambda p: p if p and p["status"].get("phase") in ("Succeeded", "Failed") else None)(
                cluster.api.get("/api/v1/namespaces/default/pods/cuda")
            ),
            60,
            "the pod to finish",
        )
        seen = json.loads(pod["metadata"]["annotations"]["sandbox.dra.dev/containers"])["main"]
        assert pod["status"]["phase"] == "Succeeded", seen
        assert seen["executed"] is True  # really ran under podman, not just parsed
        claim = present(cluster.api.get("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/one"))
        device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
        uid = claim["metadata"]["uid"]
        # The claim's spec, then the request's KEP-5304 device metadata mount (the sandbox reports 1.37: on).
        assert seen["cdiDevices"] == [f"k8s.{DRIVER_NAME}/claim={uid}-{device}", f"{DRIVER_NAME}/metadata={uid}_gpu"]
        visible = seen["env"]["NVIDIA_VISIBLE_DEVICES"]
        assert visible.startswith("GPU-") and seen["env"]["CUDA_VISIBLE_DEVICES"] == visible
        key = "DRA_DEVICE_" + device.upper().replace("-", "_")
        assert seen["env"][f"{key}_UUID"] == visible
        assert seen["env"][f"{key}_PRODUCT"] == "NVIDIA L4"
        assert cluster.cdi_root == Path("/var/run/cdi")
