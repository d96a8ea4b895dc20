"""A real kubelet plugin (fake NVML, sandbox API server) with its metrics on an ephemeral port."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering
from dra_driver.k8s.client import KubeRest
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.plugin.app import KubeletPlugin, PluginSettings
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.objects import create_allocated_claim

NODE = "node-h100"


@dataclass
class LivePlugin:
    plugin: KubeletPlugin
    rest: KubeRest
    nvml: FakeNvml

    @property
    def port(self) -> int:
        assert self.plugin.metrics_server is not None
        return self.plugin.metrics_server.port

    def claim(self, namespace: str, name: str, devices: list[str], pod: str | None = None) -> ClaimRef:
        namespaces = {n["metadata"]["name"] for n in self.rest.request("GET", "/api/v1/namespaces")["items"]}
        if namespace not in namespaces:
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            self.rest.request("POST", "/api/v1/namespaces", body=body)
        created = create_allocated_claim(
            self.rest, namespace=namespace, name=name, driver=DRIVER_NAME, pool=NODE, devices=devices
        )
        if pod is not None:
            created["status"]["reservedFor"] = [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}]
            path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}/status"
            created = self.rest.request("PUT", path, body=created)
        return ClaimRef(namespace, name, str(created["metadata"]["uid"]))


@pytest.fixture
def live() -> Iterator[LivePlugin]:
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra-obs-"))
    (work / "boot_id").write_text("b\n")
    nvml = FakeNvml.preset("dgx-h100")
    nvml.init()
    with ApiServer() as srv:
        rest = srv.rest()
        rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        settings = PluginSettings(
            node_name=NODE,
            driver_name=DRIVER_NAME,
            plugin_dir=work / "p",
            registry_dir=work / "r",
            cdi_root=work / "cdi",
            driver_root=Path("/"),
            host_driver_root=Path("/"),
            mig_offering=MigOffering.DYNAMIC,
            fake_cdi=True,
            healthz_port=None,
            metrics_port=0,
            usage_interval=30.0,  # passes follow prepare/unprepare (the engine wakes the sampler), not the clock
            boot_id_path=work / "boot_id",
            kube_version=(1, 35),
            health_monitor=False,
        )
        plugin = KubeletPlugin(settings, nvml=nvml, rest=srv.rest())
        plugin.start()
        try:
            yield LivePlugin(plugin, rest, nvml)
        finally:
            plugin.stop()
    shutil.rmtree(work, ignore_errors=True)
