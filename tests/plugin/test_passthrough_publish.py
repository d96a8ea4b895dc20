"""The kubelet plugin with `--passthrough` (PluginSettings.passthrough, docs/passthrough.md): what it publishes to the
sandbox API server (which validates every slice), the node label that overrides the flag, the IOMMU-off node that
offers nothing for passthrough, and the start-up refusal of a listed GPU the node lacks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering
from dra_driver.inventory.passthrough import PassthroughError, PassthroughSettings, passthrough_settings, vfio_uuid
from dra_driver.k8s.client import KubeRest
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.plugin.app import KubeletPlugin, PluginSettings
from dra_sandbox.apiserver import ApiServer
from tests.plugin.conftest import plugin_settings
from tests.polling import wait_for

NODE = "node-l4"
LABEL = f"{DRIVER_NAME}/passthrough"


def settings(work: Path, passthrough: PassthroughSettings) -> PluginSettings:
    return replace(plugin_settings(work, NODE, MigOffering.NONE), kube_version=(1, 36), passthrough=passthrough)


def published(rest: KubeRest) -> dict[str, dict[str, Any]]:
    slices = rest.request("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def run_plugin(work: Path, passthrough: str, labels: dict[str, str] | None = None,
               backend: NvmlBackend | None = None) -> dict[str, dict[str, Any]]:
    """Start the plugin on a fake node, wait for its first publish, stop it; what it published."""
    if backend is None:
        backend = open_backend("fake:l4x2")
        backend.init()
    with ApiServer(kube_version="1.36.0") as srv:
        rest = srv.rest()
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": labels or {}}}
        rest.request("POST", "/api/v1/nodes", body=node)
        plugin = KubeletPlugin(settings(work, passthrough_settings(passthrough)), nvml=backend, rest=rest)
        plugin.start()
        try:
            wait_for(lambda: {"gpu-0", "gpu-1"} <= set(published(rest)), 10, "the first publish")
            devices = published(rest)
            vfio = sum(1 for d in devices.values() if d["attributes"]["type"] == {"string": "vfio"})
            assert plugin.metrics.published_devices.labels("vfio")._value.get() == vfio
            return devices
        finally:
            plugin.stop()


def test_the_plugin_publishes_a_vfio_device_per_gpu_on_its_counter_set(work: Path) -> None:
    backend = open_backend("fake:l4x2")
    backend.init()
    bus_ids = {g.minor: g.pci_bus_id for g in backend.gpus()}
    devices = run_plugin(work, "all", backend=backend)
    assert set(devices) == {"gpu-0", "gpu-1", "gpu-0-vfio", "gpu-1-vfio"}
    for minor in (0, 1):
        vfio = devices[f"gpu-{minor}-vfio"]
        assert vfio["attributes"]["uuid"] == {"string": vfio_uuid(bus_ids[minor])}
        assert vfio["attributes"]["iommuFDEnabled"] == {"bool": True}  # the fake node has /dev/iommu
        assert vfio["consumesCounters"] == devices[f"gpu-{minor}"]["consumesCounters"]
        assert vfio["consumesCounters"][0]["counterSet"] == f"gpu-{minor}-counter-set"
        # A fake node has no BAR sizes (and a real device of this machine at the same bus id must not be read).
        assert vfio["capacity"] == {}


@pytest.mark.parametrize(
    ("flag", "label", "offered"),
    [
        ("all", "false", set()),
        ("none", "true", {"gpu-0-vfio", "gpu-1-vfio"}),
        ("1", "true", {"gpu-1-vfio"}),  # true keeps the flag's GPU list
        ("1", "bogus", {"gpu-1-vfio"}),  # an unknown value is ignored: the flag applies
        ("none", "all", {"gpu-0-vfio", "gpu-1-vfio"}),
    ],
)
def test_a_node_label_overrides_the_flag(work: Path, flag: str, label: str, offered: set[str]) -> None:
    devices = run_plugin(work, flag, {LABEL: label})
    assert {n for n in devices if n.endswith("-vfio")} == offered
    if not offered:
        assert all("consumesCounters" not in d for d in devices.values())  # exactly as without passthrough


def test_a_node_with_the_iommu_off_offers_nothing_for_passthrough(work: Path) -> None:
    node = work / "node.yaml"
    node.write_text("gpus:\n  - {model: L4, count: 2}\npci:\n  iommu: \"off\"\n")
    backend = FakeNvml.from_file(node, settings=None)
    backend.init()
    devices = run_plugin(work, "all", backend=backend)
    assert set(devices) == {"gpu-0", "gpu-1"}


def test_a_listed_gpu_the_node_lacks_refuses_to_start_before_touching_the_node(work: Path) -> None:
    backend = open_backend("fake:l4x2")
    backend.init()
    with ApiServer() as srv:
        plugin = KubeletPlugin(settings(work, passthrough_settings("0,7")), nvml=backend, rest=srv.rest())
        try:
            with pytest.raises(PassthroughError, match=r"--passthrough '0,7': this node has no GPU 7; its GPUs are 0 \("):
                plugin.start()
        finally:
            plugin.stop()  # a start that failed still stops what it began (the driver-state annotator)
    assert not (work / "p").exists()
