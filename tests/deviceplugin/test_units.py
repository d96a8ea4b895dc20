"""The device plugin's pure parts and its record: the proto's wire names, the ownership record (hostile files
included), the preferred allocation, the PodResources reading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dra_driver._gen import deviceplugin_v1beta1_pb2 as dp
from dra_driver._gen import podresources_v1_pb2 as pr
from dra_driver.cdi.model import ContainerEdits
from dra_driver.cdi.writer import node_claim_spec_name
from dra_driver.deviceplugin.cdispecs import AllocationSpecs, allocation_key
from dra_driver.deviceplugin.gpus import OfferedGpu, preferred
from dra_driver.deviceplugin.ownership import (
    Allocated,
    Ownership,
    OwnershipFile,
    Reservation,
    decode_ownership,
    encode_ownership,
)
from dra_driver.deviceplugin.podresources import devices_in_use


def _fields(message: object) -> dict[str, int]:
    return {f.name: f.number for f in getattr(message, "DESCRIPTOR").fields}  # noqa: B009


def test_the_device_plugin_proto_has_upstreams_names_and_numbers() -> None:
    services = dp.DESCRIPTOR.services_by_name
    assert {m.name for m in services["Registration"].methods} == {"Register"}
    assert services["Registration"].full_name == "v1beta1.Registration"
    assert {f"/{services['DevicePlugin'].full_name}/{m.name}" for m in services["DevicePlugin"].methods} == {
        "/v1beta1.DevicePlugin/GetDevicePluginOptions", "/v1beta1.DevicePlugin/ListAndWatch",
        "/v1beta1.DevicePlugin/GetPreferredAllocation", "/v1beta1.DevicePlugin/Allocate",
        "/v1beta1.DevicePlugin/PreStartContainer",
    }  # fmt: skip
    assert services["DevicePlugin"].methods_by_name["ListAndWatch"].server_streaming
    assert _fields(dp.RegisterRequest) == {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4}
    assert _fields(dp.DevicePluginOptions) == {"pre_start_required": 1, "get_preferred_allocation_available": 2}
    assert _fields(dp.Device) == {"ID": 1, "health": 2, "topology": 3}
    assert _fields(dp.ContainerPreferredAllocationRequest) == {
        "available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3}
    assert _fields(dp.ContainerAllocateResponse) == {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4,
                                                     "cdi_devices": 5}  # fmt: skip
    assert _fields(dp.CDIDevice) == {"name": 1}
    assert _fields(pr.ContainerDevices) == {"resource_name": 1, "device_ids": 2, "topology": 3}
    assert _fields(pr.ContainerResources)["dynamic_resources"] == 5
    assert pr.DESCRIPTOR.services_by_name["PodResourcesLister"].full_name == "v1.PodResourcesLister"


def test_the_ownership_record_round_trips_and_survives_a_reopen(tmp_path: Path) -> None:
    record = OwnershipFile(tmp_path / "own.json", clock=lambda: 5.0)
    with record.change() as changing:
        changing.new = changing.old.with_allocated({"GPU-a"}, 1.0, "ab12").with_reserved("uid-1", {"GPU-b"}, 2.0)
    again = OwnershipFile(tmp_path / "own.json").load()
    assert again == Ownership({"GPU-a": Allocated(1.0, "ab12")}, {"GPU-b": Reservation("uid-1", 2.0)})
    assert (tmp_path / "own.json").stat().st_mode & 0o777 == 0o600
    assert decode_ownership(encode_ownership(again)) == again
    assert again.without_claims({"uid-1"}).dra == {} and again.without_allocated({"GPU-a"}).allocated == {}


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ("[]", "(the document)"),
        ('{"version": 2}', "version"),
        ('{"version": 1, "allocated": []}', "allocated"),
        ('{"version": 1, "allocated": {"GPU-a": {"at": -1}}}', "allocated.GPU-a.at"),
        ('{"version": 1, "allocated": {"GPU-a": {"at": true}}}', "allocated.GPU-a.at"),
        ('{"version": 1, "allocated": {"GPU-a": {"at": 1, "spec": "../x"}}}', "allocated.GPU-a.spec"),
        ('{"version": 1, "dra": {"GPU-a": {"at": 1}}}', "dra.GPU-a.claimUid"),
    ],
)
def test_a_bad_record_names_the_field(document: str, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{__import__('re').escape(field)}"):
        decode_ownership(document.encode())


def test_an_unreadable_record_is_set_aside_and_an_empty_one_starts(tmp_path: Path) -> None:
    path = tmp_path / "own.json"
    path.write_bytes(b'{"version": 1, "allocated": {"GPU-a": ')  # torn by hand: the plugin never writes this
    record = OwnershipFile(path, clock=lambda: 7.0)
    assert record.load() == Ownership()
    aside = tmp_path / "own.json.corrupt-7"
    assert aside.read_bytes().startswith(b'{"version": 1')  # kept for the admin, not lost
    assert not path.exists()


def test_the_sweep_takes_only_the_records_own_temp_files(tmp_path: Path) -> None:
    """A SIGKILL between atomic_write's temp file and its rename leaves `.<file>.<random>.tmp` behind."""
    path = tmp_path / "own.json"
    left = tmp_path / ".own.json.a1b2c3d4.tmp"
    others = [tmp_path / ".checkpoint.json.a1b2c3d4.tmp", tmp_path / ".own.json.a1b2c3d4.tmp.keep",
              tmp_path / ".own.json.A1B2C3D4E.tmp"]  # fmt: skip
    for file in (left, *others):
        file.write_text("{")
    (tmp_path / ".own.json.deadbeef.tmp").mkdir()  # not a regular file: not ours to delete
    assert OwnershipFile(path).sweep_temp_files() == [left]
    assert not left.exists() and all(f.exists() for f in others)
    assert (tmp_path / ".own.json.deadbeef.tmp").is_dir()


