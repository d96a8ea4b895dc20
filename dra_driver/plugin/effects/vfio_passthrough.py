"""VFIO passthrough: a `vfio` device (`gpu-<minor>-vfio`) is its GPU handed to a virtual machine. Prepare moves
the GPU's IOMMU group from its drivers to vfio-pci, unprepare moves it back (the hardware code is plugin/vfio.py;
docs/passthrough.md). The claim's CDI spec then names `/dev/vfio/<group>` (or the IOMMUFD device) instead of the
GPU's nvidia nodes (plugin/cdi.py).

Records: `vfio` (a VfioRecord) of each such device: planned with the GPU's PCI address, IOMMU group and the
config's IOMMU choices; the functions to move with their drivers and the persistence mode are recorded in the
PrepareStarted record (`created`, durable) before the first function leaves its driver, so rollback, unprepare and
the recovery after a crash at any step rebind each function to exactly the driver it had. Without PCI access
(`binder` None) a `vfio` device is refused at plan time.

A GPU bound to vfio-pci is gone from NVML's device list; after it is rebound the plugin re-reads the hardware
(`rediscover`), so the GPU is offered for container use again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from dra_driver.claimconfig.api import VfioDeviceConfig
from dra_driver.inventory.catalog import DeviceKind
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import Checkpoint, PreparedDevice, VfioRecord
from dra_driver.plugin.effects.base import Catalog, ClaimPlan, Created, Effect, NodeTools, Records, replace_records
from dra_driver.plugin.vfio import VfioBinder

PASSTHROUGH_NOT_ENABLED = (
    "device {name} is a VFIO passthrough device, but this plugin has no PCI access (sysfs) to bind GPUs to vfio-pci"
)


class VfioPassthrough(Effect):
    kind = "vfio-passthrough"

    @classmethod
    def build(cls, tools: NodeTools) -> VfioPassthrough:
        return cls(tools.vfio, tools.rediscover)

    def __init__(self, binder: VfioBinder | None, rediscover: Callable[[], None] | None = None) -> None:
        self.binder = binder
        self._rediscover = rediscover

    def plan(self, claim: ClaimPlan) -> ClaimPlan:
        kinds = {d.kind is DeviceKind.VFIO for d in claim.devices}
        if True not in kinds:
            return claim
        if len(kinds) > 1:
            vfio = ", ".join(d.name for d in claim.devices if d.kind is DeviceKind.VFIO)
            raise PrepareError(
                f"the claim mixes passthrough devices ({vfio}) with devices for containers; a GPU passed through "
                "belongs to a VM: request them in separate claims"
            )
        records = []
        for device, config, record in zip(claim.devices, claim.configs, claim.records, strict=True):
            if self.binder is None:
                raise PrepareError(PASSTHROUGH_NOT_ENABLED.format(name=device.name))
            vfio_config = config if isinstance(config, VfioDeviceConfig) else VfioDeviceConfig()
            records.append(replace(record, vfio=self.binder.plan(device, vfio_config)))
        return replace_records(claim, records)

    def refuse(self, claim: ClaimPlan, checkpoint: Checkpoint) -> None:
        """A GPU is either passed through or used by containers: never both (the counters keep the scheduler from
        it; this is the last line of defence, against a stale allocation)."""
        gpus = {d.gpu.uuid: d for d in claim.devices}
        passing = {d.gpu.uuid for d in claim.devices if d.kind is DeviceKind.VFIO}
        for other in checkpoint.claims.values():
            if other.uid == claim.ref.uid:
                continue
            for held in (*other.devices, *other.allocated):
                if held.gpu_uuid not in gpus or not (held.vfio is not None or held.gpu_uuid in passing):
                    continue
                device = gpus[held.gpu_uuid]
                what = "passed through to a VM" if held.vfio is not None else "in use for containers"
                raise PrepareError(
                    f"GPU of device {device.name} is {what} by claim {other.namespace}/{other.name} (uid {other.uid}, "
                    f"device {held.device}); refusing {claim.ref.namespace}/{claim.ref.name}"
                )

    def changes_node(self, claim: ClaimPlan) -> bool:
        return self.holds(claim.records)

    def holds(self, records: Records) -> bool:
        return any(r.vfio is not None for r in records)

    def apply(self, claim: ClaimPlan, records: Records, checkpoint: Checkpoint, created: Created) -> Records:
        if self.binder is None or not self.holds(records):
            return records
        out: list[PreparedDevice] = []
        for device, record in zip(claim.devices, records, strict=True):
            if record.vfio is not None:
                name = record.device

                def recorded(vfio: VfioRecord, name: str = name) -> None:
                    created(name, vfio)

                record = replace(record, vfio=self.binder.bind(device, record.vfio, recorded))
            out.append(record)
        self._changed()
        return tuple(out)

    def undo(self, uid: str, records: Records, checkpoint: Checkpoint, *, rollback: bool) -> None:
        if self.binder is None:
            return
        restored = False
        for record in records:
            if record.vfio is not None and record.vfio.started:
                self.binder.restore(record.gpu_uuid, record.vfio)
                restored = True
        if restored:
            self._changed()

    def verify(self, uid: str, records: Records, checkpoint: Checkpoint, catalog: Catalog) -> list[str]:
        if self.binder is None:
            return []
        return [p for r in records if r.vfio is not None for p in self.binder.problems(r.vfio)]

    def repair(
        self, ref: ClaimRef, records: Records, checkpoint: Checkpoint, catalog: Catalog, created: Created
    ) -> Records:
        if self.binder is None:
            return records
        out = []
        for record in records:
            if record.vfio is not None and self.binder.problems(record.vfio):
                record = replace(record, vfio=self.binder.rebind(catalog[record.device], record.vfio))
            out.append(record)
        return tuple(out)

    def _changed(self) -> None:
        """A GPU left or came back to the nvidia driver: the plugin re-reads the hardware and republishes."""
        if self._rediscover is not None:
            self._rediscover()
