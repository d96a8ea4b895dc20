"""The crash campaign's one trial loop over both drivers (crashtrials.run_together), on campaigns of the test's own
that record what runs when (no plugin): each campaign runs exactly its trials, interleaved, numbered across the
loop, each followed by its own checks; a stuck campaign stops the loop and is not finished, the others are."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_sandbox.crashtrials import CrashTrials, TrialsReport, run_together
from dra_sandbox.kubelet.draclient import ClaimRef


@dataclass
class Report(TrialsReport):
    def summary(self) -> str:
        return f"{self.trials} trials"


@dataclass
class Claim:
    ref: ClaimRef


class Plugin:
    sockets = None
    log_file = Path("/nonexistent/plugin.log")


class Recording(CrashTrials[Claim, Report]):
    """A campaign whose one operation prepares a claim (or gets stuck at trial `stuck_at`), logging to `events`."""

    def __init__(self, label: str, trials: int, events: list[str], stuck_at: int | None = None) -> None:
        super().__init__(Plugin(), Report(), seed=1, trials=trials, progress=None)  # type: ignore[arg-type]
        self.label, self.events, self.stuck_at = label, events, stuck_at
        self.made = 0

    def operations(self) -> Sequence[tuple[Callable[[], None], int]]:
        return ((self.op_prepare, 1),)

    def op_prepare(self) -> None:
        if self.made == self.stuck_at:
            raise AssertionError("never succeeded")
        self.made += 1
        ref = ClaimRef("default", f"{self.label}-{self.made}", f"uid-{self.label}-{self.made}")
        self.prepared[ref.uid] = Claim(ref)

    def check(self, when: str) -> None:
        self.events.append(f"{self.label} {when}")

    def _unprepare_until_ok(self, claim: Claim) -> None:
        self.events.append(f"{self.label} unprepare {claim.ref.name}")

    def _alive(self) -> bool:
        return True

    def _restart(self, env: dict[str, str] | None = None) -> object:
        return None


def test_one_loop_runs_each_campaign_exactly_its_trials_interleaved() -> None:
    events: list[str] = []
    gpu, cd = Recording("gpu", 30, events), Recording("cd", 10, events)
    run_together([gpu, cd], seed=20261205)
    trials = [e for e in events if "trial" in e]
    assert len(trials) == 40 and gpu.report.trials == 30 and cd.report.trials == 10
    # Numbered across the loop: 0..39, each number once, whichever campaign ran it.
    assert sorted(int(e.split("trial ")[1].split()[0]) for e in trials) == list(range(40))
    order = [e.split()[0] for e in trials]
    assert order != sorted(order) and order != sorted(order, reverse=True)  # interleaved, not one part after the other
    # Each finished: its claims unprepared, then its final check, after the last trial.
    assert events[40:] == [
        *(f"gpu unprepare gpu-{n}" for n in range(1, 31)), "gpu after unprepare of all",
        *(f"cd unprepare cd-{n}" for n in range(1, 11)), "cd after unprepare of all",
    ]  # fmt: skip
    assert gpu.prepared == {} and cd.prepared == {} and not gpu.report.violations and not cd.report.violations


def test_a_stuck_campaign_stops_the_loop_and_the_others_are_finished() -> None:
    events: list[str] = []
    gpu, cd = Recording("gpu", 30, events, stuck_at=3), Recording("cd", 30, events)
    run_together([gpu, cd], seed=7)
    assert len(gpu.report.violations) == 1 and "never succeeded" in gpu.report.violations[0]
    assert gpu.report.trials == 3 and "gpu after unprepare of all" not in events  # left as it is, to be looked at
    assert events[-1] == "cd after unprepare of all" and cd.prepared == {}
    assert cd.report.trials < 30  # the loop stopped at the stuck trial


def test_a_campaign_of_zero_trials_is_only_finished() -> None:
    events: list[str] = []
    run_together([Recording("gpu", 5, events), Recording("cd", 0, events)], seed=1)
    assert [e for e in events if e.startswith("cd")] == ["cd after unprepare of all"]
