"""What the plugin learns about passthrough (VFIO) on its node beyond NVML: the IOMMU, each GPU's IOMMU group and
memory BARs, and which GPUs a claim of ours holds on vfio-pci (docs/passthrough.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import structlog

from dra_driver.inventory.model import NodeInventory
from dra_driver.inventory.passthrough import PassthroughError, PassthroughScope, PassthroughSettings, addressable_memory
from dra_driver.pci.model import PciError, pci_address
from dra_driver.pci.sysfs import HostPciSysfs, PciSysfs
from dra_driver.plugin.checkpoint import Checkpoint, PreparedDevice

log = structlog.get_logger(__name__)


def passed_through(checkpoint: Checkpoint) -> list[PreparedDevice]:
    """The recorded devices whose GPU a claim moved to vfio-pci (in any record state). A Fabric Manager partition
    counts as one passthrough per member GPU it moved (its GPU and functions), so every member keeps its place in
    the catalog and is left out of NVML's watch as a single passed-through GPU is."""
    out: list[PreparedDevice] = []
    for record in checkpoint.claims.values():
        for d in (*record.devices, *record.allocated):
            if d.vfio is not None and d.vfio.started:
                out.append(d)
            elif d.fm_partition is not None:
                uuids = d.fm_partition.uuids
                for i, gpu in enumerate(d.fm_partition.gpus):
                    if gpu.started:
                        uuid = uuids[i] if i < len(uuids) else d.gpu_uuid
                        out.append(replace(d, gpu_uuid=uuid, vfio=gpu, fm_partition=None))
    return out


def with_passed_through(
    previous: NodeInventory | None, inventory: NodeInventory, passed: Callable[[], list[PreparedDevice]]
) -> NodeInventory:
    """A GPU bound to vfio-pci by a claim of ours is gone from NVML's list; it keeps its place in the catalog
    (as last read) while that claim holds it, so its devices stay published and the claim's device is found.
    So does another GPU of its IOMMU group that the passthrough moved along (the group's counter set keeps its
    devices unallocatable meanwhile, and a stale claim on it is refused naming the VM's claim).
    (After a plugin restart it is missing until the claim is unprepared: docs/passthrough.md.)"""
    if previous is None:
        return inventory
    present = {g.uuid for g in inventory.gpus}
    missing = [g for g in previous.gpus if g.uuid not in present]
    if not missing:
        return inventory
    devices = passed()
    held = {d.gpu_uuid for d in devices}
    moved = {f.address for d in devices if d.vfio is not None for f in d.vfio.functions}
    kept = [g for g in missing if g.uuid in held or g.info.pci_bus_id in moved]
    if not kept:
        return inventory
    return replace(inventory, gpus=tuple(sorted((*inventory.gpus, *kept), key=lambda g: g.info.index)))


def passthrough_facts(
    passthrough: PassthroughSettings, inventory: NodeInventory, pci: PciSysfs, *, passed_now: Callable[[], bool]
) -> PassthroughSettings:
    """What the VFIO devices publish that NVML does not know, read once at start: whether the IOMMU is on (off:
    nothing is offered for passthrough, since no prepare could bind a GPU; containers keep every GPU), /dev/iommu
    (IOMMUFD), and each selected GPU's memory BARs (sysfs `resource`; a file that cannot be read leaves the
    capacity out). Raises PassthroughError where `--passthrough` names a GPU the node does not have."""
    if not passthrough.enabled:
        return passthrough
    unknown = passthrough.unknown_gpus(inventory)
    if unknown and passed_now():
        # A GPU on vfio-pci (a VM's, or one a crash left there for recovery to take back) is not in NVML's
        # list: refusing to start would keep recovery from ever rebinding it.
        log.warning("--passthrough names GPUs NVML does not list; some GPUs are passed through now",
                    unknown=list(unknown))  # fmt: skip
    elif unknown:
        raise PassthroughError(
            f"--passthrough {passthrough.label!r}: this node has no GPU {', '.join(unknown)}; its GPUs are "
            + ", ".join(f"{g.info.index} ({g.uuid}, {g.info.pci_bus_id})" for g in inventory.gpus)
        )
    if not pci.iommu_enabled():
        log.warning("passthrough is enabled but the IOMMU is off (no IOMMU groups): no GPU is offered for "
                    "passthrough; turn the IOMMU on (firmware and kernel) and restart the plugin",
                    passthrough=passthrough.label)  # fmt: skip
        return replace(passthrough, scope=PassthroughScope.NONE, gpus=())
    sizes: dict[str, int] = {}
    # Only the host's sysfs has BAR sizes; a fake node's bus ids may name real devices of this machine.
    host_sysfs = pci.sys_root if isinstance(pci, HostPciSysfs) else None
    for gpu in inventory.gpus:
        if host_sysfs is None or not passthrough.selects(gpu):
            continue
        try:
            text = (host_sysfs / "bus/pci/devices" / gpu.info.pci_bus_id / "resource").read_text()
        except OSError:
            continue
        size = addressable_memory(text)
        if size is not None:
            sizes[gpu.info.pci_bus_id] = size
    return replace(passthrough, iommufd=pci.iommufd_present(), addressable_memory=sizes)


def with_iommu_groups(passthrough: PassthroughSettings, inventory: NodeInventory, pci: PciSysfs) -> PassthroughSettings:
    """Each GPU's IOMMU group (sysfs, fixed at boot), for the shared groups' counter sets (slices/iommu.py): read
    for every GPU NVML lists (a GPU not offered for passthrough may share a group with one that is), once per
    GPU; a GPU first seen later (back from vfio-pci after a restart) is read at that re-discovery."""
    if not passthrough.enabled:
        return passthrough
    unknown = [g.info.pci_bus_id for g in inventory.gpus if g.info.pci_bus_id not in passthrough.iommu_groups]
    found: dict[str, int] = {}
    for bus_id in unknown:
        try:
            group = pci.function(pci_address(bus_id)).iommu_group
        except (PciError, ValueError):
            continue  # not in sysfs: the GPU publishes no group counter (the prepare still checks the group)
        if group is not None:
            found[bus_id] = group
    return replace(passthrough, iommu_groups={**passthrough.iommu_groups, **found}) if found else passthrough
