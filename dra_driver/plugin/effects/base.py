"""The effect protocol: what one kind of thing a claim does to a node, from plan to crash recovery.

An effect is told about a claim at each step of its life and acts only on the devices of its kind (a whole-GPU
claim passes the MIG effect untouched). Every step works on values: the claim's plan, its device records and the
checkpoint as the engine last read or wrote it. No effect reads or writes the checkpoint itself; the engine does,
once per step (plugin/engine.py), and the effect's state on the node is what the records say.

    plan      fill in this kind's part of each device record before anything is touched; refuse what this
              node cannot serve (naming the field)
    refuse    refuse a plan that clashes with what other claims' records hold (the last line of defence)
    apply     make the node as planned; returns the records with what only the hardware knows (live ids).
              Something created is named through `created` (a durable write) before anything else can fail
    undo      remove what the records name, by full identity only; idempotent (a crash repeats it)
    verify    what no longer matches the records of a prepared claim
    repair    make again what `verify` found wrong, under the claim's GPU locks
    adopt     rebuilding a lost checkpoint: the live state of an allocated claim found on the node
    leftovers whether anything of this kind exists at all (evidence that a missing checkpoint was lost)
    sweep     with ownership known: remove what no record (and no claim allocated here) owns

The base class does nothing at every step, so a kind overrides only the steps where it acts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.claimconfig.api import DeviceConfig
from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.plugin.cdi import ClaimSpecWriter
from dra_driver.plugin.checkpoint import Checkpoint, MigRecord, PreparedDevice, VfioRecord
from dra_driver.plugin.mig import MigActuator
from dra_driver.plugin.mps import MpsDaemons
from dra_driver.plugin.ownership import AllocatedClaim
from dra_driver.plugin.sharing import TimeSlicer
from dra_driver.plugin.vfio import VfioBinder

Records = tuple[PreparedDevice, ...]
Catalog = Mapping[str, AllocatableDevice]
# Names what a device effect is about to change or just made (device name, a just-created MIG instance's identity
# so far, or a passthrough's functions and their drivers before they move) in the claim's record, durably.
Created = Callable[[str, MigRecord | VfioRecord], None]


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
    # Asks the plugin to re-read the hardware soon (a GPU left or came back to the nvidia driver) and republish.
    rediscover: Callable[[], None] | None = None


class Effect:
    """One kind of effect; see the module docstring for the steps."""

    kind = "none"  # in logs and docs

    @classmethod
    def build(cls, tools: NodeTools) -> Effect:
        """This kind on this node (the registry builds every kind this way)."""
        raise NotImplementedError(f"effect kind {cls.kind} does not say how it is built")

    def plan(self, claim: ClaimPlan) -> ClaimPlan:
        return claim

    def refuse(self, claim: ClaimPlan, checkpoint: Checkpoint, catalog: Catalog) -> None:
        return None

    def changes_node(self, claim: ClaimPlan) -> bool:
        """Whether `apply` would change anything outside the checkpoint and the CDI spec (then PrepareStarted
        must be durable first, so a crash can be rolled back)."""
        return False

    def holds(self, records: Records) -> bool:
        """Whether the records name something of this kind that `undo` must remove."""
        return False

    def apply(self, claim: ClaimPlan, records: Records, checkpoint: Checkpoint, created: Created) -> Records:
        return records

    def undo(self, uid: str, records: Records, checkpoint: Checkpoint, *, rollback: bool) -> None:
        """`checkpoint` still holds this claim's record (excluded by `uid` where other holders are counted);
        `rollback`: the records are a PrepareStarted record's (what a failed or crashed prepare got to)."""
        return None

    def verify(self, uid: str, records: Records, checkpoint: Checkpoint, catalog: Catalog) -> list[str]:
        return []

    def repair(
        self, ref: ClaimRef, records: Records, checkpoint: Checkpoint, catalog: Catalog, created: Created
    ) -> Records:
        """Every recorded device is in `catalog` (checked before)."""
        return records

    def adopt(self, claim: ClaimPlan) -> tuple[ClaimPlan, bool]:
        """The plan with the live state found on the node, and whether anything of this claim was found."""
        return claim, False

    def leftovers(self, catalog: Catalog) -> bool:
        return False

    def sweep_temp_files(self) -> list[Path]:
        """At startup, with no claim operation running: delete this kind's temp files a crash left mid-write."""
        return []

    def sweep(
        self, checkpoint: Checkpoint, allocated: Mapping[str, AllocatedClaim] | None, catalog: Catalog
    ) -> tuple[str, ...]:
        """What was removed, by name. `allocated` is set after a rebuild: the claims the API server allocated
        here, whose state is kept even where no record names it."""
        return ()


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
