"""What the device kinds handed to a VM (VFIO passthrough, vGPU, Fabric Manager partitions) do alike: a VM's
devices never share a claim with a container's, each is planned with its claim's VFIO config, and each moves a GPU
away from (or back to) the nvidia driver, after which the plugin re-reads the hardware."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from dra_driver.claimconfig.api import VfioDeviceConfig
from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import Checkpoint, ClaimRecord, PreparedDevice
from dra_driver.plugin.effects.base import Catalog, ClaimPlan, Created, GpuEffect, Records, replace_records

VM_KINDS = (DeviceKind.VFIO, DeviceKind.VGPU, DeviceKind.FM_PARTITION)  # every kind handed to a VM


def held_elsewhere(claim: ClaimPlan, checkpoint: Checkpoint) -> list[tuple[ClaimRecord, PreparedDevice]]:
    """Every device record of the other claims (prepared or only allocated), with its claim: what a VM kind's
    refusal checks the claim's records against. Read inside the checkpoint write, so two claims preparing at once
    see each other's records."""
    others = (o for o in checkpoint.claims.values() if o.uid != claim.ref.uid)
    return [(other, held) for other in others for held in (*other.devices, *other.allocated)]


def vm_kinds_held(checkpoint: Checkpoint) -> frozenset[str]:
    """Which of "vfio", "vgpu", "fm_partition" any device record of any claim in `checkpoint` holds (the claim being
    prepared included: a superset of what `held_elsewhere` finds). A kind absent here cannot clash with anything, so
    its refusal returns at once: with 64 claims held, the three refusals' scans of every held device were ≈ 5 % of
    a prepare's CPU on a node that hands no GPU to a VM. Scanned by each of the three (no cache kept between calls:
    ≈ 12 µs at 64 claims held, where the refusals' listing was ≈ 250 µs)."""
    kinds: set[str] = set()
    for record in checkpoint.claims.values():
        for held in (*record.devices, *record.allocated):
            if held.vfio is not None:
                kinds.add("vfio")
            if held.vgpu is not None:
                kinds.add("vgpu")
            if held.fm_partition is not None:
                kinds.add("fm_partition")
    return frozenset(kinds)


def holder(other: ClaimRecord, held: PreparedDevice) -> str:
    """Who holds a device, as a refusal names it."""
    return f"claim {other.namespace}/{other.name} (uid {other.uid}, device {held.device})"


def refusing(claim: ClaimPlan) -> str:
    """The end of a refusal: the claim refused."""
    return f"refusing {claim.ref.namespace}/{claim.ref.name}"


def plan_vm_devices(
    claim: ClaimPlan,
    kind: DeviceKind,
    *,
    beside: tuple[DeviceKind, ...],
    mixed: str,
    plan: Callable[[AllocatableDevice, VfioDeviceConfig, PreparedDevice], PreparedDevice],
) -> ClaimPlan:
    """The records of a claim's devices of `kind`, a kind handed to a VM (passthrough, vGPU, Fabric Manager
    partition), each planned by `plan` with its VFIO config (the defaults where the claim has none). A VM's devices
    and a container's cannot share a claim: one of `kind` beside any device not of `beside` is refused, naming the
    devices (`mixed`: what they are, "vGPU devices")."""
    if not any(d.kind is kind for d in claim.devices):
        return claim
    if any(d.kind not in beside for d in claim.devices):
        names = ", ".join(d.name for d in claim.devices if d.kind is kind)
        raise PrepareError(
            f"the claim mixes {mixed} ({names}) with devices for containers; they belong to a VM: request them in "
            "separate claims"
        )
    records = []
    for device, config, record in zip(claim.devices, claim.configs, claim.records, strict=True):
        if device.kind is kind:
            record = plan(device, config if isinstance(config, VfioDeviceConfig) else VfioDeviceConfig(), record)
        records.append(record)
    return replace_records(claim, records)


class VmRecord(Protocol):
    """A VM kind's part of a device record (VfioRecord, VgpuRecord, FmPartitionRecord)."""

    @property
    def started(self) -> bool:
        """Whether anything was changed on the node for it yet (what undo must remove)."""

    def record_on(self, device: PreparedDevice) -> PreparedDevice: ...


R = TypeVar("R", bound=VmRecord)


class VmTool(Protocol[R]):
    """What a VM kind's hardware code answers alike (VfioBinder, VgpuMaker, FabricPartitioner)."""

    def plan(self, device: AllocatableDevice, config: VfioDeviceConfig) -> R: ...

    def problems(self, record: R) -> list[str]: ...


T = TypeVar("T", bound="VmTool[Any]")
Recorded = Callable[[R], None]  # names what is about to change in the device's record, durably


