"""Every preset against docs/reference/nvml-mig.md: identity (§1.3), MIG tables (§2.2), topology (§4)."""

from __future__ import annotations

import importlib.util
import re
from itertools import combinations
from typing import Any

import pytest

from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.fake.backend import FakeNvml, FakeSettings
from dra_driver.nvml.fake.nodefile import preset_names
from dra_driver.nvml.types import (
    Architecture,
    FabricHealth,
    FabricState,
    NvLinkRemoteType,
    NvmlError,
    NvmlReturn,
    Placement,
    TopologyLevel,
)
from tests.narrow import present

MIB = 1024 * 1024
SEVEN = (0, 1, 2, 3, 4, 5, 6)
EVEN = (0, 2, 4, 6)

# docs/reference/nvml-mig.md §2.2, transcribed independently of dra_driver/nvml/fake/mig_profiles.tsv.
# (id, name, slices, instances, SM, CE, DEC, ENC, JPEG, OFA, MiB, placement starts, placement size)
A100_40GB = [
    (19, "1g.5gb", 1, 7, 14, 1, 0, 0, 0, 0, 4864, SEVEN, 1),
    (20, "1g.5gb+me", 1, 1, 14, 1, 1, 0, 1, 1, 4864, SEVEN, 1),
    (15, "1g.10gb", 1, 4, 14, 1, 1, 0, 0, 0, 9856, EVEN, 2),
    (14, "2g.10gb", 2, 3, 28, 2, 1, 0, 0, 0, 9856, (0, 2, 4), 2),
    (9, "3g.20gb", 3, 2, 42, 3, 2, 0, 0, 0, 19968, (0, 4), 4),
    (5, "4g.20gb", 4, 1, 56, 4, 2, 0, 0, 0, 19968, (0,), 4),
    (0, "7g.40gb", 7, 1, 98, 7, 5, 0, 1, 1, 40192, (0,), 8),
]
H100_80GB = [
    (19, "1g.10gb", 1, 7, 16, 1, 1, 0, 1, 0, 9984, SEVEN, 1),
    (20, "1g.10gb+me", 1, 1, 16, 1, 1, 0, 1, 1, 9984, SEVEN, 1),
    (15, "1g.20gb", 1, 4, 26, 1, 1, 0, 1, 0, 20096, EVEN, 2),
    (14, "2g.20gb", 2, 3, 32, 2, 2, 0, 2, 0, 20096, (0, 2, 4), 2),
    (9, "3g.40gb", 3, 2, 60, 3, 3, 0, 3, 0, 40448, (0, 4), 4),
    (5, "4g.40gb", 4, 1, 64, 4, 4, 0, 4, 0, 40448, (0,), 4),
    (0, "7g.80gb", 7, 1, 132, 8, 7, 0, 7, 1, 81152, (0,), 8),
]
H200 = [
    (19, "1g.18gb", 1, 7, 16, 1, 1, 0, 1, 0, 16384, SEVEN, 1),
    (20, "1g.18gb+me", 1, 1, 16, 1, 1, 0, 1, 1, 16384, SEVEN, 1),
    (15, "1g.35gb", 1, 4, 26, 1, 1, 0, 1, 0, 33024, EVEN, 2),
    (14, "2g.35gb", 2, 3, 32, 2, 2, 0, 2, 0, 33024, (0, 2, 4), 2),
    (9, "3g.71gb", 3, 2, 60, 3, 3, 0, 3, 0, 71168, (0, 4), 4),
    (5, "4g.71gb", 4, 1, 64, 4, 4, 0, 4, 0, 71168, (0,), 4),
    (0, "7g.141gb", 7, 1, 132, 8, 7, 0, 7, 1, 143104, (0,), 8),
]
A30 = [
    (14, "1g.6gb", 1, 4, 14, 1, 1, 0, 0, 0, 5952, (0, 1, 2, 3), 1),
    (21, "1g.6gb+me", 1, 1, 14, 1, 1, 0, 1, 1, 5952, (0, 1, 2, 3), 1),
    (5, "2g.12gb", 2, 2, 28, 2, 2, 0, 0, 0, 11968, (0, 2), 2),
    (6, "2g.12gb+me", 2, 1, 28, 2, 2, 0, 1, 1, 11968, (0, 2), 2),
    (0, "4g.24gb", 4, 1, 56, 4, 4, 0, 1, 1, 24000, (0,), 4),
]
# profile ID -> NVML_GPU_INSTANCE_PROFILE_* index (§2.1)
INDEX_8_SLICE = {19: 0, 20: 7, 15: 9, 14: 1, 9: 2, 5: 3, 0: 4}
INDEX_A30 = {14: 0, 21: 7, 5: 1, 6: 8, 0: 3}

