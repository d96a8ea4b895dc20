"""The GPU driver's KEP-5304 device metadata (plugin/devicemetadata.py on kubeletplugin/metadata.py): a plugin in this
process against the sandbox API server. What each prepared device's file says (the ResourceSlice's attributes, the
PCI bus id, a dynamic MIG device's live UUID), that the Prepare response carries the mount, that unprepare removes it,
and which API server versions `--device-metadata auto|on|off` writes it for."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering
from dra_driver.k8s.client import JsonObject, KubeRest
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.nvml.factory import open_backend
from dra_driver.plugin.app import KubeletPlugin
from dra_driver.plugin.devicemetadata import DeviceMetadataMode, metadata_enabled
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.objects import create_allocated_claim
from tests.narrow import present
from tests.plugin.conftest import plugin_settings
from tests.polling import wait_for

NODE = "n1"
PCI = "resource.kubernetes.io/pciBusID"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def _plugin(server: ApiServer, work: Path, mode: DeviceMetadataMode) -> KubeletPlugin:
    backend = open_backend("fake:dgx-h100")
    backend.init()
    settings = replace(plugin_settings(work, NODE, MigOffering.DYNAMIC), usage_interval=0, events=False,
                       device_metadata=mode)
    return KubeletPlugin(settings, nvml=backend, rest=KubeRest(server.connection()))


def _server(version: str) -> ApiServer:
    server = ApiServer(kube_version=version)
    server.start()
    server.rest().request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    return server


@pytest.fixture
def running(work: Path) -> Iterator[tuple[KubeletPlugin, ApiServer]]:
    server = _server("1.36.0")
    plugin = _plugin(server, work, DeviceMetadataMode.AUTO)
    plugin.start()
    try:
        yield plugin, server
    finally:
        plugin.stop()
        server.stop()


def _prepare(plugin: KubeletPlugin, server: ApiServer, name: str, devices: list[str]) -> ClaimRef:
    claim = create_allocated_claim(server.rest(), namespace="default", name=name, driver=DRIVER_NAME, pool=NODE,
                                   devices=devices)  # fmt: skip
    ref = ClaimRef("default", name, claim["metadata"]["uid"])
    result = plugin.claim_engine.prepare([ref])[ref.uid]
    assert result.error == ""
    return ref


def _file(plugin: KubeletPlugin, ref: ClaimRef, request: str) -> Path:
    return plugin.settings.plugin_dir / "dra-device-metadata" / f"{ref.namespace}_{ref.name}" / request / "metadata.json"


def _device(plugin: KubeletPlugin, ref: ClaimRef, request: str) -> dict[str, Any]:
    doc = json.JSONDecoder().raw_decode(_file(plugin, ref, request).read_text())[0]
    assert doc["apiVersion"] == "metadata.resource.k8s.io/v1alpha1" and doc["kind"] == "DeviceMetadata"
    assert doc["metadata"]["uid"] == ref.uid and "podClaimName" not in doc
    (request_doc,) = doc["requests"]
    assert request_doc["name"] == request
    (device,) = request_doc["devices"]
    assert device["driver"] == DRIVER_NAME and device["pool"] == NODE
    result: dict[str, Any] = device
    return result


def _published(server: ApiServer, name: str) -> JsonObject:
    def find() -> JsonObject | None:
        for item in present(server.rest().get(SLICES))["items"]:
            for device in item["spec"].get("devices") or []:
                if device["name"] == name:
                    result: JsonObject = device
                    return result
        return None

    return wait_for(find, 20, f"{name} in a ResourceSlice")


def test_a_whole_gpu_and_a_dynamic_mig_device_carry_their_slice_attributes_and_live_identity(
    running: tuple[KubeletPlugin, ApiServer],
) -> None:
    plugin, server = running
    mig = "gpu-0-mig-1g10gb-19-0"
    ref = _prepare(plugin, server, "c1", [mig, "gpu-1"])

    whole = _device(plugin, ref, "r1")
    gpu1 = plugin.devices()["gpu-1"].gpu
    assert whole["name"] == "gpu-1"
    assert whole["attributes"] == _published(server, "gpu-1")["attributes"]
    assert whole["attributes"][PCI] == {"string": gpu1.info.pci_bus_id}
    assert whole["attributes"]["uuid"] == {"string": gpu1.uuid}

    carved = _device(plugin, ref, "r0")
    record = next(d for d in plugin.engine.prepared_claims().claims[ref.uid].devices if d.device == mig)
    assert record.mig is not None and record.mig.uuid and record.mig.uuid.startswith("MIG-")
    published = _published(server, mig)["attributes"]
    assert "uuid" not in published  # a dynamic MIG device has no UUID before it is carved
    assert carved["attributes"] == {**published, "uuid": {"string": record.mig.uuid}}
    assert carved["attributes"][PCI] == {"string": plugin.devices()[mig].gpu.info.pci_bus_id}
    assert carved["attributes"]["parentUUID"] == {"string": record.mig.parent_uuid}

    # The Prepare response mounts each request's file; a repeated prepare (from the checkpoint) says the same.
    again = plugin.claim_engine.prepare([ref])[ref.uid]
    ids = {d.device: d.cdi_device_ids for d in again.devices}
    assert f"{DRIVER_NAME}/metadata={ref.uid}_r0" in ids[mig]
    assert f"{DRIVER_NAME}/metadata={ref.uid}_r1" in ids["gpu-1"]
    assert (plugin.settings.cdi_root / f"{DRIVER_NAME}_metadata_{ref.uid}_r0.json").is_file()

    assert plugin.claim_engine.unprepare([ref]) == {ref.uid: ""}
    assert not _file(plugin, ref, "r0").parent.parent.exists()
    assert not list(plugin.settings.cdi_root.glob(f"{DRIVER_NAME}_metadata_*"))


def test_a_template_claims_pod_claim_name_survives_a_restart(work: Path) -> None:
    server = _server("1.37.0")
    try:
        admin = server.rest()
        claim = create_allocated_claim(admin, namespace="default", name="pod-gpu-abcde", driver=DRIVER_NAME,
                                       pool=NODE, devices=["gpu-2"])  # fmt: skip
        admin.request("PATCH", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/pod-gpu-abcde",
                      body={"metadata": {"annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"}}},
                      content_type="application/merge-patch+json")  # fmt: skip
        ref = ClaimRef("default", "pod-gpu-abcde", claim["metadata"]["uid"])
        first = _plugin(server, work, DeviceMetadataMode.AUTO)
        first.start()
        assert first.claim_engine.prepare([ref])[ref.uid].error == ""
        first.stop()
        spec = work / "cdi" / f"{DRIVER_NAME}_metadata_{ref.uid}_r0.json"
        spec.unlink()  # as if the crash came before the spec was written
        second = _plugin(server, work, DeviceMetadataMode.AUTO)
        second.start()
        try:
            assert second.claim_engine.prepare([ref])[ref.uid].error == ""
            mount = json.loads(spec.read_text())["devices"][0]["containerEdits"]["mounts"][0]
            assert mount["containerPath"] == (
                "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/r0/gpu.dra.dev-metadata.json"
            )
        finally:
            second.stop()
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("version", "mode", "written"),
    [
        ("1.35.2", DeviceMetadataMode.AUTO, False),
        ("1.36.0", DeviceMetadataMode.AUTO, True),
        ("1.37.1", DeviceMetadataMode.AUTO, True),
        ("1.35.2", DeviceMetadataMode.ON, True),
        ("1.37.1", DeviceMetadataMode.OFF, False),
    ],
)
def test_the_flag_by_api_server_version(work: Path, version: str, mode: DeviceMetadataMode, written: bool) -> None:
    server = _server(version)
    plugin = _plugin(server, work, mode)
    plugin.start()
    try:
        ref = _prepare(plugin, server, "c1", ["gpu-0"])
        ids = plugin.claim_engine.prepare([ref])[ref.uid].devices[0].cdi_device_ids
        assert (f"{DRIVER_NAME}/metadata={ref.uid}_r0" in ids) is written
        assert _file(plugin, ref, "r0").is_file() is written
    finally:
        plugin.stop()
        server.stop()


def test_metadata_enabled() -> None:
    assert not metadata_enabled(DeviceMetadataMode.AUTO, None)
    assert not metadata_enabled(DeviceMetadataMode.AUTO, (1, 35))
    assert metadata_enabled(DeviceMetadataMode.AUTO, (1, 36))
    assert metadata_enabled(DeviceMetadataMode.ON, None)
    assert not metadata_enabled(DeviceMetadataMode.OFF, (1, 37))


def test_metadata_of_a_claim_deleted_while_the_plugin_was_down_is_swept_at_start(work: Path) -> None:
    server = _server("1.36.0")
    try:
        first = _plugin(server, work, DeviceMetadataMode.ON)
        first.start()
        ref = _prepare(first, server, "c1", ["gpu-0"])
        first.stop()
        assert _file(first, ref, "r0").is_file()
        server.rest().request("DELETE", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c1")
        second = _plugin(server, work, DeviceMetadataMode.ON)
        second.start()
        try:
            # The stale-claim cleanup unprepares it without the kubelet; the sweep after it removes the files.
            wait_for(lambda: not _file(second, ref, "r0").exists(), 20, "the deleted claim's metadata swept")
            assert not list((work / "cdi").glob(f"{DRIVER_NAME}_metadata_*"))
        finally:
            second.stop()
    finally:
        server.stop()
