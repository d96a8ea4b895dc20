"""What a driver chooses in the layer's one claim state machine (claimstates.py): `ClaimRules`, the keys it locks,
whether a pending prepare is kept and waited for (`Readiness`), whether an unprepare aborts it, how a claim is
planned, recorded and answered; and the engine's waits (`EngineLimits`). The GPU driver's rules:
plugin/engine.py `GpuClaimRules`; the ComputeDomain driver's: computedomain/plugin/engine.py `DomainClaimRules`
(docs/architecture.md "One claim engine").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from dra_driver.errors import DraDriverError
from dra_driver.k8s.client import JsonObject
from dra_driver.kubeletplugin.claimrecord import Checkpoint, ClaimRecord
from dra_driver.kubeletplugin.driver import ClaimRef, PrepareResult
from dra_driver.kubeletplugin.effect import D, Effect, N, P, X


@dataclass(frozen=True)
class Readiness:
    """How long a prepare waits for its effects' `ready` (the node-state lock let go meanwhile)."""

    wait_s: float
    poll_s: float
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


@dataclass(frozen=True)
class EngineLimits:
    operation_timeout: float  # waiting for the node's operation lock (recovery of any instance holds it)
    key_timeout: float  # waiting for the keys another call of this process holds
    max_parallel_claims: int = 1  # the claims of one kubelet call side by side (1: one after the other)


class ClaimRules(Protocol[P, D, X, N]):
    """What a driver chooses in the one state machine. The GPU driver's: plugin/engine.py `GpuClaimRules`; the
    ComputeDomain driver's: computedomain/plugin/engine.py `DomainClaimRules`."""

    fault_prefix: str  # the driver's crash points are named "<prefix>prepare:after-cdi", ...
    planned_in: Literal["devices", "allocated"]  # where a PrepareStarted record keeps its planned devices
    keeps_pending: bool  # a PrepareStarted record of the same allocation is kept across the kubelet's retries
    aborts_pending: bool  # an unprepare of a PrepareStarted claim records PrepareAborted (NVIDIA #1162)
    readiness: Readiness | None  # None: a claim is ready once applied

    def claim_keys(self, ref: ClaimRef) -> Sequence[str]:
        """The keys an operation holds from its start (the ComputeDomain driver: the claim)."""
        ...

    def plan_keys(self, plan: P) -> Sequence[str]:
        """The keys a prepare holds from its plan to its answer (the GPU driver: the plan's GPUs)."""
        ...

    def record_keys(self, record: ClaimRecord[D, X]) -> Sequence[str]:
        """The keys an unprepare or a repair of a recorded claim holds."""
        ...

    def node(self) -> N:
        """What the effects read of the node for one operation."""
        ...

    def plan(self, ref: ClaimRef, claim: JsonObject | None, node: N) -> P | None:
        """The claim's plan, each effect's part filled in; None: nothing of this driver to prepare. Raises
        DraDriverError naming the field."""
        ...

    def refuse(self, plan: P, checkpoint: Checkpoint[D, X], node: N) -> None:
        """Raises when the plan clashes with the other claims' records (run inside the checkpoint write)."""
        ...

    def pending(self, plan: P) -> ClaimRecord[D, X]:
        """The PrepareStarted record of a plan."""
        ...

    def completed(self, plan: P, devices: tuple[D, ...]) -> ClaimRecord[D, X]:
        """The PrepareCompleted record of a plan whose effects made `devices`."""
        ...

    def answer(self, record: ClaimRecord[D, X], plan: P | None) -> PrepareResult:
        """The kubelet's answer for a prepared claim (`plan`: set on the prepare that made it)."""
        ...

    def stale(self, ref: ClaimRef) -> DraDriverError:
        """The refusal of a prepare of an allocation an unprepare aborted."""
        ...

    def unrepairable(self, record: ClaimRecord[D, X], node: N) -> str:
        """Why a damaged claim cannot be made again ("": it can)."""
        ...

    def undone(self, effect: Effect[P, D, X, N]) -> None:
        """Told each device effect undone (a driver's crash points)."""
        ...

    def prepare_error(self, ref: ClaimRef, exc: Exception) -> str:
        """The kubelet's error for a prepare that raised `exc` (logged as the driver says)."""
        ...

    def unprepare_error(self, ref: ClaimRef, exc: Exception) -> str: ...

    def prepared(self, ref: ClaimRef, result: PrepareResult, failure: Exception | None, seconds: float) -> None:
        """One prepare done (`failure`: what it raised): the driver's metrics and log line."""
        ...

    def unprepared(self, ref: ClaimRef, error: str, failure: Exception | None, seconds: float) -> None: ...