# preset -> (count, name, arch, cc, memory MiB, PCI device id, MIG table, index map, NVLinks per GPU)
PRESETS = {
    "dgx-h100": (
        8,
        "NVIDIA H100 80GB HBM3",
        Architecture.HOPPER,
        (9, 0),
        81559,
        0x233010DE,
        H100_80GB,
        INDEX_8_SLICE,
        18,
    ),
    "dgx-a100": (
        8,
        "NVIDIA A100-SXM4-40GB",
        Architecture.AMPERE,
        (8, 0),
        40960,
        0x20B010DE,
        A100_40GB,
        INDEX_8_SLICE,
        12,
    ),
    "hgx-h200": (8, "NVIDIA H200", Architecture.HOPPER, (9, 0), 143771, 0x233510DE, H200, INDEX_8_SLICE, 18),
    "a30x4": (4, "NVIDIA A30", Architecture.AMPERE, (8, 0), 24576, 0x20B710DE, A30, INDEX_A30, 4),
    "l4x2": (2, "NVIDIA L4", Architecture.ADA, (8, 9), 24 * 1024, 0x27B810DE, None, None, 0),
    # No MIG table: docs/reference/nvml-mig.md has none for GB200 (docs/fake-nvml.md "Gaps").
    "gb200-nvl72": (4, "NVIDIA GB200", Architecture.BLACKWELL, (10, 0), 189471, 0x294110DE, None, None, 18),
}
UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$")
BUS_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:00\.0$")


def _open(preset: str, **opts: Any) -> FakeNvml:
    fake = FakeNvml.preset(preset, settings=FakeSettings(**opts))
    fake.init()
    return fake


def test_the_six_presets_exist() -> None:
    assert set(preset_names()) == set(PRESETS)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_identity(preset: str) -> None:
    count, name, arch, cc, mib, pci, *_ = PRESETS[preset]
    fake = _open(preset)
    assert isinstance(fake, NvmlBackend)
    system = fake.system_info()
    assert (system.driver_version, system.cuda_driver_version, system.cuda_version) == ("580.105.08", 13000, "13.0")
    gpus = fake.gpus()
    assert [g.index for g in gpus] == list(range(count))
    for g in gpus:
        assert (g.name, g.architecture, g.cuda_compute_capability) == (name, arch, cc)
        assert g.memory_total_bytes == mib * MIB
        assert g.pci_device_id == pci
        assert UUID_RE.match(g.uuid), g.uuid
        assert BUS_RE.match(g.pci_bus_id), g.pci_bus_id
        assert g.serial and g.serial.isdigit() and len(g.serial) == 13
        assert g.brand == "Nvidia"
        assert g.multiprocessors and g.multiprocessors > 0
    for attr in ("uuid", "pci_bus_id", "minor", "serial"):
        assert len({getattr(g, attr) for g in gpus}) == count, attr
    # Deterministic: a second instance reports the same identities.
    assert _open(preset).gpus() == gpus


@pytest.mark.parametrize("preset", [p for p in sorted(PRESETS) if PRESETS[p][6] is not None])
def test_mig_profile_tables_match_the_spec(preset: str) -> None:
    table, index_of = PRESETS[preset][6], PRESETS[preset][7]
    assert table is not None and index_of is not None
    fake = _open(preset, profiles_when_mig_disabled="supported")
    for gpu in fake.gpus():
        profiles = fake.gpu_instance_profiles(gpu.uuid)
        assert [p.index for p in profiles] == sorted(p.index for p in profiles), "ordered by index"
        got = {
            p.id: (
                p.id,
                p.name,
                p.slice_count,
                p.instance_count,
                p.multiprocessors,
                p.copy_engines,
                p.decoders,
                p.encoders,
                p.jpeg_engines,
                p.ofa_engines,
                p.memory_mib,
                tuple(pl.start for pl in p.placements),
                p.placements[0].size,
            )
            for p in profiles
        }
        assert got == {row[0]: row for row in table}
        assert {p.id: p.index for p in profiles} == index_of
        for p in profiles:
            assert all(pl.size == p.placements[0].size for pl in p.placements)
            assert p.memory_bytes == p.memory_mib * MIB


