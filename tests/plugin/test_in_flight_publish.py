"""The kubelet plugin publishes a gated field only where the API server keeps it (docs/reference/dra-in-flight.md):
list-type numaNode by default where DRAListTypeAttributes is on, the int form where it is off (a server without the
gate gets nothing it refuses), and `--compatibility-groups on` groups only where the server keeps them."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra_driver.inventory.catalog import MigOffering
from dra_driver.inventory.passthrough import NO_PASSTHROUGH, PassthroughSettings, passthrough_settings
from dra_driver.k8s.client import KubeRest
from dra_driver.k8s.serverfeatures import FeatureMode
from dra_driver.nvml.factory import open_backend
from dra_driver.plugin.app import KubeletPlugin, PluginSettings
from dra_sandbox.apiserver import ApiServer
from tests.plugin.conftest import plugin_settings
from tests.polling import wait_for

NODE = "node-h100"
NUMA = "resource.kubernetes.io/numaNode"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def _settings(work: Path, mode: FeatureMode, passthrough: PassthroughSettings,
              partition_types: FeatureMode) -> PluginSettings:
    # kube_version None: the plugin asks the server (/version), as in a cluster
    return replace(plugin_settings(work, NODE, MigOffering.NONE), list_attributes=mode, passthrough=passthrough,
                   partition_types=partition_types)


def _devices(rest: KubeRest) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in rest.request("GET", SLICES)["items"] for d in s["spec"].get("devices", [])}


def _publish(work: Path, version: str, gates: dict[str, bool], mode: FeatureMode,
             passthrough: PassthroughSettings = NO_PASSTHROUGH, fake: str = "fake:dgx-h100",
             partition_types: FeatureMode = FeatureMode.OFF) -> tuple[dict[str, dict[str, Any]], int]:
    """The first publish of a plugin on a fake node, and how many dry-run probes it sent (partition types off unless
    asked: each feature's probes are counted on their own)."""
    backend = open_backend(fake)
    backend.init()
    with ApiServer(kube_version=version, feature_gates=gates) as srv, srv.rest() as rest:
        rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        plugin = KubeletPlugin(_settings(work, mode, passthrough, partition_types), nvml=backend, rest=rest)
        plugin.start()
        try:
            wait_for(lambda: "gpu-0" in _devices(rest), 20, "the first publish")
            probes = [r for r in srv.request_log.records() if r.verb == "create" and r.resource == "resourceslices"
                      and r.dry_run]
            return _devices(rest), len(probes)
        finally:
            plugin.stop()


def test_lists_by_default_where_the_server_keeps_them(work: Path) -> None:
    devices, probes = _publish(work, "1.37.0", {"DRAListTypeAttributes": True}, FeatureMode.AUTO)
    assert probes == 1
    assert devices["gpu-0"]["attributes"][NUMA] == {"ints": [0]}
    assert devices["gpu-7"]["attributes"][NUMA] == {"ints": [1]}


@pytest.mark.parametrize("mode", [FeatureMode.AUTO, FeatureMode.ON])
def test_a_server_without_the_gate_gets_the_int_and_the_slices_are_stored(work: Path, mode: FeatureMode) -> None:
    """The sandbox refuses a list value with the gate off, as 1.37 does (the value dropped, the attribute empty):
    without the probe the slices would never be stored."""
    devices, probes = _publish(work, "1.37.0", {}, mode)
    assert probes == 1
    assert devices["gpu-0"]["attributes"][NUMA] == {"int": 0}
    assert all("ints" not in d["attributes"].get(NUMA, {}) for d in devices.values())


def test_off_and_an_older_release_send_no_probe(work: Path) -> None:
    devices, probes = _publish(work, "1.37.0", {"DRAListTypeAttributes": True}, FeatureMode.OFF)
    assert probes == 0 and devices["gpu-0"]["attributes"][NUMA] == {"int": 0}
    shutil.rmtree(work / "p", ignore_errors=True)
    devices, probes = _publish(work, "1.35.0", {}, FeatureMode.AUTO)
    assert probes == 0 and devices["gpu-0"]["attributes"][NUMA] == {"int": 0}


def test_compatibility_groups_only_where_the_server_keeps_them(work: Path) -> None:
    """The sandbox has no KEP-5963 field (as a server with the gate off): asked for, probed, not sent."""
    grouped = passthrough_settings("all", compatibility_groups=True)
    devices, probes = _publish(work, "1.37.0", {}, FeatureMode.OFF, grouped, fake="fake:l4x2")
    assert probes == 1
    consumptions = [c for d in devices.values() for c in d.get("consumesCounters", [])]
    assert consumptions and not any("compatibilityGroups" in c for c in consumptions)


@pytest.mark.parametrize("gate", [True, False])
def test_partition_types_by_default_only_where_the_server_keeps_them(work: Path, gate: bool) -> None:
    """`--partition-types auto` (the default): one probe on 1.37; with DRAPartitionableDevicesType the counter-
    consuming devices carry `partitionType` and are stored so; without it nothing is sent and the slices are stored."""
    devices, probes = _publish(work, "1.37.0", {"DRAPartitionableDevicesType": gate}, FeatureMode.OFF,
                               passthrough_settings("all"), fake="fake:l4x2", partition_types=FeatureMode.AUTO)
    assert probes == 1
    types = {n: d["attributes"].get("partitionType") for n, d in devices.items()}
    if gate:
        assert types == {"gpu-0": {"string": "gpu-0/whole"}, "gpu-0-vfio": {"string": "gpu-0/vfio"},
                         "gpu-1": {"string": "gpu-1/whole"}, "gpu-1-vfio": {"string": "gpu-1/vfio"}}
    else:
        assert set(types.values()) == {None}
