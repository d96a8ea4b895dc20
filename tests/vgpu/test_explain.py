"""The allocator's explanation (explain, the sandbox scheduler) for a vGPU slot whose GPU has no room: it names what
holds the GPU's memory instead of the counter that ran out (dra_driver/allocation/diagnose.py)."""

from __future__ import annotations

from tests.allocation.objects import allocated, claim, device, exact, reasons, resource_slice, result, run

SET = "gpu-0-counter-set"


def _slices() -> list[dict[str, object]]:
    whole = device("gpu-0", {"type": "gpu"}, consumes=[(SET, {"memory": "40Gi"})])
    vgpus = [device(f"gpu-0-vgpu-a100-20c-{i}", {"type": "vgpu", "vgpuType": "NVIDIA A100-20C"},
                    consumes=[(SET, {"memory": "20Gi"})]) for i in range(2)]  # fmt: skip
    return [resource_slice("node-1", [whole, *vgpus], counter_sets={SET: {"memory": "40Gi"}})]


def test_a_vgpu_slot_on_a_gpu_in_use_says_what_holds_it() -> None:
    held = allocated("pod", [result("gpu-0")])
    outcome = run(claim([exact("gpu", selectors=["device.attributes['gpu.dra.dev'].type == 'vgpu'"])]), _slices(),
                  allocated_claims=[held])  # fmt: skip
    assert outcome.allocation is None
    found = reasons(outcome, "gpu")
    assert any(r.startswith("the GPU has no room for this vGPU") for r in found), found