@pytest.mark.skipif(
    importlib.util.find_spec("dra_driver.nvml.profile_name") is None,
    reason="dra_driver/nvml/profile_name.py (mig_profile_name) is not written yet",
)
@pytest.mark.parametrize("preset", ["dgx-h100", "dgx-a100", "hgx-h200", "a30x4"])
def test_table_names_agree_with_the_go_nvlib_formula(preset: str) -> None:
    from dra_driver.nvml.profile_name import mig_profile_name

    fake = _open(preset, profiles_when_mig_disabled="supported")
    gpu = fake.gpus()[0]
    assert gpu.memory_total_bytes is not None
    for p in fake.gpu_instance_profiles(gpu.uuid):
        assert mig_profile_name(p.index, p.memory_mib, gpu.memory_total_bytes) == p.name


def test_dgx_h100_topology() -> None:
    fake = _open("dgx-h100")
    gpus = fake.gpus()
    numa = [fake.numa_node(g.uuid) for g in gpus]
    assert numa == [0, 0, 0, 0, 1, 1, 1, 1]
    cpus0 = fake.cpu_affinity(gpus[0].uuid)
    assert cpus0 == tuple([*range(0, 56), *range(112, 168)])
    assert set(cpus0).isdisjoint(fake.cpu_affinity(gpus[7].uuid))
    roots = [fake.pcie_root(g.uuid) for g in gpus]
    assert all(r and r.startswith("pci0000:") for r in roots)
    assert len(set(roots)) == 4 and roots[0] == roots[1] != roots[2]  # two GPUs per root complex
    level = fake.topology_common_ancestor
    assert level(gpus[0].uuid, gpus[1].uuid) is TopologyLevel.SINGLE
    assert level(gpus[0].uuid, gpus[2].uuid) is TopologyLevel.NODE
    assert level(gpus[0].uuid, gpus[4].uuid) is TopologyLevel.SYSTEM
    assert level(gpus[3].uuid, gpus[3].uuid) is TopologyLevel.INTERNAL
    switch_buses: set[str] = set()
    for g in gpus:
        links = fake.nvlinks(g.uuid)
        assert [n.link for n in links] == list(range(18))
        assert {n.remote_type for n in links} == {NvLinkRemoteType.SWITCH}
        switch_buses |= {n.remote_pci_bus_id for n in links}
        fabric = fake.fabric_info(g.uuid)
        assert fabric is not None
        assert (fabric.state, fabric.status, fabric.clique_id) == (FabricState.COMPLETED, NvmlReturn.SUCCESS, 0)
        assert fabric.cluster_uuid == "00000000-0000-0000-0000-000000000000"
        assert fabric.clique is None  # zero cluster UUID: not a multi-node clique
    assert len(switch_buses) == 4
    assert switch_buses.isdisjoint(g.pci_bus_id for g in gpus)
    for a, b in combinations(gpus, 2):
        assert fake.nvlink_p2p_ok(a.uuid, b.uuid)
    assert not any(present(fake.mig_mode(g.uuid)).current for g in gpus)


def test_dgx_a100_has_mig_enabled_without_instances_and_no_fabric() -> None:
    fake = _open("dgx-a100")
    for g in fake.gpus():
        mode = fake.mig_mode(g.uuid)
        assert mode is not None and mode.current and mode.pending
        assert fake.gpu_instances(g.uuid) == []
        assert fake.mig_devices(g.uuid) == []
        assert fake.fabric_info(g.uuid) is None
        links = fake.nvlinks(g.uuid)
        assert len(links) == 12 and {n.remote_type for n in links} == {NvLinkRemoteType.SWITCH}
    assert {len({n.remote_pci_bus_id for n in fake.nvlinks(g.uuid)}) for g in fake.gpus()} == {6}


def test_hgx_h200_is_an_nvswitch_node_with_a_completed_fabric() -> None:
    fake = _open("hgx-h200")
    gpus = fake.gpus()
    assert all(len(fake.nvlinks(g.uuid)) == 18 for g in gpus)
    assert all(present(fake.fabric_info(g.uuid)).state is FabricState.COMPLETED for g in gpus)
    assert [fake.numa_node(g.uuid) for g in gpus].count(1) == 4


