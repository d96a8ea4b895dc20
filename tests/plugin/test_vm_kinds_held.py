"""`vm_kinds_held`: which VM device kinds a checkpoint's records hold, the guard that lets the VFIO, vGPU and Fabric
Manager refusals return at once on a node that hands no GPU to a VM (without listing every held device three times
per prepare)."""

from __future__ import annotations

from dra_driver.plugin.checkpoint import (
    Checkpoint,
    ClaimRecord,
    ClaimState,
    FmPartitionRecord,
    PreparedDevice,
    VfioRecord,
    VgpuRecord,
)
from dra_driver.plugin.effects.vmdevices import vm_kinds_held


def _claim(uid: str, device: PreparedDevice, *, allocated_only: bool = False) -> ClaimRecord:
    devices = () if allocated_only else (device,)
    return ClaimRecord(uid, "ns", uid, ClaimState.PREPARE_STARTED, devices, (device,))


def _device(name: str, **kinds: object) -> PreparedDevice:
    return PreparedDevice(("r",), "node-a", name, (), None, f"GPU-{name}", **kinds)  # type: ignore[arg-type]


def test_each_kind_is_found_in_prepared_and_in_only_allocated_records() -> None:
    plain = _claim("a", _device("gpu-0"))
    vfio = VfioRecord("0000:1b:00.0", 7)
    assert vm_kinds_held(Checkpoint("b", {"a": plain})) == frozenset()
    with_vfio = Checkpoint("b", {"a": plain, "v": _claim("v", _device("gpu-1", vfio=vfio))})
    assert vm_kinds_held(with_vfio) == {"vfio"}
    vgpu = VgpuRecord("0000:1b:00.0", 904, "H100-20C")
    only_allocated = _claim("g", _device("gpu-2", vgpu=vgpu), allocated_only=True)
    assert vm_kinds_held(Checkpoint("b", {"a": plain, "g": only_allocated})) == {"vgpu"}
    fm = FmPartitionRecord(1, (vfio,))
    assert vm_kinds_held(Checkpoint("b", {"f": _claim("f", _device("gpu-3", fm_partition=fm))})) == {"fm_partition"}


def test_a_new_checkpoint_is_scanned_again() -> None:
    """The answer is kept for the checkpoint object last asked about only; every write makes a new one."""
    empty = Checkpoint("b", {})
    assert vm_kinds_held(empty) == frozenset()
    added = empty.with_claim(_claim("v", _device("gpu-1", vfio=VfioRecord("0000:1b:00.0", 7))))
    assert vm_kinds_held(added) == {"vfio"}
    assert vm_kinds_held(added.without_claim("v")) == frozenset()
