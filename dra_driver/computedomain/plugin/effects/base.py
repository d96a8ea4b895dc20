"""The ComputeDomain driver's effect kinds on the one effect protocol (`dra_driver/kubeletplugin/effect.py`, which
says the steps), with this driver's types: its plan (`DomainPlan`), device record and claim details
(`checkpoint.py`); it reads nothing of the node per operation (N is None). The engine (engine.py) reads and writes
the checkpoint, once per step; an effect acts on the node and the API only.

Beyond the protocol, a kind here says the CDI container edits of each prepared device of its kind (`edits`): the
engine joins them into the claim's CDI spec once the claim is ready.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.cdi.model import ContainerEdits
from dra_driver.computedomain.config import DomainConfig
from dra_driver.computedomain.model import ComputeDomain
from dra_driver.computedomain.plugin.checkpoint import (
    Checkpoint,
    ClaimRecord,
    DomainClaim,
    DomainDevice,
    DomainDeviceKind,
    domain_of,
    holds,
)
from dra_driver.computedomain.plugin.domains import DomainReader, NodeLabels
from dra_driver.computedomain.plugin.faults import CdFaultPoints
from dra_driver.computedomain.plugin.hostdevices import HostDevices
from dra_driver.errors import DraDriverError
from dra_driver.kubeletplugin import effect
from dra_driver.kubeletplugin.driver import ClaimRef

Devices = tuple[DomainDevice, ...]


class PermanentError(DraDriverError):
    """A claim this node can never prepare as it is (a retry gives the same answer)."""


@dataclass(frozen=True)
class DomainPlan:
    ref: ClaimRef
    domain: ComputeDomain
    config: DomainConfig
    results: tuple[Mapping[str, Any], ...]  # our allocation results (driver and pool ours)
    clique_id: str  # this node's clique ("" when it has none)
    binding_conditions: bool  # the channel's result carries our binding conditions: the scheduler waited
    record: ClaimRecord  # as planned (what PrepareStarted records)


@dataclass(frozen=True)
class DomainTools:
    node_name: str
    state_dir: Path  # <state>/domains/<uid>/ are the daemons' config directories
    host: HostDevices
    labels: NodeLabels
    domains: DomainReader
    faults: CdFaultPoints


class DomainEffect(effect.Effect[DomainPlan, DomainDevice, DomainClaim, None]):
    device_kind: DomainDeviceKind  # the devices this kind acts on

    def __init__(self, tools: DomainTools) -> None:
        self.tools = tools

    def devices(self, record: ClaimRecord) -> list[DomainDevice]:
        return [d for d in record.devices if d.kind is self.device_kind]

    def covers(self, record: ClaimRecord) -> bool:
        """Whether the record (or plan) has a device of this kind, whatever its state."""
        return holds(record, self.device_kind)

    def holds(self, record: ClaimRecord) -> bool:
        # An aborted record holds nothing (its undo may be repeated).
        return record.live and self.covers(record)

    def changes_node(self, claim: DomainPlan) -> bool:
        # Each device kind acts on the node for a claim with a device of its kind (the spec kind is not asked).
        return self.covers(claim.record)

    def last_holder(self, checkpoint: Checkpoint, record: ClaimRecord) -> bool:
        """Whether `record` has a device of this kind and no other live record of its domain does on this node: what
        the domain's node state of this kind stands on goes with it."""
        return self.covers(record) and not other_holders(checkpoint, record, self.device_kind)

    def edits(self, record: ClaimRecord, device: DomainDevice) -> ContainerEdits:
        return ContainerEdits()


DomainEffects = effect.ClaimEffects[DomainPlan, DomainDevice, DomainClaim, None]


def other_holders(checkpoint: Checkpoint, record: ClaimRecord, kind: DomainDeviceKind) -> list[ClaimRecord]:
    """The other live records of the same domain that hold a device of `kind` on this node."""
    uid = domain_of(record).domain_uid
    return [r for r in checkpoint.others(record.uid) if domain_of(r).domain_uid == uid and holds(r, kind)]
