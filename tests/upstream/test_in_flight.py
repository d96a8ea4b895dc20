"""The DRA features in flight against upstream's kube-apiserver, kube-controller-manager and kube-scheduler 1.37
(docs/reference/dra-in-flight.md), each control plane started twice: with the gates on (DRAListTypeAttributes,
DRADeviceCompatibilityGroups, DRAResourcePoolStatus and resource.k8s.io/v1alpha3) and with them off.

Gates on: the plugin's probes find each field, the API server stores what the driver sends (list-type numaNode from
the real plugin process, compatibility groups from the driver's slice builder) and kube-controller-manager answers
`status --pool-status`. Gates off: the probes find none, the plugin publishes the int form, and `status --pool-status`
sends nothing. Skips with the upstream banner where the binaries are not built (tests/upstream/test_controlplane.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.commands.poolstatus import PoolStatusQuery, PoolStatusUnavailable, pool_status
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.passthrough import PassthroughScope, PassthroughSettings
from dra_driver.inventory.sharing import EXCLUSIVE
from dra_driver.k8s.client import JsonObject, KubeRest, connect
from dra_driver.k8s.serverfeatures import SliceFeature, probe
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_sandbox.polling import wait_for
from dra_sandbox.upstream.controlplane import ControlPlane, ControlPlaneConfig
from dra_sandbox.upstream.install import install_chart, plugin_kubeconfig
from tests.upstream.conftest import DRIVER, MINOR, release_binaries, start_plugin
from tests.upstream.test_controlplane import TIMEOUT

pytestmark = pytest.mark.xdist_group("upstream")
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
NUMA = "resource.kubernetes.io/numaNode"
GATES = ("DRAListTypeAttributes", "DRADeviceCompatibilityGroups", "DRAResourcePoolStatus", "DRAPartitionableDevicesType")


@pytest.fixture(scope="module", params=["gates-on", "gates-off"])
def plane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    if MINOR != "1.37":
        pytest.skip(f"the in-flight checks are written for 1.37 (DRA_UPSTREAM_K8S={MINOR})")
    binaries = release_binaries()
    on = request.param == "gates-on"
    config = ControlPlaneConfig(tmp_path_factory.mktemp(f"inflight-{request.param}"), binaries,
                                extra_feature_gates=dict.fromkeys(GATES, on),
                                extra_runtime_config=("resource.k8s.io/v1alpha3=true",) if on else ())
    with ControlPlane(config) as started:
        install_chart(started)
        yield started


def _gates_on(plane: ControlPlane) -> bool:
    return bool(plane.config.extra_feature_gates.get("DRAListTypeAttributes"))


def _as_plugin(plane: ControlPlane, node: str, work: Path) -> KubeRest:
    admin = plane.admin()
    if admin.get(f"/api/v1/nodes/{node}") is None:
        admin.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    return connect(str(plugin_kubeconfig(plane, node, work / "plugin.kubeconfig")))


def _slices(admin: KubeRest, node: str) -> list[JsonObject]:
    items = admin.request("GET", SLICES, query={"fieldSelector": f"spec.nodeName={node}"})["items"]
    return [s for s in items if s["spec"]["driver"] == DRIVER]


# KEP-5517's probe also needs a node that declares the feature: tests/upstream/test_node_allocatable.py.
@pytest.mark.parametrize("feature", [f for f in SliceFeature if f is not SliceFeature.NODE_ALLOCATABLE])
def test_the_probe_reads_the_api_servers_gate_and_stores_nothing(
        plane: ControlPlane, feature: SliceFeature, tmp_path: Path) -> None:
    node = "inflight-probe"
    rest = _as_plugin(plane, node, tmp_path)  # the chart's RBAC and admission policy apply to the probe
    result = probe(rest, feature, driver=DRIVER, node=node, kube_version=(1, 37))
    assert result.served is _gates_on(plane), result.reason
    assert _slices(plane.admin(), node) == []


def test_compatibility_groups_are_stored_as_the_builder_sends_them_only_with_the_gate(
        plane: ControlPlane, tmp_path: Path) -> None:
    """The driver's own slices for a passthrough node with `--compatibility-groups on`, written as the plugin: the
    gate on keeps every group; the gate off drops them (why the plugin probes first instead of sending them)."""
    node = "inflight-groups"
    backend = open_backend("fake:l4x2")
    backend.init()
    inventory = discover(backend)
    passthrough = PassthroughSettings(PassthroughScope.ALL, compatibility_groups=True)
    devices = catalog(inventory, MigOffering.NONE, EXCLUSIVE, passthrough)
    settings = SliceSettings(driver_name=DRIVER, node_name=node, kube_version=(1, 37), passthrough=passthrough)
    wanted = build_slices(inventory.system, devices, settings, 1)
    sent = [c for s in wanted for d in s["spec"].get("devices", []) for c in d.get("consumesCounters", [])]
    assert sent and all("compatibilityGroups" in c for c in sent)
    rest = _as_plugin(plane, node, tmp_path)
    stored = [rest.request("POST", SLICES, body={**s, "metadata": {"generateName": f"{node}-"}}) for s in wanted]
    kept = [c.get("compatibilityGroups") for s in stored for d in s["spec"].get("devices", [])
            for c in d.get("consumesCounters", [])]
    if _gates_on(plane):
        assert kept == [c["compatibilityGroups"] for c in sent]
    else:
        assert kept == [None] * len(sent)


def test_the_plugin_publishes_lists_by_default_only_where_kept_and_pool_status_counts_them(
        plane: ControlPlane, tmp_path: Path) -> None:
    node = "inflight-node"
    admin = plane.admin()
    admin.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    plugin = start_plugin(plane, node, tmp_path, "dgx-h100")  # 8 GPUs on two sockets
    try:
        def published() -> list[JsonObject]:
            assert plugin.poll() is None, (tmp_path / "plugin.log").read_text()[-3000:]
            found = _slices(admin, node)
            complete = bool(found) and len(found) == found[0]["spec"]["pool"]["resourceSliceCount"]
            return found if complete else []  # the whole pool: the publisher writes its slices one by one

        slices = wait_for(published, TIMEOUT, f"the plugin's ResourceSlices for {node}", interval=0.2)
        devices = {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}
        numa = devices["gpu-0"]["attributes"][NUMA]
        assert numa == ({"ints": [0]} if _gates_on(plane) else {"int": 0}), numa
        assert devices["gpu-7"]["attributes"][NUMA] == ({"ints": [1]} if _gates_on(plane) else {"int": 1})
        # Dynamic MIG on eight GPUs is about 200 partition types, over kube-controller-manager's 32: none published.
        assert any(d.get("consumesCounters") for d in devices.values())
        assert not any("partitionType" in d["attributes"] for d in devices.values())
        assert not any("partitionTypeAttribute" in s["spec"] for s in slices)

        query = PoolStatusQuery(DRIVER, node, 60.0)
        if not _gates_on(plane):
            with pytest.raises(PoolStatusUnavailable, match="does not serve ResourcePoolStatusRequest"):
                pool_status(admin, query)
            return
        report, warnings = pool_status(admin, query)
        assert warnings == [] and report.failed == ""
        [pool] = report.pools
        assert (pool.pool, pool.node) == (node, node)
        assert pool.devices == len(devices) and pool.allocated == 0 and pool.slices == len(slices)
        assert admin.request("GET", "/apis/resource.k8s.io/v1alpha3/resourcepoolstatusrequests")["items"] == []
    finally:
        plugin.terminate()
        plugin.wait(30)


def test_partition_types_are_published_only_where_kept_and_pool_status_summarises_them(
        plane: ControlPlane, tmp_path: Path) -> None:
    """KEP-5677 partition types (`--partition-types auto`, the default) on two GPUs also offered for passthrough (each
    GPU's counter set drawn by its whole GPU and its VFIO device). Gates on: the device slices name `partitionType`,
    each device carries it as stored, and kube-controller-manager's partitionSummary has one entry per type, each
    allocatable, with no validation error. Gates off: neither the field nor the attribute is sent."""
    node = "inflight-parts"
    admin = plane.admin()
    admin.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    plugin = start_plugin(plane, node, tmp_path, "l4x2", {"DRA_DRIVER_PASSTHROUGH": "all", "DRA_DRIVER_MIG_MODE": "none"})
    try:
        def published() -> list[JsonObject]:
            assert plugin.poll() is None, (tmp_path / "plugin.log").read_text()[-3000:]
            found = _slices(admin, node)
            complete = bool(found) and len(found) == found[0]["spec"]["pool"]["resourceSliceCount"]
            return found if complete else []

        slices = wait_for(published, TIMEOUT, f"the plugin's ResourceSlices for {node}", interval=0.2)
        types = {d["name"]: (d["attributes"].get("partitionType") or {}).get("string")
                 for s in slices for d in s["spec"].get("devices", [])}
        named = {s["spec"].get("partitionTypeAttribute") for s in slices if s["spec"].get("devices")}
        if not _gates_on(plane):
            assert set(types.values()) == {None} and named == {None}
            return
        assert types == {"gpu-0": "gpu-0/whole", "gpu-0-vfio": "gpu-0/vfio", "gpu-1": "gpu-1/whole",
                         "gpu-1-vfio": "gpu-1/vfio"}
        assert named == {f"{DRIVER}/partitionType"}
        report, warnings = pool_status(admin, PoolStatusQuery(DRIVER, node, 60.0))
        assert warnings == [] and report.failed == ""
        [pool] = report.pools
        assert pool.problem == ""
        assert {(t.attribute, t.type, t.total, t.allocatable) for t in pool.partitions} == {
            (f"{DRIVER}/partitionType", t, 1, 1) for t in types.values()}
    finally:
        plugin.terminate()
        plugin.wait(30)
