"""An NVIDIA driver reload under a serving plugin (plugin/driverreload.py): detection, the retryable refusals, the
unmonitored taint, NVML re-initialised, republished with the new driverVersion, prepared claims re-verified."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering
from dra_driver.k8s.client import KubeRest
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.nvidiadriver.state import DriverState
from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.nvml.types import NvmlError, NvmlReturn, TimeSlice
from dra_driver.plugin.app import KubeletPlugin, PluginSettings
from dra_driver.plugin.checkpoint import ClaimState
from dra_driver.plugin.driverreload import (
    EVENT_CLAIM_LOST,
    EVENT_RELOADED,
    UNMONITORED_KEY,
    reload_reason,
)
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.objects import create_allocated_claim
from tests.polling import wait_for

D = DRIVER_NAME
NODE = "node-a30"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def _err(code: NvmlReturn, call: str = "compute_mode") -> NvmlError:
    return NvmlError(code, call=call)


def test_reload_reason_tells_the_driver_from_one_gpu() -> None:
    lost, ok = _err(NvmlReturn.GPU_IS_LOST), None
    # One lost GPU among healthy ones: a health problem, not a reload.
    assert reload_reason(None, {"a": lost, "b": ok}, published_version="570", version_now="570") is None
    # A one-GPU node whose GPU is lost while the driver answers: still a health problem.
    assert reload_reason(None, {"a": lost}, published_version="570", version_now="570") is None
    # Every GPU of several lost at once: the driver.
    assert "every GPU" in (reload_reason(None, {"a": lost, "b": lost}, published_version="570", version_now="570") or "")
    # A call that is not about a GPU says the driver is gone.
    system = _err(NvmlReturn.DRIVER_NOT_LOADED, "system_info")
    assert "DRIVER_NOT_LOADED" in (reload_reason(system, {}, published_version="570", version_now=None) or "")
    stale = _err(NvmlReturn.UNINITIALIZED, "system_info")
    assert "UNINITIALIZED" in (reload_reason(stale, {"a": lost}, published_version="570", version_now=None) or "")
    # Another version than the one published (a handle that kept working across the reload).
    assert "570 to 580" in (reload_reason(None, {"a": ok}, published_version="570", version_now="580") or "")
    # Errors that are not the driver's (a GPU not found) are not a reload.
    other = _err(NvmlReturn.NOT_FOUND)
    assert reload_reason(None, {"a": other, "b": other}, published_version="570", version_now="570") is None


@pytest.fixture
def node() -> Iterator[tuple[KubeletPlugin, KubeRest, FakeNvml]]:
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra-rl-"))
    (work / "boot_id").write_text("b\n")
    backend = open_backend("fake:a30x4")  # small: four GPUs, MIG on the first
    assert isinstance(backend, FakeNvml)
    backend.init()
    backend.set_mig_mode(backend.gpus()[0].uuid, True)
    backend.reset_gpu(backend.gpus()[0].uuid)
    with ApiServer() as srv:
        rest = srv.rest()
        rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        config = PluginSettings(
            node_name=NODE, driver_name=D, plugin_dir=work / "p", registry_dir=work / "r", cdi_root=work / "cdi",
            driver_root=Path("/"), host_driver_root=Path("/"), mig_offering=MigOffering.DYNAMIC, fake_cdi=True,
            healthz_port=None, boot_id_path=work / "boot_id", kube_version=(1, 35),
        )  # fmt: skip
        plugin = KubeletPlugin(config, nvml=backend, rest=rest)
        plugin.start()
        try:
            yield plugin, rest, backend
        finally:
            plugin.stop()
            backend.shutdown()
    shutil.rmtree(work, ignore_errors=True)


def _devices(rest: KubeRest) -> dict[str, Any]:
    return {d["name"]: d for s in rest.request("GET", SLICES)["items"] for d in s["spec"].get("devices", [])}


def _claim(rest: KubeRest, name: str, devices: list[str], config: list[Any] | None = None) -> ClaimRef:
    claim = create_allocated_claim(rest, namespace="default", name=name, driver=D, pool=NODE, devices=devices,
                                   config=config or [])  # fmt: skip
    return ClaimRef("default", name, claim["metadata"]["uid"])


def _time_slicing(interval: str) -> list[Any]:
    parameters = {"apiVersion": "gpu.dra.dev/v1beta1", "kind": "GpuConfig",
                  "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}}  # fmt: skip
    return [{"source": "FromClaim", "requests": [], "opaque": {"driver": D, "parameters": parameters}}]


def _events(rest: KubeRest, reason: str) -> list[Any]:
    items = rest.request("GET", "/api/v1/namespaces/default/events")["items"]
    return [e for e in items if e.get("reason") == reason]


def test_a_reload_with_a_new_version(node: tuple[KubeletPlugin, KubeRest, FakeNvml]) -> None:
    plugin, rest, backend = node
    wait_for(lambda: "gpu-0-mig-2g12gb-5-0" in _devices(rest), 10, "the first publish")
    assert _devices(rest)["gpu-1"]["attributes"]["driverVersion"]["version"] != "580.200.1"
    whole = _claim(rest, "whole", ["gpu-1"], _time_slicing("Long"))
    plain = _claim(rest, "plain", ["gpu-2"])
    mig = _claim(rest, "mig", ["gpu-0-mig-2g12gb-5-0"])
    first = plugin.claim_engine.prepare([whole, plain, mig])
    assert all(not r.error for r in first.values()), first
    gpu1 = plugin.devices()["gpu-1"].gpu.uuid
    assert backend.time_slice(gpu1) is TimeSlice.LONG

    backend.unload_driver()  # `rmmod nvidia` (the GPU Operator's driver container upgrading the driver)
    wait_for(lambda: plugin.driver_status.status().state is DriverState.RELOADING, 10, "the reload to be noticed")
    # The gauge is a listener of the board, told after the state is set: polled, not read at once.
    wait_for(lambda: plugin.metrics.driver_state.labels("reloading")._value.get() == 1, 10, "the reloading gauge")

    def unmonitored(name: str) -> bool:
        return any(t["key"] == f"{D}/{UNMONITORED_KEY}" and t["effect"] == "None"
                   for t in _devices(rest)[name].get("taints", []))  # fmt: skip

    wait_for(lambda: all(unmonitored(n) for n in _devices(rest)), 10, "every device tainted unmonitored")
    refused = plugin.claim_engine.prepare([_claim(rest, "new", ["gpu-3"])])
    error = next(iter(refused.values())).error
    assert f"the NVIDIA driver is reloading on node {NODE}" in error and "the kubelet retries" in error
    # An unprepare that needs the driver (a MIG instance, a time-slice) waits, its record kept; one that only
    # removes a CDI spec goes through.
    waited = plugin.claim_engine.unprepare([mig, whole])
    assert all("the NVIDIA driver is reloading" in e for e in waited.values()), waited
    assert plugin.claim_engine.unprepare([plain]) == {plain.uid: ""}
    records = plugin.engine.prepared_claims().claims
    assert {mig.uid, whole.uid} <= set(records) and plain.uid not in records

    backend.load_driver("580.200.1")
    wait_for(lambda: plugin.driver_status.ready, 20, "the plugin to serve the new driver")
    assert plugin.driver_status.status().driver_version == "580.200.1"
    wait_for(lambda: _devices(rest)["gpu-1"]["attributes"]["driverVersion"]["version"] == "580.200.1", 10,
             "the slices republished with the new driverVersion")  # fmt: skip
    wait_for(lambda: not any(unmonitored(n) for n in _devices(rest)), 10, "the unmonitored taint removed")
    wait_for(lambda: plugin.metrics.driver_reloads.labels("reinitialised")._value.get() == 1, 10,
             "the reinitialised count")
    # The whole GPU's time-slice was lost with the driver and is applied again; its prepare answers as before.
    assert backend.time_slice(gpu1) is TimeSlice.LONG
    again = plugin.claim_engine.prepare([whole])
    assert again[whole.uid].devices == first[whole.uid].devices and not again[whole.uid].error
    # The MIG claim lost its instance: a clear error, an Event, the record kept and marked.
    lost = plugin.claim_engine.prepare([mig])[mig.uid]
    assert "did not survive the NVIDIA driver reload" in lost.error and "gpu-0-mig-2g12gb-5-0" in lost.error
    record = plugin.engine.prepared_claims().claims[mig.uid]
    assert record.state is ClaimState.PREPARE_COMPLETED and record.lost is not None
    assert backend.gpu_instances(backend.gpus()[0].uuid) == []  # never re-created
    wait_for(lambda: _events(rest, EVENT_CLAIM_LOST), 10, "the PreparedClaimLost Event")
    lost_event = _events(rest, EVENT_CLAIM_LOST)[0]
    assert lost_event["type"] == "Warning" and lost_event["involvedObject"]["uid"] == mig.uid
    assert "gpu-0-mig-2g12gb-5-0" in lost_event["message"]
    wait_for(lambda: _events(rest, EVENT_RELOADED), 10, "the NvidiaDriverReloaded Event")
    reloaded = _events(rest, EVENT_RELOADED)[0]
    assert reloaded["type"] == "Normal" and "580.200.1" in reloaded["message"]
    # Released as usual once the pod goes.
    assert plugin.claim_engine.unprepare([mig, whole]) == {mig.uid: "", whole.uid: ""}
    assert plugin.engine.prepared_claims().claims == {}
    assert backend.time_slice(gpu1) is TimeSlice.DEFAULT


def test_an_upgrade_while_the_plugin_is_down_marks_the_mig_claims_lost(
    node: tuple[KubeletPlugin, KubeRest, FakeNvml],
) -> None:
    plugin, rest, backend = node
    wait_for(lambda: "gpu-0-mig-2g12gb-5-0" in _devices(rest), 10, "the first publish")
    mig = _claim(rest, "mig", ["gpu-0-mig-2g12gb-5-0"])
    whole = _claim(rest, "whole", ["gpu-1"])
    assert all(not r.error for r in plugin.claim_engine.prepare([mig, whole]).values())
    plugin.stop()
    backend.unload_driver()
    backend.load_driver("580.300.2")
    backend.shutdown()
    backend.init()  # the restarted container's NVML session
    again = KubeletPlugin(plugin.settings, nvml=backend, rest=rest)
    again.start()
    try:
        # Start-up recovery did not re-create the instance under the old name: the claim is lost, with its record.
        assert backend.gpu_instances(backend.gpus()[0].uuid) == []
        record = again.engine.prepared_claims().claims[mig.uid]
        assert record.lost is not None and record.state is ClaimState.PREPARE_COMPLETED
        assert "did not survive the NVIDIA driver reload" in again.claim_engine.prepare([mig])[mig.uid].error
        assert not again.claim_engine.prepare([whole])[whole.uid].error
        assert again.engine.prepared_claims().claims[whole.uid].lost is None
    finally:
        again.stop()
