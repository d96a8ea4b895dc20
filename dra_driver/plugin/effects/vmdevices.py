"""What the device kinds handed to a VM (VFIO passthrough, vGPU, Fabric Manager partitions) plan alike: a VM's
devices never share a claim with a container's, and each is planned with its claim's VFIO config."""

from __future__ import annotations

from collections.abc import Callable

from dra_driver.claimconfig.api import VfioDeviceConfig
from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import PreparedDevice
from dra_driver.plugin.effects.base import ClaimPlan, replace_records


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
