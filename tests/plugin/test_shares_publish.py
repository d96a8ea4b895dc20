"""The kubelet plugin with `--sharing-mode shares` (PluginSettings.sharing): what it publishes to the sandbox API
server (which validates every slice), and the start-up refusal of a `--shared-gpus` entry naming no GPU."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering
from dra_driver.inventory.sharing import SharingSettings, SharingSettingsError, sharing_settings
from dra_driver.k8s.client import KubeRest
from dra_driver.k8s.quantity import Quantity, QuantityFormat
from dra_driver.nvml.factory import open_backend
from dra_driver.plugin.app import KubeletPlugin, PluginSettings
from dra_sandbox.apiserver import ApiServer
from tests.plugin.conftest import plugin_settings
from tests.polling import wait_for

NODE = "node-l4"


def settings(work: Path, sharing: SharingSettings) -> PluginSettings:
    return replace(plugin_settings(work, NODE, MigOffering.NONE), kube_version=(1, 35), sharing=sharing)


def published(rest: KubeRest) -> dict[str, dict[str, Any]]:
    slices = rest.request("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def test_the_plugin_publishes_shared_devices(work: Path) -> None:
    backend = open_backend("fake:l4x2")
    backend.init()
    with ApiServer() as srv:
        rest = srv.rest()
        rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        plugin = KubeletPlugin(settings(work, sharing_settings("shares", shared_gpus="1")), nvml=backend, rest=rest)
        plugin.start()
        try:
            wait_for(lambda: set(published(rest)) == {"gpu-0", "gpu-1", "gpu-1-shared"}, 10, "the first publish")
            devices = published(rest)
            assert devices["gpu-1-shared"]["allowMultipleAllocations"] is True
            assert devices["gpu-1-shared"]["attributes"]["type"] == {"string": "gpu-share"}
            assert set(devices["gpu-1-shared"]["capacity"]) == {"memory", "compute"}
            assert "consumesCounters" not in devices["gpu-0"]  # not shared: unchanged
            assert devices["gpu-1"]["consumesCounters"] == devices["gpu-1-shared"]["consumesCounters"]
            gauge = plugin.metrics.published_devices
            assert gauge.labels("gpu-share")._value.get() == 1
        finally:
            plugin.stop()


def test_an_unknown_shared_gpu_refuses_to_start_before_touching_the_node(work: Path) -> None:
    backend = open_backend("fake:l4x2")
    backend.init()
    with ApiServer() as srv:
        plugin = KubeletPlugin(
            settings(work, sharing_settings("shares", shared_gpus="0,GPU-nope")),
            nvml=backend,
            rest=srv.rest(),
        )
        try:
            with pytest.raises(SharingSettingsError, match=r"--shared-gpus names GPU-nope, which is no GPU of this node"):
                plugin.start()
        finally:
            plugin.stop()  # a start that failed still stops what it began (the driver-state annotator)
    assert not (work / "p").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--share-memory-step", "1G"], "--share-memory-step '1G' must be a positive whole number of MiB"),
        (["--share-memory-default", "3Gi", "--share-memory-step", "2Gi"], "must be a multiple of --share-memory-step"),
    ],
)
def test_bad_sharing_flags_stop_the_plugin_with_the_flag_named(flags: list[str], message: str) -> None:
    """A real process: the flags are checked before NVML, the API or the node are touched (exit 2)."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dra_driver.cli",
            "kubelet-plugin",
            "--node-name",
            NODE,
            "--sharing-mode",
            "shares",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(("label", "shared"), [("shares", {"gpu-0-shared", "gpu-1-shared"}), ("bogus", set())])
def test_a_node_label_overrides_the_sharing_mode(work: Path, label: str, shared: set[str]) -> None:
    backend = open_backend("fake:l4x2")
    backend.init()
    with ApiServer() as srv:
        rest = srv.rest()
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {f"{DRIVER_NAME}/sharing-mode": label}},
        }
        rest.request("POST", "/api/v1/nodes", body=node)
        plugin = KubeletPlugin(settings(work, sharing_settings("exclusive")), nvml=backend, rest=rest)
        plugin.start()
        try:
            wait_for(lambda: {"gpu-0", "gpu-1"} <= set(published(rest)), 10, "the first publish")
            assert {n for n in published(rest) if n.endswith("-shared")} == shared
        finally:
            plugin.stop()


