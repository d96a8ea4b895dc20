"""The prepare pipeline (kubeletplugin/pipeline.py): guards before the engine, observers after it, in order.

Asserted on what the kubelet gets back and on what each step was handed: a refused claim never reaches the engine
but every observer sees it; an observer's amendment is the answer (and the next observer's input); an observer that
raises changes no answer; the record the engine's answer carries reaches the observers as it was."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dra_driver.kubeletplugin.driver import ClaimRef, DeviceResult, PrepareResult
from dra_driver.kubeletplugin.pipeline import PrepareOutcome, PreparePipeline, UnprepareOutcome

A, B, C = (ClaimRef("default", name, f"uid-{name}") for name in ("a", "b", "c"))
GPU = DeviceResult(request_names=("gpu",), pool="n1", device="gpu-0", cdi_device_ids=("k8s.x/claim=a",))


class Engine:
    """Prepares every claim it is asked for (with a record of its own) and remembers what it was asked."""

    def __init__(self, failing: Mapping[str, str] | None = None) -> None:
        self.prepared: list[str] = []
        self.unprepared: list[str] = []
        self.failing = dict(failing or {})

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        self.prepared += [c.uid for c in claims]
        return {
            c.uid: PrepareResult(error=self.failing[c.uid])
            if c.uid in self.failing
            else PrepareResult(devices=(GPU,), record=("record of", c.uid))
            for c in claims
        }

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        self.unprepared += [c.uid for c in claims]
        return {c.uid: self.failing.get(c.uid, "") for c in claims}


class Refusing:
    """A guard that refuses the claims it names, on both operations."""

    def __init__(self, *uids: str, why: str = "not now") -> None:
        self.uids = set(uids)
        self.why = why
        self.asked: list[list[str]] = []

    def refuse_prepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        self.asked.append([c.uid for c in claims])
        return {c.uid: f"{self.why}: {c.name}" for c in claims if c.uid in self.uids}

    def refuse_unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        return self.refuse_prepare(claims)


class Recording:
    """An observer that records what it saw and optionally amends answers."""

    def __init__(self, amend: Mapping[str, PrepareResult] | None = None, fail_unprepare: str = "") -> None:
        self.seen: list[PrepareOutcome] = []
        self.seen_unprepare: list[UnprepareOutcome] = []
        self.amend = dict(amend or {})
        self.fail_unprepare = fail_unprepare

    def prepared(self, outcomes: Sequence[PrepareOutcome]) -> dict[str, PrepareResult]:
        self.seen = list(outcomes)
        return self.amend

    def unprepared(self, outcomes: Sequence[UnprepareOutcome]) -> dict[str, str]:
        self.seen_unprepare = list(outcomes)
        return {o.ref.uid: self.fail_unprepare for o in outcomes if self.fail_unprepare and not o.error}


class Raising:
    def prepared(self, outcomes: Sequence[PrepareOutcome]) -> dict[str, PrepareResult]:
        raise RuntimeError("observer bug")

    def unprepared(self, outcomes: Sequence[UnprepareOutcome]) -> dict[str, str]:
        raise RuntimeError("observer bug")


def test_a_refused_claim_never_reaches_the_engine_and_every_observer_sees_it() -> None:
    engine, guard, observer = Engine(), Refusing(B.uid), Recording()
    answers = PreparePipeline(engine, guards=[guard], observers=[observer]).prepare([A, B])
    assert engine.prepared == [A.uid]
    assert answers[B.uid] == PrepareResult(error="not now: b")
    assert answers[A.uid].devices == (GPU,) and not answers[A.uid].error
    assert [(o.ref, o.refused) for o in observer.seen] == [(A, False), (B, True)]
    # The engine's record travels to the observers untouched (the pipeline never reads it).
    assert observer.seen[0].result.record == ("record of", A.uid) and observer.seen[1].result.record is None


def test_guards_run_in_order_and_a_later_guard_sees_only_what_the_earlier_let_through() -> None:
    first, second = Refusing(A.uid, why="first"), Refusing(A.uid, B.uid, why="second")
    engine = Engine()
    answers = PreparePipeline(engine, guards=[first, second]).prepare([A, B, C])
    assert second.asked == [[B.uid, C.uid]]
    assert (answers[A.uid].error, answers[B.uid].error) == ("first: a", "second: b")
    assert engine.prepared == [C.uid]


def test_when_every_claim_is_refused_the_engine_is_not_called() -> None:
    engine = Engine()
    answers = PreparePipeline(engine, guards=[Refusing(A.uid)]).prepare([A])
    assert engine.prepared == [] and answers == {A.uid: PrepareResult(error="not now: a")}


def test_an_observer_amendment_is_the_answer_and_the_next_observer_sees_it() -> None:
    amended = PrepareResult(error="device metadata: disk full")
    first, second = Recording(amend={A.uid: amended, "unknown-uid": PrepareResult()}), Recording()
    answers = PreparePipeline(Engine(), observers=[first, second]).prepare([A])
    assert answers == {A.uid: amended}  # a claim that was not asked for is never added
    assert [o.result for o in second.seen] == [amended]


def test_an_observer_that_raises_changes_no_answer_and_the_rest_still_run() -> None:
    after = Recording()
    pipeline = PreparePipeline(Engine(failing={B.uid: "boom"}), observers=[Raising(), after])
    answers = pipeline.prepare([A, B])
    assert answers[A.uid].devices == (GPU,) and answers[B.uid].error == "boom"
    assert [o.ref for o in after.seen] == [A, B]
    assert pipeline.unprepare([A]) == {A.uid: ""}
    assert [o.ref for o in after.seen_unprepare] == [A]


def test_unprepare_runs_the_same_steps() -> None:
    engine, guard = Engine(failing={C.uid: "busy"}), Refusing(B.uid)
    observer, after = Recording(fail_unprepare="metadata: read-only"), Recording()
    answers = PreparePipeline(engine, guards=[guard], observers=[observer, after]).unprepare([A, B, C])
    assert engine.unprepared == [A.uid, C.uid]
    assert answers == {A.uid: "metadata: read-only", B.uid: "not now: b", C.uid: "busy"}
    assert [(o.ref, o.error, o.refused) for o in after.seen_unprepare] == [
        (A, "metadata: read-only", False), (B, "not now: b", True), (C, "busy", False)]  # fmt: skip