class VmDeviceEffect(GpuEffect, Generic[T, R]):
    """A kind handed to a VM, over its part of each device record (`_of`): planned by its `tool` with the claim's
    VFIO config, made device by device for the claim (`_make`, which calls `recorded` before it changes anything,
    so the record is durable first; `owner`: the claim's UID), removed where the record says it was started
    (`_remove`), made again where the tool finds problems (`_remake`). After anything is made (or failed to be),
    removed or made again the plugin re-reads the hardware and republishes (`rediscover`). Without the tool (None:
    not enabled on this node) such a device is refused at plan time (`not_enabled`, with the device's `name`)."""

    device_kind: ClassVar[DeviceKind]
    beside: ClassVar[tuple[DeviceKind, ...]] = VM_KINDS  # the kinds a claim of such devices may also hold (any VM kind)
    mixed: ClassVar[str]  # what such devices are, in the refusal of a claim that mixes them with others
    not_enabled: ClassVar[str]
    held_as: ClassVar[str]  # this kind's name among `vm_kinds_held`'s

    def __init__(self, tool: T | None, rediscover: Callable[[], None] | None) -> None:
        self.tool = tool
        self._rediscover = rediscover

    def _of(self, device: PreparedDevice) -> R | None:
        raise NotImplementedError

    def neither_side_holds(self, claim: ClaimPlan, checkpoint: Checkpoint) -> bool:
        """Neither the claim nor any record of the checkpoint holds a device of this kind: nothing of it can clash,
        so its refusal returns without listing what the other claims hold (the usual node's case)."""
        return all(self._of(r) is None for r in claim.records) and self.held_as not in vm_kinds_held(checkpoint)

    def _make(self, tool: T, device: AllocatableDevice, planned: R, recorded: Recorded[R], owner: str) -> R:
        raise NotImplementedError

    def _remove(self, tool: T, device: PreparedDevice, made: R) -> None:
        raise NotImplementedError

    def _remake(self, tool: T, device: AllocatableDevice, made: R) -> R:
        raise NotImplementedError

    def plan(self, claim: ClaimPlan) -> ClaimPlan:
        return plan_vm_devices(claim, self.device_kind, beside=self.beside, mixed=self.mixed, plan=self._plan)

    def _plan(self, device: AllocatableDevice, config: VfioDeviceConfig, record: PreparedDevice) -> PreparedDevice:
        if self.tool is None:
            raise PrepareError(self.not_enabled.format(name=device.name))
        planned: R = self.tool.plan(device, config)
        return planned.record_on(record)

    def in_records(self, records: Records) -> bool:
        return any(self._of(r) is not None for r in records)

    def apply(self, claim: ClaimPlan, records: Records, checkpoint: Checkpoint, created: Created) -> Records:
        if self.tool is None or not self.in_records(records):
            return records
        out: list[PreparedDevice] = []
        try:
            for device, record in zip(claim.devices, records, strict=True):
                planned = self._of(record)
                if planned is not None:
                    made = self._make(self.tool, device, planned, partial(created, record.device), claim.ref.uid)
                    record = made.record_on(record)
                out.append(record)
        finally:
            # Also after a failure: a GPU may have left its driver before it, and the rollback may fail too.
            self._changed()
        return tuple(out)

    def undo(self, owner: ClaimRecord, records: Records, checkpoint: Checkpoint, *, rollback: bool) -> None:
        if self.tool is None:
            return
        removed = False
        for record in records:
            made = self._of(record)
            if made is not None and made.started:
                self._remove(self.tool, record, made)
                removed = True
        if removed:
            self._changed()

    def verify(self, owner: ClaimRecord, records: Records, checkpoint: Checkpoint, catalog: Catalog) -> list[str]:
        if self.tool is None:
            return []
        return [p for r in records if (made := self._of(r)) is not None for p in self.tool.problems(made)]

    def repair(
        self, owner: ClaimRecord, records: Records, checkpoint: Checkpoint, catalog: Catalog, created: Created
    ) -> Records:
        if self.tool is None:
            return records
        out = tuple(self._repaired(self.tool, r, catalog) for r in records)
        if any(a is not b for a, b in zip(out, records, strict=True)):
            self._changed()
        return out

    def _repaired(self, tool: T, record: PreparedDevice, catalog: Catalog) -> PreparedDevice:
        made = self._of(record)
        if made is None or not tool.problems(made):
            return record
        remade = self._remake(tool, catalog[record.device], made)
        return record if remade is made else remade.record_on(record)

    def _changed(self) -> None:
        """A GPU left or came back to the nvidia driver (or what it can create changed): the plugin re-reads the
        hardware and republishes."""
        if self._rediscover is not None:
            self._rediscover()
