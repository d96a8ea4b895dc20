"""KEP-5963 compatibility groups honoured by upstream's kube-scheduler 1.37 (DRADeviceCompatibilityGroups, alpha and
off), against the driver's allocator (`dra-driver explain`) and the sandbox's scheduler stand-in, on the driver's own
slices: a GPU offered as vGPUs with `--compatibility-groups on` (each vGPU type a group of its own, docs/vgpu.md).

Two claims ask for vGPUs of two types on the node's one GPU. Their slots' memory shares fit the GPU together, so the
counters alone would allow both: only the groups keep two types off one GPU. Gate on: the plugin's probe finds the
field kept, the slices carry the groups, kube-scheduler allocates the first claim and leaves the second pod
unschedulable, and explain and the stand-in say the second fits nowhere. Gate off: the probe finds it dropped, the
slices carry none (nothing the server would drop is sent), and all three allocate both. Skips with the upstream
banner where the binaries are not built.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.cel import DraCelEnvironment
from dra_driver.commands.explain import claim_gates, explain_claim
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.passthrough import PassthroughSettings
from dra_driver.inventory.sharing import EXCLUSIVE
from dra_driver.inventory.vgpu import vgpu_settings
from dra_driver.k8s.client import JsonObject, KubeRest
from dra_driver.k8s.serverfeatures import SliceFeature, probe
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.polling import wait_for
from dra_sandbox.scheduler import plan_pod
from dra_sandbox.upstream.controlplane import ControlPlane, ControlPlaneConfig
from tests.upstream.conftest import DRIVER, MINOR, release_binaries
from tests.upstream.test_controlplane import TIMEOUT
from tests.upstream.test_derived_attributes import NODE, _ready_node

pytestmark = pytest.mark.xdist_group("upstream")
RESOURCE = "/apis/resource.k8s.io/v1"
GATE = "DRADeviceCompatibilityGroups"
GPU = "name: vgpu-node\ngpus:\n  - model: H100-SXM5-80GB\n    count: 1\n"
SMALL, BIG = 908, 904  # NVIDIA H100-10C (8 per GPU) and H100-20C (4 per GPU): 1/8 + 1/4 of the memory fit


@pytest.fixture(scope="module", params=["gate-on", "gate-off"])
def plane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    if MINOR != "1.37":
        pytest.skip(f"compatibility groups are in 1.37 (DRA_UPSTREAM_K8S={MINOR})")
    config = ControlPlaneConfig(tmp_path_factory.mktemp(f"groups-{request.param}"), release_binaries(),
                                extra_feature_gates={GATE: request.param == "gate-on"})
    with ControlPlane(config) as started:
        yield started


def _slices(rest: KubeRest, work: Path) -> list[JsonObject]:
    """The node's slices as the plugin builds them with `--vgpu all --compatibility-groups on` after its probe."""
    node_file = work / "node.yaml"
    node_file.write_text(GPU)
    backend = open_backend(f"fake:{node_file},vgpu=true")
    backend.init()
    inventory = discover(backend)
    grouped = PassthroughSettings(compatibility_groups=True)
    served = probe(rest, SliceFeature.COMPATIBILITY_GROUPS, driver=DRIVER, node=NODE, kube_version=(1, 37)).served
    devices = catalog(inventory, MigOffering.NONE, EXCLUSIVE, grouped, vgpu_settings("all"))
    settings = SliceSettings(driver_name=DRIVER, node_name=NODE, kube_version=(1, 37), passthrough=grouped,
                             vgpu=vgpu_settings("all"), compatibility_groups_served=served)
    return build_slices(inventory.system, devices, settings, 1)


def _claim(name: str, type_id: int) -> JsonObject:
    selector = f'device.attributes["{DRIVER}"].vgpuTypeId == {type_id}'
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "vgpu", "exactly": {
                "deviceClassName": f"vgpu.{DRIVER}", "selectors": [{"cel": {"expression": selector}}]}}]}}}


def _pod(name: str) -> JsonObject:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"claims": [{"name": "vgpu"}]}}],
                     "resourceClaims": [{"name": "vgpu", "resourceClaimName": name}]}}


def _decided(rest: KubeRest, name: str) -> JsonObject:
    def look() -> JsonObject | None:
        pod = rest.request("GET", f"/api/v1/namespaces/default/pods/{name}")
        scheduled = [c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == "PodScheduled"]
        bound = bool((pod.get("spec") or {}).get("nodeName"))
        return pod if bound or (scheduled and scheduled[0].get("reason") == "Unschedulable") else None

    return wait_for(look, TIMEOUT, f"kube-scheduler to bind pod {name} or find it unschedulable", interval=0.2)


def test_two_vgpu_types_never_share_a_gpu_where_the_scheduler_has_the_gate(
        plane: ControlPlane, tmp_path: Path) -> None:
    on = bool(plane.config.extra_feature_gates[GATE])
    rest = plane.admin()
    wait_for(lambda: rest.get("/api/v1/namespaces/default/serviceaccounts/default"), TIMEOUT,
             "the ServiceAccount default/default")
    node = _ready_node(rest)
    for cls in device_classes(DRIVER):
        rest.request("POST", f"{RESOURCE}/deviceclasses", body=cls)
    sent = _slices(rest, tmp_path)
    grouped = [c for s in sent for d in s["spec"].get("devices", []) for c in d.get("consumesCounters", [])
               if "compatibilityGroups" in c]
    assert bool(grouped) is on  # nothing the API server would drop is sent
    for obj in sent:
        rest.request("POST", f"{RESOURCE}/resourceslices", body=obj)

    results: dict[str, Any] = {}
    for name, type_id in (("small", SMALL), ("big", BIG)):
        rest.request("POST", f"{RESOURCE}/namespaces/default/resourceclaims", body=_claim(name, type_id))
        rest.request("POST", "/api/v1/namespaces/default/pods", body=_pod(name))
        results[name] = _decided(rest, name)
    assert results["small"]["spec"].get("nodeName") == NODE
    assert bool(results["big"]["spec"].get("nodeName")) is not on, results["big"].get("status")

    # The driver's allocator and the stand-in, on what kube-scheduler saw before it tried `big`.
    claims = rest.request("GET", f"{RESOURCE}/namespaces/default/resourceclaims")["items"]
    small = next(c for c in claims if c["metadata"]["name"] == "small")
    big = {**next(c for c in claims if c["metadata"]["name"] == "big"), "status": {}}
    classes = rest.request("GET", f"{RESOURCE}/deviceclasses")["items"]
    slices = rest.request("GET", f"{RESOURCE}/resourceslices")["items"]
    fits, text = explain_claim(big, nodes=[node], classes=classes, slices=slices, claims=[small],
                               namespace_labels={}, feature_gates=claim_gates(big, None, slices))
    assert fits == ([] if on else [NODE]), text
    if on:
        assert "compatibility groups do not intersect" in text, text
    plan: Any = plan_pod(results["big"], [big], nodes=[node], classes=classes, slices=slices,
                         allocated_claims=[small], namespace_labels={}, cel=DraCelEnvironment(kubernetes_minor=37),
                         kube_version=(1, 37), feature_gates={GATE: on})
    assert (plan.node == NODE) is not on, plan.explanation
