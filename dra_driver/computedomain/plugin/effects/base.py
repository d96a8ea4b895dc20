"""The compute-domain effects' protocol, in the GPU driver's vocabulary (dra_driver/plugin/effects/base.py), for
records of this plugin's own checkpoint. The engine (engine.py) reads and writes the checkpoint, once per step;
an effect acts on the node and the API only.

    plan          fill in this kind's part of the claim's record before anything is touched
    refuse        refuse what no retry can fix (PermanentError) or what clashes with other records
    changes_node  whether `apply` changes anything outside the checkpoint and the CDI spec (then PrepareStarted
                  is made durable first, so a crash can be rolled back)
    holds         whether a record names something of this kind that `undo` must remove
    apply         make the node as planned (idempotent: a retry of a PrepareStarted claim applies again)
    ready         what keeps the claim from being usable yet ("": nothing); a retryable condition (IMEX readiness)
    undo          remove what the record names; idempotent (a crash repeats it)
    edits         the CDI container edits of one prepared device
    verify        what no longer matches the record of a prepared claim
    repair        make again what `verify` found wrong
    sweep         with ownership known: remove what no live record owns
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
    DomainDevice,
    DomainDeviceKind,
    domain_of,
    holds,
)
from dra_driver.computedomain.plugin.domains import DomainReader, NodeLabels
from dra_driver.computedomain.plugin.faults import CdFaultPoints
from dra_driver.computedomain.plugin.hostdevices import HostDevices
from dra_driver.errors import DraDriverError
from dra_driver.kubeletplugin.driver import ClaimRef


class PermanentError(DraDriverError):
    """A claim this node can never prepare as it is (a retry gives the same answer)."""


@dataclass(frozen=True)
class ClaimPlan:
    ref: ClaimRef
    domain: ComputeDomain
    config: DomainConfig
    results: tuple[Mapping[str, Any], ...]  # our allocation results (driver and pool ours)
    clique_id: str  # this node's clique ("" when it has none)
    binding_conditions: bool  # the channel's result carries our binding conditions: the scheduler waited
    record: ClaimRecord  # as planned (what PrepareStarted records)


@dataclass(frozen=True)
class NodeTools:
    node_name: str
    state_dir: Path  # <state>/domains/<uid>/ are the daemons' config directories
    host: HostDevices
    labels: NodeLabels
    domains: DomainReader
    faults: CdFaultPoints


class Effect:
    kind: DomainDeviceKind

    def __init__(self, tools: NodeTools) -> None:
        self.tools = tools

    def devices(self, record: ClaimRecord) -> list[DomainDevice]:
        return [d for d in record.devices if d.kind is self.kind]

    def holds(self, record: ClaimRecord) -> bool:
        return record.live and holds(record, self.kind)  # an aborted record holds nothing (its undo may be repeated)

    def plan(self, claim: ClaimPlan) -> ClaimPlan:
        return claim

    def refuse(self, claim: ClaimPlan, checkpoint: Checkpoint) -> None:
        return None

    def changes_node(self, claim: ClaimPlan) -> bool:
        return False

    def apply(self, claim: ClaimPlan, checkpoint: Checkpoint) -> None:
        return None

    def ready(self, claim: ClaimPlan) -> str:
        return ""

    def undo(self, record: ClaimRecord, checkpoint: Checkpoint) -> None:
        """`checkpoint` still holds `record` (other holders are counted without it)."""
        return None

    def edits(self, record: ClaimRecord, device: DomainDevice) -> ContainerEdits:
        return ContainerEdits()

    def verify(self, record: ClaimRecord) -> list[str]:
        return []

    def repair(self, record: ClaimRecord) -> None:
        return None

    def sweep(self, checkpoint: Checkpoint) -> tuple[str, ...]:
        return ()


def other_holders(checkpoint: Checkpoint, record: ClaimRecord, kind: DomainDeviceKind) -> list[ClaimRecord]:
    """The other live records of the same domain that hold a device of `kind` on this node."""
    uid = domain_of(record).domain_uid
    return [r for r in checkpoint.others(record.uid) if domain_of(r).domain_uid == uid and holds(r, kind)]
