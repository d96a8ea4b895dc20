"""Inventory discovery over the fake NVML presets: identity, topology, MIG geometry, static MIG devices."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.inventory import discover
from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.types import NvmlError, NvmlReturn, Placement
from tests.narrow import present

PRESETS = {
    # preset: (gpu count, product name, MIG memory slices, profile count, MIG enabled, NVLink everywhere)
    "dgx-h100": (8, "NVIDIA H100 80GB HBM3", 8, 7, False, True),
    "dgx-a100": (8, "NVIDIA A100-SXM4-40GB", 8, 7, True, True),
    "hgx-h200": (8, "NVIDIA H200", 8, 7, False, True),
    # Ampere with MIG off: NVML does not list profiles until MIG is enabled (needs a reset).
    "a30x4": (4, "NVIDIA A30", 0, 0, False, True),
    "l4x2": (2, "NVIDIA L4", 0, 0, False, False),
}


def _open(spec: str) -> Any:
    backend = open_backend(spec)
    backend.init()
    return backend


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_discover_identity_and_mig_geometry(preset: str) -> None:
    count, name, slices, n_profiles, mig_on, linked = PRESETS[preset]
    backend = _open(f"fake:{preset}")
    inv = discover(backend)
    assert len(inv.gpus) == count
    assert [g.info.index for g in inv.gpus] == list(range(count))
    assert len({g.uuid for g in inv.gpus}) == count
    for gpu in inv.gpus:
        assert gpu.info.name == name
        assert gpu.memory_slices == slices
        assert len(gpu.mig_profiles) == n_profiles
        assert gpu.mig_capable is (preset != "l4x2")
        assert gpu.mig_enabled is mig_on
        assert gpu.mig_devices == ()
        assert gpu.multiprocessors and gpu.multiprocessors > 0
        assert gpu.topology.pcie_root and gpu.topology.pcie_root.startswith("pci")
        assert bool(gpu.topology.nvlink_domain) is linked
    assert inv.system.driver_version.count(".") == 2
    backend.shutdown()


def test_nvswitch_node_is_one_nvlink_domain_split_over_two_numa_nodes() -> None:
    inv = discover(_open("fake:dgx-h100"))
    assert len({g.topology.nvlink_domain for g in inv.gpus}) == 1
    for gpu in inv.gpus:
        assert len(gpu.topology.nvlink_peers) == 7
    numa = [g.topology.numa_node for g in inv.gpus]
    assert set(numa) == {0, 1}
    assert numa.count(0) == 4


def test_direct_nvlink_pairs_form_separate_domains() -> None:
    inv = discover(_open("fake:a30x4"))
    domains = [g.topology.nvlink_domain for g in inv.gpus]
    assert domains[0] == domains[1]
    assert domains[2] == domains[3]
    assert domains[0] != domains[2]


def test_profiles_keep_index_and_id_apart_with_placements() -> None:
    gpu = discover(_open("fake:dgx-h100")).gpus[0]
    by_name = {p.name: p for p in gpu.mig_profiles}
    three_g = by_name["3g.40gb"]
    assert (three_g.index, three_g.id) == (2, 9)
    assert three_g.placements == (Placement(0, 4), Placement(4, 4))
    assert by_name["1g.10gb"].placements == tuple(Placement(i, 1) for i in range(7))
    assert present(gpu.profile_by_id(0)).name == "7g.80gb"


def test_static_mig_devices_are_found_with_their_own_uuid() -> None:
    backend = _open("fake:dgx-a100")
    parent = backend.gpus()[3].uuid
    gi = backend.create_gpu_instance(parent, 9, Placement(4, 4))  # 3g.20gb at 4:4
    backend.create_compute_instance(parent, gi.id, 2)
    gpu = discover(backend).gpus[3]
    assert len(gpu.mig_devices) == 1
    dev = gpu.mig_devices[0]
    assert dev.uuid.startswith("MIG-") and dev.uuid != parent
    assert dev.parent_uuid == parent
    assert dev.profile.name == "3g.20gb"
    assert dev.placement == Placement(4, 4)
    assert dev.gpu_instance_id == gi.id
    assert dev.uuid in {d.uuid for d in backend.mig_devices(parent)}


def test_unanswerable_optional_facts_fall_back_but_real_errors_surface() -> None:
    backend = _open("fake:l4x2")
    backend.inject_fault("numa_node", NvmlReturn.NOT_SUPPORTED, count=2)
    inv = discover(backend)
    assert [g.topology.numa_node for g in inv.gpus] == [None, None]
    backend.inject_fault("gpus", NvmlReturn.GPU_IS_LOST)
    with pytest.raises(NvmlError) as err:
        discover(backend)
    assert err.value.code is NvmlReturn.GPU_IS_LOST
