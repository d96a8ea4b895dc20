"""The GPU driver's effect kinds on the one effect protocol (`dra_driver/kubeletplugin/effect.py`, which says the
steps): the plan they fill in (`ClaimPlan`), the hardware code they drive (`NodeTools`), and `GpuEffect`, the
protocol with this driver's types (its plan, device record and catalog) and how the registry builds a kind.

An effect acts only on the devices of its kind (a whole-GPU claim passes the MIG effect untouched); `in_records` says
whether device records name something of its kind (the protocol's `holds`, on a record's prepared devices).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dra_driver.claimconfig.api import DeviceConfig
from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind
from dra_driver.kubeletplugin import effect
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.plugin.cdi import ClaimSpecWriter
from dra_driver.plugin.checkpoint import ClaimRecord, PreparedDevice
from dra_driver.plugin.fmpartition import FabricPartitioner
from dra_driver.plugin.mig import MigActuator
from dra_driver.plugin.mps import MpsDaemons
from dra_driver.plugin.sharing import TimeSlicer
from dra_driver.plugin.vfio import VfioBinder

if TYPE_CHECKING:
    # A type only: the registry imports plugin/vgpu.py where `--vgpu` asks for vGPUs (off by default).
    from dra_driver.plugin.vgpu import VgpuMaker

Records = tuple[PreparedDevice, ...]
Catalog = Mapping[str, AllocatableDevice]
# Names what a device effect is about to change or just made (device name, a just-created MIG instance's identity
# so far, or a passthrough's functions and their drivers before they move) in the claim's record, durably.
Created = effect.Created[PreparedDevice]


@dataclass(frozen=True)
class ClaimPlan:
    """What a claim's allocation asks of this node, before anything is touched: one entry per allocated device
    of our driver and pool, in allocation order."""

    ref: ClaimRef
    devices: tuple[AllocatableDevice, ...]
    configs: tuple[DeviceConfig, ...]
    results: tuple[Mapping[str, Any], ...]  # the raw allocation results (resourceapi DeviceResult.raw)
    admin: frozenset[str]  # devices requested with adminAccess
    records: Records  # the device records as planned so far (what PrepareStarted records)
    notes: tuple[str, ...] = ()  # for the user: configs with nothing to apply (Normal Events)
    pod_claim_name: str | None = None  # the claim's resource.kubernetes.io/pod-claim-name annotation


@dataclass(frozen=True)
class NodeTools:
    """The hardware code the effect kinds drive, as the plugin's settings enable it (None: not enabled here)."""

    driver_name: str
    cdi: ClaimSpecWriter
    mig: MigActuator | None = None  # dynamic MIG
    time_slicer: TimeSlicer | None = None
    mps: MpsDaemons | None = None
    vfio: VfioBinder | None = None  # VFIO passthrough (None: no PCI access on this node)
    vgpu: VgpuMaker | None = None  # vGPUs (None: `--vgpu none`)
    fm_partitions: FabricPartitioner | None = None  # Fabric Manager partitions (None: `--fabric-partitions` off)
    # Asks the plugin to re-read the hardware soon (a GPU left or came back to the nvidia driver) and republish.
    rediscover: Callable[[], None] | None = None


class GpuEffect(effect.Effect[ClaimPlan, PreparedDevice, None, Catalog]):
    """One effect kind of the GPU driver; see dra_driver/kubeletplugin/effect.py for the steps."""

    def __init__(self, tools: NodeTools) -> None:
        """A kind takes what it drives from the node's tools (this one drives nothing); the registry builds every
        kind this way."""

    def in_records(self, records: Records) -> bool:
        """Whether the device records name something of this kind that `undo` must remove."""
        return False

    def changes_node(self, claim: ClaimPlan) -> bool:
        """Whether the planned records name something of this kind (a kind that decides otherwise overrides it)."""
        return self.in_records(claim.records)

    def holds(self, record: ClaimRecord) -> bool:
        return self.in_records(record.devices)


def replace_records(claim: ClaimPlan, records: Sequence[PreparedDevice]) -> ClaimPlan:
    """The plan with new records (the same plan when nothing changed)."""
    records = tuple(records)
    if all(a is b for a, b in zip(records, claim.records, strict=True)):
        return claim
    return ClaimPlan(
        claim.ref, claim.devices, claim.configs, claim.results, claim.admin, records, claim.notes, claim.pod_claim_name
    )


def known_uuid(device: AllocatableDevice) -> str | None:
    """What a device is to CUDA before it is prepared: None for a dynamic MIG device (it does not exist yet)."""
    if device.kind is DeviceKind.MIG_DYNAMIC:
        return None
    if device.kind is DeviceKind.MIG_STATIC and device.mig is not None:
        return device.mig.uuid
    return device.gpu.uuid


def visible_uuid(device: AllocatableDevice, record: PreparedDevice) -> str:
    """What the container addresses once prepared: the MIG UUID of a dynamic or static MIG device, else the GPU's."""
    if record.mig is not None and record.mig.uuid:
        return record.mig.uuid
    return known_uuid(device) or device.gpu.uuid
