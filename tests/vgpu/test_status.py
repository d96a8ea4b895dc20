"""`dra-driver status` on a vGPU host: the GPU's held vGPU slots are listed under it with their type and holders, the
GPU's sharing says `vgpu` (dra_driver/commands/statusview.py)."""

from __future__ import annotations

from typing import Any

from dra_driver.commands.statusview import build_status, readable_claims, render

D = "gpu.dra.dev"


def _device(name: str, type_: str, **attrs: str) -> dict[str, Any]:
    out = {"type": {"string": type_}, "productName": {"string": "NVIDIA A100"}, "minor": {"int": 0}}
    out.update({k: {"string": v} for k, v in attrs.items()})
    return {"name": name, "attributes": out}


def test_held_vgpus_are_listed_under_their_gpu() -> None:
    devices = [_device("gpu-0", "gpu", uuid="GPU-A")] + [
        _device(f"gpu-0-vgpu-a100-10c-{i}", "vgpu", parentUUID="GPU-A", vgpuType="NVIDIA A100-10C") for i in range(4)
    ]
    slices = [{"spec": {"driver": D, "nodeName": "n1", "pool": {"name": "n1", "generation": 1,
                                                                 "resourceSliceCount": 1}, "devices": devices}}]
    result = {"driver": D, "pool": "n1", "device": "gpu-0-vgpu-a100-10c-1", "request": "vgpu"}
    claim = {"metadata": {"namespace": "vms", "name": "vm1"},
             "status": {"allocation": {"devices": {"results": [result]}},
                        "reservedFor": [{"resource": "pods", "name": "virt-launcher-vm1", "uid": "u"}]}}
    claims, problems = readable_claims([claim])
    assert problems == []
    pods = [{"metadata": {"namespace": "vms", "name": "virt-launcher-vm1"}, "status": {"phase": "Running"}}]
    [node] = build_status(slices, claims, pods, driver=D)
    [gpu] = node.gpus
    assert gpu.sharing == "vgpu"
    assert [(v.name, v.profile, [h.claim for h in v.holders]) for v in gpu.vgpus] == [
        ("gpu-0-vgpu-a100-10c-1", "NVIDIA A100-10C", ["vms/vm1"])
    ]
    table = render([node], "", driver=D)
    assert "gpu-0-vgpu-a100-10c-1" in table and "vms/vm1 <- vms/virt-launcher-vm1 (Running)" in table
