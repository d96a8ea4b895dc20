"""One prepare pipeline: everything that runs on NodePrepareResources and NodeUnprepareResources, in one order.

    kubelet ─► servicer (services.py: claim identities checked) ─► PreparePipeline
                 guards, in order: each may refuse claims; a refusal is that claim's answer, the engine never sees it
                 the engine: prepares (or unprepares) the claims let through; each prepare answer carries the record
                   the engine wrote or found for its claim (`PrepareResult.record`), so nothing after it reads the
                   checkpoint again
                 observers, in order: each sees every claim's outcome (refused ones too) and may amend an answer
                   (device metadata adds its CDI ids, or fails a claim whose files could not be written)
             ◄─ one answer per claim

A driver registers its guards and observers once, where it is assembled (the GPU plugin: `plugin/pipeline.py`);
that registration is the one place that says what a claim operation does besides the engine. The layer knows no
device: guards and observers are given claim identities, answers and the driver's own records, which they may read
(the GPU driver's do) and the pipeline passes along without reading.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import structlog

from dra_driver.kubeletplugin.driver import ClaimRef, Driver, PrepareResult

log = structlog.get_logger(__name__)
T = TypeVar("T")
A = TypeVar("A")  # an answer: a PrepareResult, or an unprepare's error


@dataclass(frozen=True)
class PrepareOutcome:
    """One claim's answer to a prepare as the observers see it; `refused`: a guard answered, the engine never ran."""

    ref: ClaimRef
    result: PrepareResult
    refused: bool = False


@dataclass(frozen=True)
class UnprepareOutcome:
    """One claim's answer to an unprepare ("" on success); `refused`: a guard answered, the engine never ran."""

    ref: ClaimRef
    error: str
    refused: bool = False


class Guard(Protocol):
    """Runs before the engine. Returns the claims it refuses (UID -> the claim's error, for the kubelet and the
    user); the claims it does not name go on. Never raises for one claim's sake."""

    def refuse_prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]: ...

    def refuse_unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]: ...


class Observer(Protocol):
    """Runs after the engine with every claim's outcome. Returns the answers it changes (UID -> new answer), usually
    none; an observer that raises is logged and changes nothing (a report never fails a claim: one whose job can
    fail a claim, like writing device metadata, turns that failure into the claim's answer itself)."""

    def prepared(self, outcomes: Sequence[PrepareOutcome]) -> Mapping[str, PrepareResult]: ...

    def unprepared(self, outcomes: Sequence[UnprepareOutcome]) -> Mapping[str, str]: ...


Out = TypeVar("Out", PrepareOutcome, UnprepareOutcome)


class PreparePipeline:
    """The `Driver` the kubelet-plugin server calls: guards, then the engine, then observers (module docstring)."""

    def __init__(self, engine: Driver, *, guards: Sequence[Guard] = (), observers: Sequence[Observer] = ()) -> None:
        self.engine = engine
        self.guards = tuple(guards)
        self.observers = tuple(observers)

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        return self._run(
            claims, lambda guard, admitted: guard.refuse_prepare(admitted), self.engine.prepare,
            lambda error: PrepareResult(error=error), PrepareOutcome, lambda observer: observer.prepared,
        )

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        return self._run(
            claims, lambda guard, admitted: guard.refuse_unprepare(admitted), self.engine.unprepare,
            lambda error: error, UnprepareOutcome, lambda observer: observer.unprepared,
        )

    def _run(
        self,
        claims: list[ClaimRef],
        refuse: Callable[[Guard, Sequence[ClaimRef]], Mapping[str, str]],
        engine: Callable[[list[ClaimRef]], Mapping[str, A]],
        refusal: Callable[[str], A],
        outcome: Callable[[ClaimRef, A, bool], Out],
        step: Callable[[Observer], Callable[[Sequence[Out]], Mapping[str, A]]],
    ) -> dict[str, A]:
        """Guards, the engine on the claims they let through, then every observer with every claim's outcome."""
        refused = self._refusals(claims, refuse)
        answers = {uid: refusal(error) for uid, error in refused.items()}
        admitted = [c for c in claims if c.uid not in refused]
        if admitted:
            answers.update(engine(admitted))
        outcomes: list[Out] | None = None  # built again only after an observer changed an answer (rarely)
        for observer in self.observers:
            if outcomes is None:
                outcomes = [outcome(c, answers[c.uid], c.uid in refused) for c in claims if c.uid in answers]
            changed = _observed(step(observer), outcomes)
            if changed:
                answers.update({uid: answer for uid, answer in changed.items() if uid in answers})
                outcomes = None
        return answers

    def _refusals(
        self, claims: Sequence[ClaimRef], ask: Callable[[Guard, Sequence[ClaimRef]], Mapping[str, str]]
    ) -> dict[str, str]:
        """UID -> error of the claims some guard refused (the first refusal stands; later guards see the rest)."""
        refused: dict[str, str] = {}
        for guard in self.guards:
            admitted = [c for c in claims if c.uid not in refused]
            if not admitted:
                break
            wanted = {c.uid for c in admitted}
            refused.update({uid: error for uid, error in ask(guard, admitted).items() if uid in wanted})
        return refused


def _observed(step: Callable[[Sequence[Out]], Mapping[str, T]], outcomes: Sequence[Out]) -> Mapping[str, T]:
    try:
        return step(outcomes)
    except Exception:
        log.exception("a claim observer failed; the answers stand", observer=getattr(step, "__qualname__", repr(step)))
        return {}
