"""NVML health events -> device problems -> slice taints and the kubelet's health stream."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.passthrough import passthrough_settings
from dra_driver.k8s.client import KubeRest
from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.types import EVENT_XID_CRITICAL, NO_INSTANCE, GpuEvent, Placement
from dra_driver.plugin.app import KubeletPlugin, PluginSettings
from dra_driver.plugin.health.monitor import (
    HealthMonitor,
    affected_devices,
    problem_for_event,
)
from dra_driver.plugin.health.problems import DEFAULT_IGNORED_XIDS, DeviceProblem, merge, parse_xid_list
from dra_sandbox.apiserver import ApiServer
from tests import kubeschema
from tests.polling import wait_for

D = DRIVER_NAME


def test_classification() -> None:
    bad = problem_for_event(GpuEvent("GPU-1", EVENT_XID_CRITICAL, 79), D, DEFAULT_IGNORED_XIDS)
    assert bad == DeviceProblem(f"{D}/xid", "79", "NoSchedule", "Xid 79")
    app = problem_for_event(GpuEvent("GPU-1", EVENT_XID_CRITICAL, 13), D, DEFAULT_IGNORED_XIDS)
    assert app is not None and app.effect == "None" and not app.unhealthy
    assert problem_for_event(GpuEvent("GPU-1", 0x2, 0), D, ()) == DeviceProblem(f"{D}/ecc", "double-bit", "NoSchedule", "double-bit ECC error")
    assert problem_for_event(GpuEvent("GPU-1", 0x4, 0), D, ()) is None  # P-state changes are not problems
    assert parse_xid_list(" 48, 63 ,") == {48, 63}
    with pytest.raises(ValueError, match="--ignore-xids: 'x' is not an Xid"):
        parse_xid_list("48,x")


def test_an_informational_problem_never_hides_an_unhealthy_one() -> None:
    unhealthy = DeviceProblem("k/xid", "79", "NoSchedule", "Xid 79")
    info = DeviceProblem("k/xid", "13", "None", "Xid 13")
    assert merge(merge({}, ["a"], unhealthy), ["a", "b"], info) == {"a": unhealthy, "b": info}


def _h100() -> tuple[Any, Mapping[str, Any]]:
    backend = open_backend("fake:dgx-h100")
    backend.init()
    return backend, catalog(discover(backend), MigOffering.DYNAMIC)


def test_whole_gpu_event_marks_every_device_of_the_gpu_and_mig_event_just_its_device() -> None:
    _, devices = _h100()
    gpu2 = devices["gpu-2"].gpu.uuid
    names = affected_devices(GpuEvent(gpu2, EVENT_XID_CRITICAL, 79, NO_INSTANCE, NO_INSTANCE), devices, {})
    assert "gpu-2" in names and "gpu-2-mig-1g10gb-19-6" in names and all(n.startswith("gpu-2") for n in names)
    one = affected_devices(GpuEvent(gpu2, EVENT_XID_CRITICAL, 94, 7, 0), devices, {7: "gpu-2-mig-1g10gb-19-6"})
    assert one == ["gpu-2-mig-1g10gb-19-6"]


def test_a_gpu_event_marks_its_vfio_device_too() -> None:
    """Passthrough beside health checking (docs/passthrough.md): a problem on a GPU taints its VFIO device with the
    container devices, so no VM claim lands on an unhealthy GPU either."""
    backend = open_backend("fake:dgx-h100")
    backend.init()
    devices = catalog(discover(backend), MigOffering.DYNAMIC, passthrough=passthrough_settings("2"))
    gpu2 = devices["gpu-2"].gpu.uuid
    names = affected_devices(GpuEvent(gpu2, EVENT_XID_CRITICAL, 79, NO_INSTANCE, NO_INSTANCE), devices, {})
    assert "gpu-2-vfio" in names and "gpu-2" in names and "gpu-3-vfio" not in devices
    mig_only = affected_devices(GpuEvent(gpu2, EVENT_XID_CRITICAL, 94, 7, 0), devices, {7: "gpu-2-mig-1g10gb-19-6"})
    assert mig_only == ["gpu-2-mig-1g10gb-19-6"]  # a MIG instance's own problem stays its own


def test_monitor_loop_maps_live_mig_instances_and_lost_gpus() -> None:
    backend, devices = _h100()
    changes: list[dict[str, DeviceProblem]] = []
    seen = threading.Condition()

    def on_change(problems: Mapping[str, DeviceProblem]) -> None:
        with seen:
            changes.append(dict(problems))
            seen.notify_all()

    monitor = HealthMonitor(backend, driver_name=D, devices=lambda: devices, on_change=on_change, wait_ms=50)
    monitor.start()
    try:
        gpu3 = devices["gpu-3"].gpu.uuid
        backend.set_mig_mode(gpu3, True)
        gi = backend.create_gpu_instance(gpu3, 9, Placement(4, 4))
        backend.create_compute_instance(gpu3, gi.id, 2)
        assert backend.inject_xid(gpu3, 94, gi=gi.id, ci=0)
        with seen:
            assert seen.wait_for(lambda: len(changes) >= 1, timeout=10)
        assert list(changes[-1]) == ["gpu-3-mig-3g40gb-9-4"]
        gpu5 = devices["gpu-5"].gpu.uuid
        backend.inject_gpu_lost(gpu5)
        with seen:
            assert seen.wait_for(lambda: len(changes) >= 2, timeout=10)
        lost = {n for n, p in changes[-1].items() if p.key == f"{D}/gpu-lost"}
        assert lost == {n for n, d in devices.items() if d.gpu.uuid == gpu5}
    finally:
        monitor.stop()


@pytest.fixture
def plugin_and_api() -> Iterator[tuple[KubeletPlugin, KubeRest, Any]]:
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra-hm-"))
    (work / "boot_id").write_text("b\n")
    backend = open_backend("fake:l4x2")
    backend.init()
    with ApiServer() as srv:
        rest = srv.rest()
        rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-l4"}})
        config = PluginSettings(
            node_name="node-l4", driver_name=D, plugin_dir=work / "p", registry_dir=work / "r", cdi_root=work / "cdi",
            driver_root=Path("/"), host_driver_root=Path("/"), mig_offering=MigOffering.DYNAMIC, fake_cdi=True,
            healthz_port=None, boot_id_path=work / "boot_id", kube_version=(1, 35),
        )
        plugin = KubeletPlugin(config, nvml=backend, rest=srv.rest())
        plugin.start()
        try:
            yield plugin, rest, backend
        finally:
            plugin.stop()
    shutil.rmtree(work, ignore_errors=True)


def test_an_xid_taints_the_slice_and_reaches_the_health_stream(plugin_and_api: Any) -> None:
    plugin, rest, backend = plugin_and_api
    gpu1 = plugin.devices()["gpu-1"].gpu.uuid

    def taints() -> dict[str, Any]:
        slices = rest.request("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
        return {d["name"]: d.get("taints") for s in slices for d in s["spec"].get("devices", [])}

    wait_for(lambda: taints() == {"gpu-0": None, "gpu-1": None}, 10, "the first publish")
    assert backend.inject_xid(gpu1, 13)  # an application error: informational only
    wait_for(lambda: taints()["gpu-1"] is not None, 10, "the informational taint")
    assert taints()["gpu-1"][0]["effect"] == "None"
    assert all(d.healthy for d in plugin.health.snapshot().devices)
    assert backend.inject_xid(gpu1, 79)
    wait_for(lambda: (taints()["gpu-1"] or [{}])[0].get("value") == "79", 10, "the Xid 79 taint")
    tainted = taints()["gpu-1"][0]
    assert (tainted["key"], tainted["effect"]) == (f"{D}/xid", "NoSchedule")
    assert taints()["gpu-0"] is None
    health = {d.device: d for d in plugin.health.snapshot().devices}
    assert health["gpu-1"].healthy is False and health["gpu-1"].message == "Xid 79" and health["gpu-0"].healthy
    for obj in rest.request("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]:
        kubeschema.validate(obj, "1.35.0")