# --- NVIDIA's consumable-shares modes on the main class (`--consumable-shares`) -------------------------

MIB = 2**20


@pytest.mark.parametrize(
    ("mode", "policies"),
    [
        ("memory", {"memory": ("all", "1Mi", "all")}),
        ("unlimited", {"memory": ("0", "0", "all")}),
        ("4", {"memory": ("0", "0", "all"), "shares": ("1", "1", "4")}),
    ],
)
def test_consumable_shares_make_the_whole_gpu_shareable_in_nvidias_shapes(
    work: Path, mode: str, policies: dict[str, tuple[str, str, str]]
) -> None:
    """What NVIDIA's `consumable_shares.go` publishes (default, validRange min, max), on `gpu-<minor>` itself, type
    `gpu` (the main class), through the sandbox API server, which validates every slice as upstream does."""
    backend = open_backend("fake:l4x2")
    backend.init()
    with ApiServer() as srv:
        rest = srv.rest()
        rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        plugin = KubeletPlugin(settings(work, sharing_settings("exclusive", consumable=mode)), nvml=backend, rest=rest)
        plugin.start()
        try:
            wait_for(lambda: set(published(rest)) == {"gpu-0", "gpu-1"}, 10, "the first publish")
            for name, device in published(rest).items():
                assert device["allowMultipleAllocations"] is True
                assert device["attributes"]["type"] == {"string": "gpu"}  # the main class selects it
                assert set(device["capacity"]) == set(policies)  # no multiprocessors: it would be consumed whole
                memory = next(g for g in backend.gpus() if f"gpu-{g.minor}" == name).memory_total_bytes
                assert memory is not None
                whole = str(Quantity.from_int(memory - memory % MIB, QuantityFormat.BINARY_SI))
                assert device["capacity"]["memory"]["value"] == whole
                for capacity, (default, low, high) in policies.items():
                    policy = device["capacity"][capacity]["requestPolicy"]
                    assert policy["default"] == (whole if default == "all" else default)
                    assert policy["validRange"]["min"] == low
                    assert policy["validRange"]["max"] == (whole if high == "all" else high)
                    assert policy["validRange"]["step"] == ("1Mi" if capacity == "memory" else "1")
        finally:
            plugin.stop()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--consumable-shares", "lots"], "--consumable-shares 'lots': choose disabled, memory, unlimited or a whole"),
        (["--consumable-shares", "0"], "a whole number of shares per GPU from 1 to 1000"),
        (["--consumable-shares", "4", "--sharing-mode", "shares"], "exclude each other"),
    ],
)
def test_bad_consumable_shares_stop_the_plugin_with_the_flag_named(flags: list[str], message: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dra_driver.cli", "kubelet-plugin", "--node-name", NODE, *flags],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(("labels", "allow", "shares"), [
    ({"consumable-shares": "3"}, True, "3"),
    ({"consumable-shares": "bogus"}, False, None),  # ignored with a warning: the flag (disabled) applies
    ({"consumable-shares": "memory", "sharing-mode": "shares"}, True, None),  # consumable wins over shares
])  # fmt: skip
def test_a_node_label_sets_consumable_shares(
    work: Path, labels: dict[str, str], allow: bool, shares: str | None
) -> None:
    backend = open_backend("fake:l4x2")
    backend.init()
    with ApiServer() as srv:
        rest = srv.rest()
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": NODE, "labels": {f"{DRIVER_NAME}/{k}": v for k, v in labels.items()}}}  # fmt: skip
        rest.request("POST", "/api/v1/nodes", body=node)
        plugin = KubeletPlugin(settings(work, sharing_settings("exclusive")), nvml=backend, rest=rest)
        plugin.start()
        try:
            wait_for(lambda: {"gpu-0", "gpu-1"} <= set(published(rest)), 10, "the first publish")
            devices = published(rest)
            assert set(devices) == {"gpu-0", "gpu-1"}  # never a gpu-N-shared beside consumable shares
            assert bool(devices["gpu-0"].get("allowMultipleAllocations")) is allow
            assert (devices["gpu-0"]["capacity"].get("shares") or {}).get("value") == shares
        finally:
            plugin.stop()
