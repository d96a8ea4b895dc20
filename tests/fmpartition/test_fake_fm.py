"""The fake Fabric Manager (nvml/fake/fmpartitions.py): the predefined partition table, FM's refusals, the state
file keeping active partitions across processes, and the real-node stub that refuses, saying why."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.nvml.fabricmanager import (
    FabricManagerError,
    FmReturn,
    UnavailableFabricManager,
)
from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.fake.backend import FakeNvml

NODE = "name: hgx\ngpus:\n  - model: H100-SXM5-80GB\n    count: 8\n"


def _backend(tmp_path: Path, knobs: str = ",fabric_partitions=true") -> FakeNvml:
    node = tmp_path / "node.yaml"
    node.write_text(NODE)
    backend = open_backend(f"fake:{node},state={tmp_path / 'state.json'}{knobs}")
    assert isinstance(backend, FakeNvml)
    backend.init()
    return backend


def _to_vfio(nvml: FakeNvml, *indices: int) -> None:
    pci = nvml.pci_sysfs()
    pci.load_module("vfio_pci")
    for i in indices:
        address = nvml.node.gpus[i].bus_id
        pci.set_driver_override(address, "vfio-pci")
        pci.unbind(address, "nvidia")
        pci.bind(address, "vfio-pci")


def test_the_table_is_the_board_then_halves_down_to_single_gpus(tmp_path: Path) -> None:
    fm = _backend(tmp_path).fabric_manager()
    table = fm.supported_partitions()
    assert [len(p.gpus) for p in table] == [8, 4, 4, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1]
    assert [p.id for p in table] == list(range(15))
    assert [g.physical_id for g in table[2].gpus] == [5, 6, 7, 8]
    assert not any(p.active for p in table)


def test_activation_needs_vfio_and_refuses_overlap_and_twice(tmp_path: Path) -> None:
    nvml = _backend(tmp_path)
    fm = nvml.fabric_manager()
    with pytest.raises(FabricManagerError) as held:
        fm.activate(3)  # GPUs 0 and 1, still on nvidia
    assert held.value.code is FmReturn.IN_USE
    _to_vfio(nvml, 0, 1, 2, 3)
    fm.activate(3)
    assert [p.id for p in fm.supported_partitions() if p.active] == [3]
    for pid, code in ((3, FmReturn.IN_USE), (1, FmReturn.IN_USE), (7, FmReturn.IN_USE), (99, FmReturn.BADPARAM)):
        with pytest.raises(FabricManagerError) as refused:
            fm.activate(pid)
        assert refused.value.code is code, pid
    fm.activate(4)  # GPUs 2 and 3: disjoint
    # The state file keeps them: another process (a restarted plugin) sees both.
    again = _backend(tmp_path).fabric_manager()
    assert [p.id for p in again.supported_partitions() if p.active] == [3, 4]
    again.deactivate(3)
    with pytest.raises(FabricManagerError) as inactive:
        again.deactivate(3)
    assert inactive.value.code is FmReturn.UNINITIALIZED
    with pytest.raises(FabricManagerError) as unknown:
        again.deactivate(42)
    assert unknown.value.code is FmReturn.BADPARAM


def test_set_activated_refuses_overlap(tmp_path: Path) -> None:
    fm = _backend(tmp_path).fabric_manager()
    with pytest.raises(FabricManagerError) as overlap:
        fm.set_activated((1, 3))
    assert overlap.value.code is FmReturn.BADPARAM
    fm.set_activated((1, 2))
    assert [p.id for p in fm.supported_partitions() if p.active] == [1, 2]


def test_without_the_knob_and_on_a_real_node_fm_answers_not_supported(tmp_path: Path) -> None:
    with pytest.raises(FabricManagerError) as off:
        _backend(tmp_path, knobs="").fabric_manager().supported_partitions()
    assert off.value.code is FmReturn.NOT_SUPPORTED
    with pytest.raises(FabricManagerError) as real:
        UnavailableFabricManager().activate(0)
    assert real.value.code is FmReturn.NOT_SUPPORTED and "Fabric Manager SDK not available" in str(real.value)
