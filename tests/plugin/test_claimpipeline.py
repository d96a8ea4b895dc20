"""The GPU plugin's prepare pipeline (plugin/claimpipeline.py) in a whole plugin against the sandbox API server.

With every step on (the reload gate, device metadata, Events, status.devices), one NodePrepareResources reads the
checkpoint once: the engine's read; the observers take the record the engine's answer carries. Counted with a
counting store (every `load` of the layer's CheckpointStore, in the thread that serves the call), and checked
against what the steps did: the metadata file and its CDI id, the claim's status.devices entry."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering
from dra_driver.k8s.client import JsonObject, KubeRest
from dra_driver.kubeletplugin import checkpoint as store
from dra_driver.kubeletplugin.driver import ClaimRef, PrepareResult
from dra_driver.kubeletplugin.metadata import MetadataFiles
from dra_driver.kubeletplugin.pipeline import PreparePipeline
from dra_driver.nvml.factory import open_backend
from dra_driver.plugin import claimpipeline
from dra_driver.plugin.app import KubeletPlugin
from dra_driver.plugin.cdi import DurableSpecs
from dra_driver.plugin.claimevents import ClaimEvents
from dra_driver.plugin.devicemetadata import DeviceMetadataMode, MetadataAttributes
from dra_driver.plugin.devicestatus import DeviceStatusReport
from dra_driver.plugin.reloadgate import ReloadGate
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.objects import create_allocated_claim
from tests.plugin.conftest import plugin_settings
from tests.polling import wait_for

NODE = "n1"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


class LoadCounter:
    """Counts CheckpointStore.load calls made by one thread (the plugin's own loops read it too, elsewhere)."""

    def __init__(self, original: Callable[[store.CheckpointStore[object]], object]) -> None:
        self.original = original
        self.thread = threading.get_ident()
        self.loads = 0

    def load(self, own: store.CheckpointStore[object]) -> object:
        if threading.get_ident() == self.thread:
            self.loads += 1
        return self.original(own)

    def during(self, call: Callable[[], object]) -> int:
        before = self.loads
        call()
        return self.loads - before


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch, work: Path) -> Iterator[tuple[KubeletPlugin, ApiServer, LoadCounter]]:
    counter = LoadCounter(store.CheckpointStore.load)
    # On the class, before the plugin exists: a bound `load` kept by any part of the plugin is counted too.
    monkeypatch.setattr(store.CheckpointStore, "load", lambda own: counter.load(own))
    backend = open_backend("fake:dgx-h100")
    backend.init()
    settings = replace(plugin_settings(work, NODE, MigOffering.DYNAMIC), usage_interval=0,
                       device_metadata=DeviceMetadataMode.ON)  # fmt: skip
    with ApiServer(kube_version="1.36.0") as server:
        server.rest().request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node",
                                                              "metadata": {"name": NODE}})  # fmt: skip
        plugin = KubeletPlugin(settings, nvml=backend, rest=KubeRest(server.connection()))
        plugin.start()
        try:
            yield plugin, server, counter
        finally:
            plugin.stop()


def _claim(server: ApiServer, name: str, devices: list[str]) -> ClaimRef:
    claim = create_allocated_claim(server.rest(), namespace="default", name=name, driver=DRIVER_NAME, pool=NODE,
                                   devices=devices)  # fmt: skip
    return ClaimRef("default", name, claim["metadata"]["uid"])


@pytest.mark.parametrize("device", ["gpu-1", "gpu-0-mig-1g10gb-19-0"], ids=["whole-gpu", "dynamic-mig"])
def test_a_prepare_reads_the_checkpoint_once_with_every_step_on(
    counted: tuple[KubeletPlugin, ApiServer, LoadCounter], device: str
) -> None:
    plugin, server, counter = counted
    ref = _claim(server, "c1", [device])
    answers: list[PrepareResult] = []
    assert counter.during(lambda: answers.append(plugin.claim_engine.prepare([ref])[ref.uid])) == 1
    (result,) = answers
    assert result.error == ""
    # The steps ran on the record, not on a read of their own: the metadata file and its CDI id are there...
    assert f"{DRIVER_NAME}/metadata={ref.uid}_r0" in result.devices[0].cdi_device_ids
    assert plugin.metadata.writer.metadata_file(ref, "r0").is_file()
    # ...and the claim's status.devices entry is written from it.
    (entry,) = wait_for(lambda: _status_devices(server, "c1"), 20, "the claim's status.devices entry")
    assert (entry["device"], entry["conditions"][-1]["reason"]) == (device, "Prepared")
    # A repeated prepare (the kubelet's retry) reads it once too, and answers the same.
    again: list[PrepareResult] = []
    assert counter.during(lambda: again.append(plugin.claim_engine.prepare([ref])[ref.uid])) == 1
    assert again == [result]


def _status_devices(server: ApiServer, name: str) -> list[JsonObject]:
    claim = server.rest().get(f"{CLAIMS}/{name}") or {}
    return list((claim.get("status") or {}).get("devices") or [])


def test_what_runs_on_node_prepare_resources_is_one_registration(
    counted: tuple[KubeletPlugin, ApiServer, LoadCounter],
) -> None:
    """The pipeline the kubelet's calls reach: the reload gate guards, and the observers run in the order
    claim_pipeline's docstring lists (describe before the metadata files, the reload check before the reports)."""
    plugin, _, _ = counted
    pipeline = plugin.claim_engine
    assert isinstance(pipeline, PreparePipeline) and pipeline.engine is plugin.engine
    assert [type(g) for g in pipeline.guards] == [ReloadGate]
    steps = [MetadataAttributes, MetadataFiles, DurableSpecs, ReloadGate, ClaimEvents, DeviceStatusReport]
    assert [type(o) for o in pipeline.observers] == steps
    doc = claimpipeline.claim_pipeline.__doc__ or ""
    listed = ["reloadgate.py", "devicemetadata.py", "kubeletplugin/metadata.py", "`DurableSpecs`", "claimevents.py",
              "devicestatus.py"]  # fmt: skip
    assert [doc.index(name) for name in listed] == sorted(doc.index(name) for name in listed)
