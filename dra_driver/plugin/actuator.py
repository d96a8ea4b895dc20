"""What happens to the hardware when a device is prepared or released.

The engine calls an actuator per device. This one handles exclusive use of whole GPUs and static MIG
devices, for which nothing on the GPU changes (the container gets the device through CDI). Dynamic MIG
and sharing plug in here as further actuators.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

from dra_driver.claimconfig.api import DeviceConfig
from dra_driver.errors import DraDriverError
from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.nvml.types import Placement
from dra_driver.plugin.checkpoint import MigRecord, PreparedDevice


class PrepareError(DraDriverError):
    """A per-claim failure with a message for the user (it ends up in the claim's error)."""


@dataclass(frozen=True)
class PreparedHardware:
    visible_uuid: str  # what the container addresses: GPU UUID or MIG UUID
    gpu_uuid: str
    mig: MigRecord | None = None


# Called by an actuator the moment it has created something on the hardware, so that the checkpoint names
# it before anything else can go wrong (a crash then rolls back exactly that, never a look-alike).
RecordCreated = Callable[[MigRecord], None]


def ignore_created(record: MigRecord) -> None:
    return None


class DeviceActuator(Protocol):
    def prepare(
        self, claim: ClaimRef, device: AllocatableDevice, config: DeviceConfig, record: RecordCreated = ignore_created
    ) -> PreparedHardware: ...

    def release(self, device: PreparedDevice) -> None:
        """Undo `prepare` for a completed device; idempotent. Removes only hardware state whose full recorded
        identity it finds; anything else is left alone and logged."""

    def rollback(self, device: PreparedDevice) -> None:
        """Undo what a crashed or failed `prepare` recorded for this allocated device (same identity rule)."""

    def verify(self, device: PreparedDevice) -> str | None:
        """None when the hardware state of a prepared device is exactly as recorded; else what is wrong."""

    def recreate(self, device: AllocatableDevice, record: RecordCreated = ignore_created) -> PreparedHardware:
        """Make a prepared device's hardware state again after `verify` found it gone (the claim's config was
        validated by its first prepare)."""

    def adopt(self, device: AllocatableDevice) -> MigRecord | None:
        """Rebuilding a lost checkpoint: the live hardware state that is exactly this allocated device, if any."""

    def count_instances(self, gpus: Collection[str]) -> int:
        """How many partitions exist on these GPUs (evidence that something was prepared here)."""

    def destroy_unowned(
        self,
        gpus: Mapping[str, bool],
        owned: Collection[MigRecord],
        reserved: Collection[tuple[str, Placement]] = (),
    ) -> int:
        """Startup sweep of state no record owns on the GPUs this actuator manages (`gpus`: UUID -> may toggle
        MIG). State overlapping a `reserved` placement (allocated to a claim on this node) is kept. Returns how
        many instances were destroyed."""


class ExclusiveActuator:
    def prepare(
        self, claim: ClaimRef, device: AllocatableDevice, config: DeviceConfig, record: RecordCreated = ignore_created
    ) -> PreparedHardware:
        # Sharing changes nothing about the device itself: the engine applies time-slices (plugin/sharing.py) and
        # MPS daemons (plugin/mps.py) around it.
        return self.recreate(device)

    def release(self, device: PreparedDevice) -> None:
        return None

    def rollback(self, device: PreparedDevice) -> None:
        return None

    def verify(self, device: PreparedDevice) -> str | None:
        return None  # nothing on the GPU changes for an exclusive whole GPU or a static MIG device

    def recreate(self, device: AllocatableDevice, record: RecordCreated = ignore_created) -> PreparedHardware:
        if device.kind is DeviceKind.MIG_DYNAMIC:
            raise PrepareError(f"device {device.name} is a dynamic MIG device, but dynamic MIG is not enabled")
        if device.kind is DeviceKind.MIG_STATIC:
            assert device.mig is not None
            return PreparedHardware(visible_uuid=device.mig.uuid, gpu_uuid=device.gpu.uuid)
        return PreparedHardware(visible_uuid=device.gpu.uuid, gpu_uuid=device.gpu.uuid)

    def adopt(self, device: AllocatableDevice) -> MigRecord | None:
        return None

    def count_instances(self, gpus: Collection[str]) -> int:
        return 0

    def destroy_unowned(
        self,
        gpus: Mapping[str, bool],
        owned: Collection[MigRecord],
        reserved: Collection[tuple[str, Placement]] = (),
    ) -> int:
        return 0  # static MIG and whole GPUs: the driver owns no partitions
