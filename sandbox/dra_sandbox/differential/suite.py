"""One run of the differential suite: the corpus on the sandbox, then on upstream, and both sides' answers."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from dra_sandbox.upstream.build import ReleaseBinaries

from . import wire
from .corpus import Case, cases, short
from .fleet import SHAPE_NAMES, Fleet
from .scheduling import Run, Verdict
from .targets import SANDBOX_VERSION, SandboxTarget, Target, UpstreamTarget

BATCH: Final = 20  # cases per batch: 80 nodes, so kube-scheduler filters every node (below 100) as the sandbox does
SHORT_PER_CATEGORY: Final = 2


def corpus(mode: str) -> list[Case]:
    every = cases()
    if mode == "full":
        return every
    if mode == "short":
        return short(every, SHORT_PER_CATEGORY)
    raise ValueError(f"mode {mode!r}: short or full")


def _verdicts(target: Target, fleet: Fleet, chosen: Sequence[Case], say: Callable[[str], None]) -> list[Verdict]:
    run = Run(target, fleet, say)
    run.prepare()
    return run.run(chosen, BATCH)


def _side(target: Target, fleet: Fleet, chosen: Sequence[Case], steps: Sequence[wire.Step],
          say: Callable[[str], None]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
    started = time.monotonic()
    category = {c.id: c.category for c in chosen}
    rows = {s.id: s.row or s.id.split(" ")[0] for s in steps}
    outcomes = wire.run(target.rest, steps)
    verdicts = _verdicts(target, fleet, chosen, say)
    sched = [{"case": v.case, "shape": v.shape, "category": category[v.case], "compared": v.compared(),
              "refusals": dict(v.refusals), "events": list(v.events)} for v in verdicts]
    wired = [{**dataclasses.asdict(o), "row": rows[o.id], "compared": o.compared()} for o in outcomes]
    return sched, wired, time.monotonic() - started


def run(mode: str, work_dir: Path, binaries: ReleaseBinaries, say: Callable[[str], None] = lambda _: None
        ) -> dict[str, Any]:
    chosen = corpus(mode)
    fleet = Fleet()
    steps = wire.steps(fleet)
    results: dict[str, Any] = {"scheduling": {}, "wire": {}}
    seconds: dict[str, float] = {}
    sandbox = SandboxTarget()
    try:
        results["scheduling"]["sandbox"], results["wire"]["sandbox"], seconds["sandbox"] = _side(
            sandbox, fleet, chosen, steps, say)
    finally:
        sandbox.close()
    started = time.monotonic()
    upstream = UpstreamTarget(work_dir, binaries, say)
    seconds["upstream start"] = time.monotonic() - started
    try:
        results["scheduling"]["upstream"], results["wire"]["upstream"], seconds["upstream"] = _side(
            upstream, fleet, chosen, steps, say)
    finally:
        upstream.close()
    results["meta"] = {"mode": mode, "upstream": binaries.release.kubernetes, "sandbox": SANDBOX_VERSION,
                       "cases": len(chosen), "shapes": len(SHAPE_NAMES), "pods": len(chosen) * len(SHAPE_NAMES),
                       "steps": len(steps), "seconds": {k: round(v, 1) for k, v in seconds.items()}}
    return results
