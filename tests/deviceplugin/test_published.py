"""What the API shows of the GPUs the device plugin holds (deviceplugin/published.py): the slices' annotation
`gpu.dra.dev/device-plugin` read as untrusted input, only a pool's newest generation counting, and how `status` and
`explain` name the device plugin and its pod for a GPU the slices leave out."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dra_driver.commands.explain import explain_claim
from dra_driver.commands.statusview import build_status, render
from dra_driver.deviceplugin.published import (
    ANNOTATION,
    MAX_BYTES,
    HeldGpu,
    decode_held,
    encode_held,
    held_in_slices,
)
from tests.allocation.objects import GPU_CLASS, claim, device, exact, node, resource_slice

D = "gpu.dra.dev"
HELD = (HeldGpu("gpu-3", "GPU-3", "NVIDIA H100 80GB HBM3", ("team-a/trainer-0",)), HeldGpu("gpu-10", "GPU-10"))


def _annotated(obj: dict[str, Any], held: tuple[HeldGpu, ...] | str = HELD) -> dict[str, Any]:
    value = held if isinstance(held, str) else encode_held(held)
    obj["metadata"] = {**obj.get("metadata", {}), "annotations": {ANNOTATION: value}}
    return obj


def test_the_annotation_round_trips_in_device_order() -> None:
    value = encode_held(HELD)
    assert json.loads(value)["gpus"][0]["device"] == "gpu-3"  # gpu-3 before gpu-10
    assert decode_held(value) == HELD
    assert len(value) < 300


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("not json", "Expecting value"),
        ("[]", "(the annotation): must be a JSON object"),
        ('{"version": 2, "gpus": []}', "version: 2 is not 1"),
        ('{"version": 1, "gpus": {}}', "gpus: must be a list"),
        (json.dumps({"version": 1, "gpus": [{"device": "gpu-0", "uuid": "G"}] * 257}), "gpus: must be a list of at most"),
        ('{"version": 1, "gpus": [7]}', "gpus[0]: must be an object"),
        ('{"version": 1, "gpus": [{"device": "../etc", "uuid": "G"}]}', "gpus[0].device"),
        ('{"version": 1, "gpus": [{"device": "gpu-1", "uuid": "G\\u0000"}]}', "gpus[0].uuid"),
        (json.dumps({"version": 1, "gpus": [{"device": "gpu-1", "uuid": "G" * 65}]}), "gpus[0].uuid"),
        ('{"version": 1, "gpus": [{"device": "gpu-1", "uuid": "G", "productName": 3}]}', "gpus[0].productName"),
        ('{"version": 1, "gpus": [{"device": "gpu-1", "uuid": "G", "pods": "ns/p"}]}', "gpus[0].pods: must be a list"),
        ('{"version": 1, "gpus": [{"device": "gpu-1", "uuid": "G", "pods": ["NS/p"]}]}', "gpus[0].pods[0]"),
        ('{"version": 1, "gpus": [{"device": "gpu-1", "uuid": "G", "pods": ["n/p", 1]}]}', "gpus[0].pods[1]"),
        (" " * (MAX_BYTES + 1), f"larger than {MAX_BYTES} bytes"),
    ],
)
def test_a_hostile_annotation_is_refused_naming_the_field(value: str, field: str) -> None:
    with pytest.raises(ValueError) as refused:
        decode_held(value)
    assert field in str(refused.value)


def test_only_the_newest_generation_of_a_pool_counts_and_a_bad_one_is_reported() -> None:
    old = _annotated(resource_slice("s-old", pool="node-1", generation=1))  # held then, released since
    new = resource_slice("s-new", pool="node-1", generation=2)
    other = _annotated(resource_slice("s-2", pool="node-2", node="node-2", generation=4))
    foreign = _annotated(resource_slice("s-3", pool="node-3", node="node-3", driver="other.dev"))
    bad = _annotated(resource_slice("s-4", pool="node-4", node="node-4"), '{"version": 1, "gpus": [{"device": 1}]}')
    held = held_in_slices([old, new, other, foreign, bad], D)
    assert dict(held.gpus) == {"node-2": HELD}
    assert held.by_node() == {"node-2": HELD}
    assert held.problems == ("ResourceSlice s-4: annotation gpu.dra.dev/device-plugin: gpus[0].device: 1 is not valid",)
    assert set(held_in_slices([foreign], None).gpus) == {"node-3"}  # explain reads every driver's


def _status_slice(devices: list[dict[str, Any]], generation: int = 1) -> dict[str, Any]:
    obj = resource_slice("s", devices, pool="n1", node="n1", generation=generation)
    return _annotated(obj)


def _gpu(minor: int) -> dict[str, Any]:
    return device(f"gpu-{minor}", {"type": "gpu", "uuid": f"GPU-{minor}", "productName": "NVIDIA H100 80GB HBM3",
                                   "minor": minor})  # fmt: skip


def test_status_shows_the_gpus_the_slices_leave_out_with_the_device_plugin_and_its_pod() -> None:
    slices = [_status_slice([_gpu(0)])]
    held = held_in_slices(slices, D)
    [n1] = build_status(slices, [], [], driver=D, device_plugin=held.gpus)
    assert [(g.name, g.sharing, g.device_plugin) for g in n1.gpus] == [
        ("gpu-0", "exclusive", None), ("gpu-3", "device-plugin", ("team-a/trainer-0",)), ("gpu-10", "device-plugin", ())]
    table = render([n1], "", driver=D)
    row = next(line for line in table.splitlines() if "gpu-3" in line)
    assert "NVIDIA H100 80GB HBM3" in row and "device-plugin: team-a/trainer-0" in row
    assert "device-plugin: (pod not listed by the kubelet yet)" in next(
        line for line in table.splitlines() if "gpu-10" in line)
    data = json.loads(render([n1], "json", driver=D))
    assert data[0]["gpus"][1]["device_plugin"] == ["team-a/trainer-0"]
    assert data[0]["gpus"][0]["device_plugin"] is None


def test_status_shows_a_node_whose_every_gpu_the_device_plugin_holds() -> None:
    slices = [_status_slice([])]  # an empty pool is one slice without devices
    [n1] = build_status(slices, [], [], driver=D, device_plugin=held_in_slices(slices, D).gpus)
    assert [g.name for g in n1.gpus] == ["gpu-3", "gpu-10"]
    assert "(no GPUs)" not in render([n1], "", driver=D)


def test_explain_names_the_device_plugin_and_its_pod_where_the_claim_does_not_fit() -> None:
    slices = [_annotated(resource_slice("s", [_gpu(m) for m in (0, 1)], pool="node-1"))]
    held = held_in_slices(slices, None).by_node()
    want = claim([exact("gpus", count=3)])
    fits, text = explain_claim(want, nodes=[node()], classes=[GPU_CLASS], slices=slices, claims=[],
                               namespace_labels={}, device_plugin=held)  # fmt: skip
    assert fits == []
    assert "left out of the ResourceSlices (allocated as nvidia.com/gpu through the kubelet's device plugin" in text
    assert "gpu-3 (GPU-3): held by the device plugin (pod team-a/trainer-0)" in text
    assert "gpu-10 (GPU-10): held by the device plugin (its pod not listed by the kubelet yet)" in text
    # Counted in full too (not only the sieve's early "short" verdict): the same lines after the allocator's.
    fits, full = explain_claim(want, nodes=[node()], classes=[GPU_CLASS], slices=slices, claims=[],
                               namespace_labels={}, device_plugin=held, prune=False)  # fmt: skip
    assert fits == [] and "needs" in full and "gpu-3 (GPU-3): held by the device plugin" in full
    fits, text = explain_claim(claim([exact("gpus", count=2)]), nodes=[node()], classes=[GPU_CLASS], slices=slices,
                               claims=[], namespace_labels={}, device_plugin=held)  # fmt: skip
    assert fits == ["node-1"] and "device plugin" not in text  # where it fits, nothing to blame