def test_a30x4_direct_pairs_and_pcie_elsewhere() -> None:
    fake = _open("a30x4")
    g = fake.gpus()
    for a, b in ((0, 1), (2, 3)):
        links = fake.nvlinks(g[a].uuid)
        assert len(links) == 4
        assert {(n.remote_type, n.remote_pci_bus_id) for n in links} == {(NvLinkRemoteType.GPU, g[b].pci_bus_id)}
        assert fake.nvlink_p2p_ok(g[a].uuid, g[b].uuid) and fake.nvlink_p2p_ok(g[b].uuid, g[a].uuid)
    for a, b in ((0, 2), (0, 3), (1, 2), (1, 3)):
        assert not fake.nvlink_p2p_ok(g[a].uuid, g[b].uuid)
    assert fake.topology_common_ancestor(g[0].uuid, g[1].uuid) is TopologyLevel.HOSTBRIDGE
    assert fake.topology_common_ancestor(g[1].uuid, g[2].uuid) is TopologyLevel.SYSTEM
    assert [fake.numa_node(x.uuid) for x in g] == [0, 0, 1, 1]
    assert all(fake.fabric_info(x.uuid) is None for x in g)


def test_l4x2_has_no_mig_no_nvlink_and_one_numa_node() -> None:
    fake = _open("l4x2")
    a, b = fake.gpus()
    assert fake.mig_mode(a.uuid) is None
    assert fake.nvlinks(a.uuid) == []
    assert not fake.nvlink_p2p_ok(a.uuid, b.uuid)
    assert fake.numa_node(a.uuid) is None  # single-node host: unknown locality
    assert fake.cpu_affinity(a.uuid) == tuple(range(32))
    assert fake.topology_common_ancestor(a.uuid, b.uuid) is TopologyLevel.NODE
    with pytest.raises(NvmlError) as err:
        fake.gpu_instance_profiles(a.uuid)
    assert err.value.code is NvmlReturn.NOT_SUPPORTED


def test_gb200_nvl72_is_a_tray_of_four_gpus_in_one_multi_node_clique() -> None:
    fake = _open("gb200-nvl72")
    gpus = fake.gpus()
    assert [g.pci_bus_id for g in gpus] == ["0008:01:00.0", "0009:01:00.0", "0018:01:00.0", "0019:01:00.0"]
    assert [fake.numa_node(g.uuid) for g in gpus] == [0, 0, 1, 1]
    assert len({fake.pcie_root(g.uuid) for g in gpus}) == 4  # each GPU in a PCI domain of its own
    assert all(fake.mig_mode(g.uuid) is None for g in gpus)  # no verified GB200 MIG table: not MIG-capable here
    switches: set[str] = set()
    for g in gpus:
        links = fake.nvlinks(g.uuid)
        assert len(links) == 18 and {n.remote_type for n in links} == {NvLinkRemoteType.SWITCH}
        switches |= {n.remote_pci_bus_id for n in links}
        fabric = present(fake.fabric_info(g.uuid))
        assert (fabric.state, fabric.status, fabric.health_summary) == (
            FabricState.COMPLETED, NvmlReturn.SUCCESS, FabricHealth.HEALTHY,
        )
        assert fabric.clique == "5c3e7a1f-2b4d-4e8a-9f61-0d2c8b7a4e13.0"
    assert len(switches) == 18
    for a, b in combinations(gpus, 2):
        assert fake.nvlink_p2p_ok(a.uuid, b.uuid)


def test_the_clique_knob_moves_every_fabric_gpu_and_keeps_the_cluster() -> None:
    fake = FakeNvml.preset("gb200-nvl72", seed="tray-20", clique=1)
    fake.init()
    fabrics = [present(fake.fabric_info(g.uuid)) for g in fake.gpus()]
    assert {f.clique for f in fabrics} == {"5c3e7a1f-2b4d-4e8a-9f61-0d2c8b7a4e13.1"}
    with pytest.raises(ValueError, match="no GPU in a multi-node NVLink fabric"):
        FakeNvml.preset("hgx-h200", clique=1)


def test_preset_profiles_allow_exactly_their_placements() -> None:
    """Every listed placement is creatable on an empty GPU, and nothing else of that size is."""
    fake = _open("dgx-h100")
    uuid = fake.gpus()[0].uuid
    assert fake.set_mig_mode(uuid, True) is NvmlReturn.SUCCESS
    for p in fake.gpu_instance_profiles(uuid):
        size = p.placements[0].size
        for start in range(0, 8):
            placement = Placement(start, size)
            if placement in p.placements:
                gi = fake.create_gpu_instance(uuid, p.id, placement)
                fake.destroy_gpu_instance(uuid, gi.id)
            else:
                with pytest.raises(NvmlError) as err:
                    fake.create_gpu_instance(uuid, p.id, placement)
                assert err.value.code is NvmlReturn.INVALID_ARGUMENT
