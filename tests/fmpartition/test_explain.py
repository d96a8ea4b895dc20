"""The allocator's explanation (explain, the sandbox scheduler) for a Fabric Manager partition whose GPUs are in use:
it names what holds them instead of the counter that ran out (dra_driver/allocation/diagnose.py)."""

from __future__ import annotations

from tests.allocation.objects import allocated, claim, device, exact, reasons, resource_slice, result, run

# The node's fabric counter set (slices/fabricpartitions.py): a counter per GPU, its number of other devices.
FABRIC = "fabric-partitions-counter-set"


def _slices() -> list[dict[str, object]]:
    gpus = [device(f"gpu-{i}", {"type": "gpu"}, consumes=[(FABRIC, {f"gpu-{i}": "1"})]) for i in range(2)]
    pair = device("fm-partition-3", {"type": "fm-partition", "partitionID": 3, "gpuCount": 2},
                  consumes=[(FABRIC, {"gpu-0": "2", "gpu-1": "2"})])  # fmt: skip
    return [resource_slice("node-1", [*gpus, pair], counter_sets={FABRIC: {"gpu-0": "2", "gpu-1": "2"}})]


def test_a_partition_over_a_gpu_in_use_says_what_holds_it() -> None:
    held = allocated("pod", [result("gpu-1")])
    selector = "device.attributes['gpu.dra.dev'].type == 'fm-partition'"
    outcome = run(claim([exact("vm", selectors=[selector])]), _slices(), allocated_claims=[held])
    assert outcome.allocation is None
    found = reasons(outcome, "vm")
    said = (
        "a GPU of this Fabric Manager partition is in use: a partition needs every use of each of its GPUs (whole, "
        "MIG, shares, passthrough, vGPUs, other partitions over them)"
    )
    assert found.get(said) == 1, found
    assert outcome.explanation is not None
    [examples] = [r.examples for q in outcome.explanation.requests for r in q.reasons if r.reason == said]
    assert examples == ("gpu.dra.dev/pool-1/fm-partition-3 (held by gpu-1 (claim default/pod))",)


def test_a_partition_over_free_gpus_is_allocated() -> None:
    selector = "device.attributes['gpu.dra.dev'].type == 'fm-partition'"
    outcome = run(claim([exact("vm", selectors=[selector])]), _slices())
    assert outcome.allocation is not None
