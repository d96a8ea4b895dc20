"""The one effect protocol: what one kind of thing a claim does to a node, from plan to crash recovery, for every
driver on this layer (the GPU driver's MIG partitions, time-slices, MPS daemons, passthroughs and CDI spec; the
ComputeDomain driver's IMEX channel and daemon directory).

An effect is told about a claim at each step of its life and acts only on the devices of its kind. Every step works
on values: the driver's claim plan, the claim record and its device records, and the checkpoint as the engine last
read or wrote it. No effect reads or writes the checkpoint itself; the engine does, and the effect's state on the
node is what the records say.

    plan          fill in this kind's part of the plan before anything is touched; refuse what this node cannot
                  serve (naming the field)
    refuse        refuse a plan that clashes with what other claims' records hold (the last line of defence)
    changes_node  whether `apply` changes anything outside the checkpoint and the CDI spec (then PrepareStarted is
                  made durable first, so a crash can be rolled back)
    holds         whether a record names something of this kind that `undo` must remove
    apply         make the node as planned; returns the device records with what only the node knows (live ids).
                  Something created is named through `created` (a durable write) before anything else can fail
    ready         what keeps the claim from being usable yet ("": nothing; a retryable condition)
    undo          remove what the records name, by full identity only; idempotent (a crash repeats it)
    verify        what no longer matches the records of a prepared claim
    repair        make again what `verify` found wrong; returns the device records as they are afterwards
    adopt         rebuilding a lost checkpoint: the live state of an allocated claim found on the node
    leftovers     whether anything of this kind exists at all (evidence that a missing checkpoint was lost)
    sweep         with ownership known: remove what no record (and no claim allocated here) owns

The base class does nothing at every step, so a kind overrides only the steps where it acts. Its type parameters:
the driver's claim plan P, device record D and claim details X, and N, what the engine read of the node for one
operation (the GPU driver: its device catalog; the ComputeDomain driver: nothing).

What an effect made (`Made`) is a value that knows where it goes in a device record (`record_on`): the engine,
repair and recovery write it into the claim's record by device name without knowing its kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from dra_driver.kubeletplugin.claimrecord import Checkpoint, ClaimRecord, DeviceRecord
from dra_driver.kubeletplugin.claims import AllocatedClaim

P = TypeVar("P")  # a driver's claim plan
D = TypeVar("D", bound=DeviceRecord)
X = TypeVar("X")  # a driver's claim details
N = TypeVar("N")  # what the engine read of the node for one operation


class Made(Protocol[D]):
    """Something an effect made (or is about to change) for one device, e.g. a MIG instance's identity so far."""

    def record_on(self, device: D) -> D:
        """`device`'s record with this in it."""
        ...


# Names what an effect made for a device, by device name, in the claim's record, durably, before returning.
Created = Callable[[str, Made[D]], None]


class Effect(Generic[P, D, X, N]):
    """One kind of effect; see the module docstring for the steps."""

    kind = "none"  # in logs, reports and docs

    def plan(self, claim: P) -> P:
        return claim

    def refuse(self, claim: P, checkpoint: Checkpoint[D, X], node: N) -> None:
        return None

    def changes_node(self, claim: P) -> bool:
        return False

    def holds(self, record: ClaimRecord[D, X]) -> bool:
        return False

    def apply(
        self, claim: P, records: tuple[D, ...], checkpoint: Checkpoint[D, X], created: Created[D]
    ) -> tuple[D, ...]:
        return records

    def ready(self, claim: P) -> str:
        return ""

    def undo(
        self, record: ClaimRecord[D, X], devices: tuple[D, ...], checkpoint: Checkpoint[D, X], *, rollback: bool
    ) -> None:
        """`devices`: what to undo (a PrepareStarted record's allocated devices on a rollback, else its prepared
        ones); `checkpoint` still holds the claim's record (excluded by uid where other holders are counted)."""
        return None

    def verify(
        self, record: ClaimRecord[D, X], devices: tuple[D, ...], checkpoint: Checkpoint[D, X], node: N
    ) -> list[str]:
        return []

    def repair(
        self,
        record: ClaimRecord[D, X],
        devices: tuple[D, ...],
        checkpoint: Checkpoint[D, X],
        node: N,
        created: Created[D],
    ) -> tuple[D, ...]:
        return devices

    def adopt(self, claim: P) -> tuple[P, bool]:
        """The plan with the live state found on the node, and whether anything of this claim was found."""
        return claim, False

    def leftovers(self, node: N) -> bool:
        return False

    def sweep_temp_files(self) -> list[Path]:
        """At startup, with no claim operation running: delete this kind's temp files a crash left mid-write."""
        return []

    def sweep(
        self, checkpoint: Checkpoint[D, X], allocated: Mapping[str, AllocatedClaim] | None, node: N
    ) -> tuple[str, ...]:
        """What was removed, by name. `allocated` is set after a rebuild: the claims the API server allocated
        here, whose state is kept even where no record names it."""
        return ()


def record_made(records: tuple[D, ...], device_name: str, made: Made[D]) -> tuple[D, ...]:
    """`records` with what was made written into the record of `device_name`."""
    return tuple(made.record_on(d) if d.device == device_name else d for d in records)