def test_the_sweep_also_takes_the_device_plugins_spec_temp_files_and_no_one_elses(tmp_path: Path) -> None:
    """The device plugin's CDI specs are written under the record's lock only, so the same sweep may take theirs."""
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    specs = AllocationSpecs(cdi, "gpu.dra.dev", "n1", lambda gpus: ((), ContainerEdits()))
    ours = cdi / f".{specs.file_name(allocation_key(['GPU-a']))}.0a1b2c3d.tmp"
    others = [cdi / f".{node_claim_spec_name('k8s.gpu.dra.dev', 'claim', 'n1', 'uid-1')}.0a1b2c3d.tmp",  # a claim's
              cdi / f".{specs.file_name(allocation_key(['GPU-a'])).replace('_n1_', '_n2_')}.0a1b2c3d.tmp",
              cdi / f".{specs.file_name(allocation_key(['GPU-a']))}.0a1b2c3d.tmp.x"]  # fmt: skip
    for file in (ours, *others):
        file.write_text("{")
    record = OwnershipFile(tmp_path / "own.json")
    assert record.sweep_temp_files([(cdi, specs.is_temp_file)]) == [ours]
    assert all(f.exists() for f in others)


def _gpu(minor: int, numa: int, peers: set[int]) -> OfferedGpu:
    return OfferedGpu(f"GPU-{minor}", f"gpu-{minor}", minor, numa, f"pci{minor // 2}",
                      frozenset(f"GPU-{p}" for p in peers))  # fmt: skip


def test_preferred_keeps_gpus_on_nvlink_then_on_one_numa_node() -> None:
    # Two NVLink islands {0,1,2,3} and {4,5,6,7}; NUMA 0 for 0-3 and 6, NUMA 1 for 4, 5, 7.
    islands = [{0, 1, 2, 3}, {4, 5, 6, 7}]
    numa = {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 0, 7: 1}
    offered = {f"GPU-{m}": _gpu(m, numa[m], islands[m // 4] - {m}) for m in range(8)}
    ids = list(offered)
    assert preferred(offered, ids, [], 2) == ["GPU-0", "GPU-1"]
    assert preferred(offered, ["GPU-3", "GPU-4", "GPU-6", "GPU-5"], [], 2) == ["GPU-4", "GPU-5"]  # NVLink + NUMA
    assert preferred(offered, ["GPU-3", "GPU-6", "GPU-7"], ["GPU-6"], 2) == ["GPU-6", "GPU-7"]  # NVLink beats NUMA
    assert preferred(offered, ["GPU-0", "GPU-4"], [], 2) == ["GPU-0", "GPU-4"]
    assert preferred(offered, ["GPU-0", "unknown"], [], 2) == ["GPU-0"]  # unknown IDs passed over
    assert preferred(offered, ids, [], 0) == []


def test_pod_resources_reads_only_the_resource_asked_for() -> None:
    response = pr.ListPodResourcesResponse(pod_resources=[
        pr.PodResources(name="a", namespace="n", containers=[
            pr.ContainerResources(name="c", devices=[
                pr.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-1", "GPU-2"]),
                pr.ContainerDevices(resource_name="example.com/nic", device_ids=["nic-0"]),
            ]),
        ]),
        pr.PodResources(name="b", namespace="n", containers=[pr.ContainerResources(name="c", devices=[
            pr.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-3"])])]),
    ])  # fmt: skip
    assert devices_in_use(response, "nvidia.com/gpu") == {
        "GPU-1": frozenset({"n/a"}), "GPU-2": frozenset({"n/a"}), "GPU-3": frozenset({"n/b"})}
    assert json.dumps(sorted(devices_in_use(response, "other"))) == "[]"
