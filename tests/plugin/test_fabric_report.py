"""The kubelet plugin on a GB200 NVL72 tray whose NVLink fabric breaks: it starts and keeps offering its GPUs, and the
problem (and its end) reaches the Node's Events once each, on the real in-process API server."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering
from dra_driver.k8s.client import KubeRest
from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.nvml.types import FabricState
from dra_driver.plugin.app import KubeletPlugin, PluginSettings
from dra_sandbox.apiserver import ApiServer
from tests.narrow import present
from tests.polling import wait_for

NODE = "tray-0"
CLUSTER = "5c3e7a1f-2b4d-4e8a-9f61-0d2c8b7a4e13"


@dataclass
class Env:
    plugin: KubeletPlugin
    rest: KubeRest
    fake: FakeNvml

    def node_events(self) -> list[dict[str, Any]]:
        assert self.plugin.events is not None and self.plugin.events.flush()
        items = self.rest.request("GET", "/api/v1/namespaces/default/events")["items"]
        return [e for e in items if e["involvedObject"]["kind"] == "Node" and e["involvedObject"]["name"] == NODE]

    def published(self) -> set[str]:
        slices = self.rest.request("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
        return {d["name"] for s in slices for d in s["spec"].get("devices", [])}


@pytest.fixture
def env() -> Iterator[Env]:
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra-fabric-"))
    (work / "boot_id").write_text("b\n")
    fake = FakeNvml.preset("gb200-nvl72", seed=NODE)
    fake.init()
    # The fabric is broken before the plugin starts: registration of GPU 1 still in progress.
    gpu1 = fake.gpus()[1].uuid
    fake.set_fabric(gpu1, replace(present(fake.fabric_info(gpu1)), state=FabricState.IN_PROGRESS))
    with ApiServer() as srv:
        rest = srv.rest()
        rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        settings = PluginSettings(
            node_name=NODE, driver_name=DRIVER_NAME, plugin_dir=work / "p", registry_dir=work / "r",
            cdi_root=work / "cdi", driver_root=Path("/"), host_driver_root=Path("/"), mig_offering=MigOffering.NONE,
            fake_cdi=True, healthz_port=None, boot_id_path=work / "boot_id", kube_version=(1, 35),
            rediscovery_interval=3600.0, usage_interval=0,
        )  # fmt: skip
        plugin = KubeletPlugin(settings, nvml=fake, rest=srv.rest())
        plugin.start()
        e = Env(plugin, rest, fake)
        try:
            yield e
        finally:
            plugin.stop()
    shutil.rmtree(work, ignore_errors=True)


def test_a_broken_fabric_is_reported_once_and_its_repair_too(env: Env) -> None:
    # Started despite the fault, and offering every GPU.
    wait_for(lambda: env.published() == {"gpu-0", "gpu-1", "gpu-2", "gpu-3"}, 10, "the first publish")
    (problem,) = [e for e in env.node_events() if e["reason"] == "NVLinkFabricProblem"]
    assert problem["type"] == "Warning"
    assert problem["message"].startswith("NVLink fabric not ready on 1 GPU(s) (GPU 1 (GPU-")
    assert "registration IN_PROGRESS" in problem["message"] and "Fabric Manager" in problem["message"]
    assert problem["involvedObject"]["uid"]  # the Node's, so `kubectl describe node` shows it
    # The same problem found again by the next rediscovery is no new Event and no second occurrence.
    env.plugin.rediscover()
    (again,) = [e for e in env.node_events() if e["reason"] == "NVLinkFabricProblem"]
    assert again.get("count", 1) == 1

    gpu1 = env.fake.gpus()[1].uuid
    env.fake.set_fabric(gpu1, None)  # Fabric Manager finished
    env.plugin.rediscover()
    (ready,) = [e for e in env.node_events() if e["reason"] == "NVLinkFabricReady"]
    assert ready["type"] == "Normal" and ready["message"] == f"NVLink fabric ready: the node is in clique {CLUSTER}.0"
    assert env.published() == {"gpu-0", "gpu-1", "gpu-2", "gpu-3"}
