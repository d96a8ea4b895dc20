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
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ClaimEffects(Generic[P, D, X, N]):
    """Every effect kind of a driver on this node: its device effects in order (undone in reverse: one kind that
    stands on another goes first), then the claim's CDI spec, which names what they made. The engines, repair and
    recovery step through these; none knows a kind."""

    devices: tuple[Effect[P, D, X, N], ...]
    spec: Effect[P, D, X, N]

    @property
    def all(self) -> tuple[Effect[P, D, X, N], ...]:
        return (*self.devices, self.spec)

    def plan(self, claim: P) -> P:
        for effect in self.all:
            claim = effect.plan(claim)
        return claim

    def refuse(self, claim: P, checkpoint: Checkpoint[D, X], node: N) -> None:
        for effect in self.all:
            effect.refuse(claim, checkpoint, node)

    def changes_node(self, claim: P) -> bool:
        return any(effect.changes_node(claim) for effect in self.devices)

    def holds(self, record: ClaimRecord[D, X]) -> bool:
        """Whether a device effect holds something of the record on the node (beyond its CDI spec)."""
        return any(effect.holds(record) for effect in self.devices)

    def apply_devices(
        self, claim: P, records: tuple[D, ...], checkpoint: Checkpoint[D, X], created: Created[D]
    ) -> tuple[D, ...]:
        for effect in self.devices:
            records = effect.apply(claim, records, checkpoint, created)
        return records

    def ready(self, claim: P) -> str:
        """The first device effect's reason why the claim is not usable yet ("": it is)."""
        for effect in self.devices:
            problem = effect.ready(claim)
            if problem:
                return problem
        return ""

    def undo_devices(
        self,
        record: ClaimRecord[D, X],
        devices: tuple[D, ...],
        checkpoint: Checkpoint[D, X],
        *,
        rollback: bool,
        after: Callable[[Effect[P, D, X, N]], None] | None = None,
    ) -> None:
        """The device effects in reverse order; `after` is told each one done (a driver's crash points)."""
        for effect in reversed(self.devices):
            effect.undo(record, devices, checkpoint, rollback=rollback)
            if after is not None:
                after(effect)

    def damage(self, record: ClaimRecord[D, X], checkpoint: Checkpoint[D, X], node: N) -> list[str]:
        """What no longer matches the record of a completed claim, by every effect kind."""
        return [p for effect in self.all for p in effect.verify(record, record.devices, checkpoint, node)]

    def repair(
        self, record: ClaimRecord[D, X], checkpoint: Checkpoint[D, X], node: N, created: Created[D]
    ) -> tuple[D, ...]:
        """Every kind makes again what it finds wrong, hardware first, the spec last; the devices afterwards."""
        devices = record.devices
        for effect in self.all:
            devices = effect.repair(record, devices, checkpoint, node, created)
        return devices

    def adopt(self, claim: P) -> tuple[P, bool]:
        found = False
        for effect in self.all:
            claim, hit = effect.adopt(claim)
            found = found or hit
        return claim, found

    def leftovers(self, node: N) -> bool:
        return any(effect.leftovers(node) for effect in self.all)

    def sweep_temp_files(self) -> list[Path]:
        return [path for effect in self.all for path in effect.sweep_temp_files()]

    def sweep(
        self, checkpoint: Checkpoint[D, X], allocated: Mapping[str, AllocatedClaim] | None, node: N
    ) -> dict[str, tuple[str, ...]]:
        """With ownership known: what each kind removed because no record owns it, by kind (reverse order: the
        spec first, a daemon before the partition it stands on)."""
        swept: dict[str, tuple[str, ...]] = {}
        for effect in reversed(self.all):
            removed = effect.sweep(checkpoint, allocated, node)
            if removed:
                swept[effect.kind] = removed
        return swept
