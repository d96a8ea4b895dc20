"""The YAML node format: the documented example parses, and each invalid field is named in the error."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.nvml.fake.nodefile import SpecError, load_node_file, parse_node_text, preset_names
from dra_driver.nvml.types import (
    Architecture,
    FabricState,
    GpuInstanceProfile,
    NvLinkRemoteType,
    NvmlError,
    NvmlReturn,
    Placement,
    TopologyLevel,
)
from tests.narrow import present

DOC = Path(__file__).resolve().parents[2] / "docs" / "fake-nvml.md"


def _doc_example() -> str:
    match = re.search(r"<!-- fake-node-example.*?-->\n```yaml\n(.*?)```", DOC.read_text(), re.S)
    assert match, "docs/fake-nvml.md lost its marked example"
    return match.group(1)


def test_the_documented_example_parses_into_a_static_mig_node() -> None:
    node = parse_node_text(_doc_example(), source="docs example")
    assert node.name == "lab-node-7"
    assert [g.numa_node for g in node.gpus] == [0, 0, 1, 1]
    assert [g.model.name for g in node.gpus][2:] == ["NVIDIA H100 80GB HBM3 (engineering sample)"] * 2
    assert node.gpus[2].model.memory_mib == 81920 and node.gpus[2].model.mig == node.gpus[0].model.mig
    assert [g.bus_id for g in node.gpus[2:]] == ["0000:9d:00.0", "0000:c3:00.0"]
    fake = FakeNvml(node)
    fake.init()
    for gpu in fake.gpus()[:2]:
        assert [(g.id, g.profile_id, g.placement) for g in fake.gpu_instances(gpu.uuid)] == [
            (1, 9, Placement(4, 4)),  # 3g.40gb at 4
            (3, 14, Placement(0, 2)),  # 2g.20gb, first free placement
            (7, 19, Placement(2, 1)),  # 1g.10gb by profile id, bare
        ]
        assert [(d.gpu_instance_id, d.compute_instance_id) for d in fake.mig_devices(gpu.uuid)] == [
            (1, 0),
            (3, 0),
            (3, 1),
        ]
        assert fake.compute_instances(gpu.uuid, 7) == []
    assert present(fake.mig_mode(fake.gpus()[3].uuid)).current is False
    assert all(len(fake.nvlinks(g.uuid)) == 18 for g in fake.gpus())
    assert present(fake.fabric_info(fake.gpus()[0].uuid)).state is FabricState.COMPLETED


@pytest.mark.parametrize("preset", preset_names())
def test_presets_are_valid_node_files(preset: str, tmp_path: Path) -> None:
    # The presets are JSON (no YAML parser at a plugin's start); JSON is YAML, so each is a node file as users write.
    source = Path(__file__).resolve().parents[2] / "dra_driver" / "nvml" / "fake" / "presets" / f"{preset}.json"
    copy = tmp_path / "node.yaml"
    copy.write_text(source.read_text())
    assert load_node_file(copy) == FakeNvml.preset(preset).node


def test_a_preset_and_its_state_file_load_neither_pydantic_nor_yaml(tmp_path: Path) -> None:
    """The fake is the NVML of every test, bench and sandbox node: its documents are read by hand (docread.py), so
    the plugin's RSS and start-up are a GPU node's, not pydantic's (docs/benchmarks.md "Issue 37, item 2")."""
    code = (
        "import sys\n"
        "from dra_driver.nvml.fake.backend import FakeNvml, FakeSettings\n"
        "from dra_driver.nvml.fake.state import read_fake_state\n"
        "fake = FakeNvml.preset('dgx-h100', settings=FakeSettings(state_path='state.json'))\n"
        "fake.init()\n"
        "fake.set_mig_mode(fake.gpus()[0].uuid, True)\n"
        "assert read_fake_state('state.json').gpus[0].mig_current\n"
        "print(sorted(m for m in ('pydantic', 'pydantic_core', 'yaml') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})  # fmt: skip
    assert out.stdout.strip() == "[]", out.stderr


MINIMAL = "gpus: [{model: A30}]"


@pytest.mark.parametrize(
    ("text", "field", "hint"),
    [
        ("gpus: [{model: A30}, {model: A30}, {model: H900}]", "gpus[2].model", "unknown model 'H900'; known: A100"),
        ("name: x", "gpus", "required"),
        ("gpus: []", "gpus", "at least 1"),
        (
            "gpus: [{model: A30}]\ncolour: red",
            "colour",
            "unknown field; allowed fields: name, driver_version, cuda_driver_version, nvml_version, numa_nodes, pcie, "
            "nvlink, fabric, gpus",
        ),
        ("gpus: [{model: A30, count: 0}]", "gpus[0].count", "must be a whole number between 1 and 128, got 0"),
        ("gpus: [{model: A30, count: true}]", "gpus[0].count", "integer"),
        ("gpus: [{model: A30, count: 129}]", "gpus[0].count", "must be a whole number between 1 and 128, got 129"),
        ("gpus: [{model: A30, count: 65}, {model: A30, count: 65}]", "gpus", "at most 128"),
        ("gpus: [{model: A30, mig: maybe}]", "gpus[0].mig", "enabled, disabled"),
        ("gpus: [{model: L4, mig: enabled}]", "gpus[0].mig", "not MIG-capable"),
        ("gpus: [{model: A30, instances: [{profile: 1g.6gb}]}]", "gpus[0].instances", "mig: enabled"),
        (
            "gpus: [{model: A30, mig: enabled, instances: [{profile: 9g.1gb}]}]",
            "gpus[0].instances[0].profile",
            "known: 1g.6gb",
        ),
        (
            "gpus: [{model: A30, mig: enabled, instances: [{profile: 4g.24gb}, {profile: 1g.6gb}]}]",
            "gpus[0].instances[1]",
            "overlap",
        ),
        (
            "gpus: [{model: A30, mig: enabled, instances: [{profile: 2g.12gb, start: 1}]}]",
            "gpus[0].instances[0]",
            "not valid",
        ),
        (
            "gpus: [{model: A30, mig: enabled, instances: [{profile: 2g.12gb, compute_instances: [4]}]}]",
            "gpus[0].instances[0].compute_instances[0]",
            "offers compute instances of [1, 2]",
        ),
        (
            "gpus: [{model: A30, mig: enabled, instances: [{profile: 2g.12gb, compute_instances: [2, 1]}]}]",
            "gpus[0].instances[0].compute_instances[1]",
            "no free",
        ),
        ("gpus: [{model: A30, numa: 3}]", "gpus[0].numa", "not declared"),
        ("gpus: [{model: A30, count: 2, numa: [0]}]", "gpus[0].numa", "one per GPU"),
        ("gpus: [{model: A30, bus_ids: ['0000:zz:00.0']}]", "gpus[0].bus_ids[0]", "bad PCI bus id"),
        ("gpus: [{model: A30, count: 2, bus_ids: ['1b:00.0', '0000:1B:00.0']}]", "gpus[0].bus_ids[1]", "already used"),
        ("gpus: [{model: A30, uuids: ['GPU-XYZ']}]", "gpus[0].uuids[0]", "bad GPU uuid"),
        ("gpus: [{model: A30, count: 2, minors: [3, 3]}]", "gpus[0].minors[1]", "already used"),
        ("numa_nodes: {0: '0-7', 1: '4-9'}\n" + MINIMAL, "numa_nodes.1", "already in NUMA node 0"),
        ("numa_nodes: {0: 'a-b'}\n" + MINIMAL, "numa_nodes.0", "bad CPU list"),
        ("numa_nodes: []\n" + MINIMAL, "numa_nodes", "mapping"),
        ("pcie: {gpus_per_switch: 0}\n" + MINIMAL, "pcie.gpus_per_switch", ">= 1"),
        ("numa_nodes: {0: '0', 1: '1'}\ngpus: [{model: A30, count: 2, numa: [0, 1]}]", "pcie", "share a PCIe root"),
        ("nvlink: mesh\n" + MINIMAL, "nvlink", "none, nvswitch, direct"),
        ("nvlink: direct\n" + MINIMAL, "nvlink", "need pairs"),
        ("nvlink: {kind: direct, pairs: [[0, 0]]}\ngpus: [{model: A30, count: 2}]", "nvlink.pairs[0]", "itself"),
        (
            "nvlink: {kind: direct, pairs: [[0, 1, 5]]}\ngpus: [{model: A30, count: 2}]",
            "nvlink.pairs[0]",
            "only 4 NVLinks",
        ),
        ("nvlink: {kind: direct, pairs: [[0, 1]]}\ngpus: [{model: L4, count: 2}]", "nvlink.pairs[0]", "no NVLinks"),
        ("nvlink: {kind: none, switches: 2}\n" + MINIMAL, "nvlink.switches", "does not apply"),
        ("fabric: {state: done}\n" + MINIMAL, "fabric.state", "completed"),
        ("fabric: {state: completed, cluster_uuid: nope}\n" + MINIMAL, "fabric.cluster_uuid", "not a UUID"),
        ("driver_version: latest\n" + MINIMAL, "driver_version", "580.105.08"),
        ("gpus: [{model: {name: X}}]", "gpus[0].model.architecture", "required for an inline model"),
        ("gpus: [{model: {base: H900}}]", "gpus[0].model.base", "unknown model"),
        ("gpus: [{model: {base: A30, architecture: martian}}]", "gpus[0].model.architecture", "hopper"),
        ("gpus: [{model: {base: A30, mig: {from: L4}}}]", "gpus[0].model.mig.from", "MIG-capable"),
        (
            "gpus: [{model: {base: A30, mig: {memory_slices: 3, compute_slices: 3, profiles: []}}}]",
            "gpus[0].model.mig.memory_slices",
            "power of two",
        ),
    ],
)
def test_invalid_fields_are_named(text: str, field: str, hint: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_node_text(text, source="node.yaml")
    message = str(err.value)
    assert message.startswith(f"{field}: "), message
    assert hint in message, message
    assert message.endswith("(in node.yaml)")


def test_not_yaml_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not valid YAML"):
        parse_node_text("gpus: [", source="x.yaml")
    with pytest.raises(ValueError, match=r"cannot read fake node file .*missing\.yaml"):
        load_node_file(tmp_path / "missing.yaml")


def test_a_fully_inline_model_with_its_own_mig_table() -> None:
    text = """
name: tiny
nvlink: {kind: direct, pairs: [[0, 1, 2]]}
gpus:
  - count: 2
    mig: enabled
    instances: [{profile: half, compute_instances: [1]}]
    model:
      name: Toy GPU
      architecture: blackwell
      compute_capability: [10, 0]
      memory_mib: 16384
      pci_device_id: 0x12345678
      multiprocessors: 40
      nvlink_links: 2
      mig:
        memory_slices: 2
        compute_slices: 2
        profiles:
          - {id: 3, index: 1, name: whole, slices: 2, instances: 1, multiprocessors: 40, copy_engines: 2,
             decoders: 1, encoders: 0, jpeg_engines: 0, ofa_engines: 0, memory_mib: 16000, placements: ["0:2"]}
          - {id: 7, index: 0, name: half, slices: 1, instances: 2, multiprocessors: 20, copy_engines: 1,
             decoders: 0, encoders: 0, jpeg_engines: 0, ofa_engines: 0, memory_mib: 8000, placements: ["0:1", "1:1"]}
"""
    fake = FakeNvml(parse_node_text(text))
    fake.init()
    a, b = fake.gpus()
    assert (a.name, a.architecture, a.cuda_compute_capability, a.pci_device_id) == (
        "Toy GPU",
        Architecture.BLACKWELL,
        (10, 0),
        0x12345678,
    )
    assert [p.name for p in fake.gpu_instance_profiles(a.uuid)] == ["half", "whole"]  # by index
    assert [(g.id, g.placement) for g in fake.gpu_instances(a.uuid)] == [(1, Placement(0, 1))]  # 1-slice range on 2
    assert fake.create_gpu_instance(a.uuid, 7, Placement(1, 1)).id == 2
    with pytest.raises(NvmlError) as err:
        fake.create_gpu_instance(a.uuid, 3, Placement(0, 2))
    assert err.value.code is NvmlReturn.INSUFFICIENT_RESOURCES
    links = fake.nvlinks(a.uuid)
    assert [(n.link, n.remote_type, n.remote_pci_bus_id) for n in links] == [
        (0, NvLinkRemoteType.GPU, b.pci_bus_id),
        (1, NvLinkRemoteType.GPU, b.pci_bus_id),
    ]
    assert fake.fabric_info(a.uuid) is None  # Blackwell, but no NVSwitch: no fabric by default
    assert fake.numa_node(a.uuid) is None and fake.cpu_affinity(a.uuid) == ()


def test_an_inline_mig_profile_keeps_every_field_under_the_file_names() -> None:
    text = """
name: toy
gpus:
  - model:
      base: A30
      mig:
        memory_slices: 2
        compute_slices: 2
        profiles:
          - {id: 3, index: 1, name: whole, slices: 2, instances: 1, multiprocessors: 40, copy_engines: 2,
             decoders: 3, encoders: 4, jpeg_engines: 5, ofa_engines: 6, memory_mib: 16000, placements: ["0:2"]}
"""
    mig = parse_node_text(text).gpus[0].model.mig
    assert mig is not None and mig.profiles == (
        GpuInstanceProfile(
            index=1,
            id=3,
            name="whole",
            slice_count=2,
            instance_count=1,
            multiprocessors=40,
            copy_engines=2,
            decoders=3,
            encoders=4,
            jpeg_engines=5,
            ofa_engines=6,
            memory_mib=16000,
            placements=(Placement(0, 2),),
        ),
    )


def test_defaults_seed_uuids_bus_ids_and_layout() -> None:
    text = "name: n1\nnuma_nodes: {0: '0-3', 1: '4-7'}\ngpus: [{model: L4, count: 4}]"
    node = parse_node_text(text)
    assert [g.numa_node for g in node.gpus] == [0, 0, 1, 1]  # spread evenly
    assert [g.minor for g in node.gpus] == [0, 1, 2, 3]
    assert len({g.bus_id for g in node.gpus}) == 4
    assert parse_node_text(text) == node  # deterministic
    other = parse_node_text(text, seed="n2")
    assert not {g.uuid for g in node.gpus} & {g.uuid for g in other.gpus}
    renamed = parse_node_text(text.replace("n1", "n3"))
    assert renamed.gpus[0].uuid != node.gpus[0].uuid  # the name is the default seed
    fake = FakeNvml(node)
    fake.init()
    g = fake.gpus()
    assert fake.topology_common_ancestor(g[0].uuid, g[1].uuid) is TopologyLevel.SINGLE
    assert fake.topology_common_ancestor(g[1].uuid, g[2].uuid) is TopologyLevel.SYSTEM
    assert fake.cpu_affinity(g[3].uuid) == (4, 5, 6, 7)


def test_explicit_identities_and_nvml_style_bus_ids() -> None:
    uuid = "GPU-12345678-1234-1234-1234-123456789abc"
    node = parse_node_text(f"gpus: [{{model: H200, bus_ids: ['00000000:AB:00.0'], uuids: ['{uuid}'], minors: [5]}}]")
    (gpu,) = node.gpus
    assert (gpu.bus_id, gpu.uuid, gpu.minor, gpu.pcie_root) == ("0000:ab:00.0", uuid, 5, "pci0000:ab")


def test_every_mistake_of_a_file_is_reported_at_once() -> None:
    text = "gpus: [{model: A30, count: 2, numa: [0], minors: [1, 2, 3]}, {model: 5}]\nnvlink: mesh"
    with pytest.raises(SpecError) as err:
        parse_node_text(text, source="node.yaml")
    assert [str(p) for p in err.value.problems] == [
        "nvlink: must be one of none, nvswitch, direct; got 'mesh' (in node.yaml)",
        "gpus[0].numa: has 1 entries but count is 2; give one per GPU (in node.yaml)",
        "gpus[0].minors: has 3 entries but count is 2; give one per GPU (in node.yaml)",
        "gpus[1].model: must be a string or an object, got an integer 5 (in node.yaml)",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # PyYAML would keep the last of two equal keys; a node file says each thing once.
        (MINIMAL + "\ngpus: []", "node.yaml: not valid YAML: duplicate key 'gpus'"),
        # Leaving a field out means its default; an explicit null is a typo.
        ("nvml_version: null\n" + MINIMAL, "nvml_version: must not be null; leave the field out for its default"),
        ("gpus: [{model: A30, numa: true}]", "gpus[0].numa: must be an integer or a list, got a boolean"),
        ("numa_nodes: {x: '0'}\n" + MINIMAL, "numa_nodes.x: must be an integer, got a string 'x'"),
        (
            "nvlink: {kind: direct, pairs: [[0, 5]]}\ngpus: [{model: A30, count: 2}]",
            "nvlink.pairs[0][1]: GPU 5 does not exist; the node has GPUs 0-1",
        ),
        (
            "gpus: [{model: {base: A30, compute_capability: [9]}}]",
            "gpus[0].model.compute_capability: needs at least 2 entries (write [major, minor], e.g. [9, 0])",
        ),
        ("gpus: [{model: {base: A30, mig: {from: A30, memory_slices: 4}}}]", "mig.memory_slices: unknown field"),
    ],
)
def test_strictness_beyond_the_named_fields(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_node_text(text, source="node.yaml")


def test_null_means_the_default_for_the_blocks_that_allow_it() -> None:
    plain = parse_node_text(MINIMAL)
    nulls = parse_node_text(MINIMAL + "\npcie: null\npci: null\nnuma_nodes: null\nnvlink: {kind: nvswitch, links_per_gpu: null}")
    assert nulls.pci == plain.pci and nulls.numa_nodes == plain.numa_nodes
    assert [g.pcie_switch for g in nulls.gpus] == [g.pcie_switch for g in plain.gpus]
