"""The differential suite (docs/differential.md): the sandbox's API server and scheduler stand-in against upstream
kube-apiserver and kube-scheduler on the same corpus.

`make test` runs the short corpus (two cases per category, every wire request); `make test-differential` the full
one (`DRA_DIFFERENTIAL=full`) and rewrites the report. Where the upstream binaries are not built here the upstream
test SKIPs with a reason starting UPSTREAM_SKIP_PREFIX, which the session's summary repeats in a banner. A
difference fails the test unless tests/differential/allowlist.yaml lists it with a reason.
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_sandbox.differential import compare, corpus, suite, wire
from dra_sandbox.differential.fleet import SHAPE_NAMES, Fleet
from dra_sandbox.differential.scheduling import Run
from dra_sandbox.differential.targets import SandboxTarget, upstream_binaries
from dra_sandbox.upstream.build import DEFAULT_MINOR, UpstreamUnavailable
from tests.conftest import UPSTREAM_SKIP_PREFIX

MINOR = os.environ.get("DRA_UPSTREAM_K8S", DEFAULT_MINOR)
MODE = os.environ.get("DRA_DIFFERENTIAL", "short")
ALLOW_LIST = Path(__file__).with_name("allowlist.yaml")


def test_the_corpus_is_deterministic_and_covers_every_category() -> None:
    first, second = corpus.cases(), corpus.cases()
    assert first == second
    assert len(first) >= 200
    assert len({c.id for c in first}) == len(first)
    counts = collections.Counter(c.category for c in first)
    assert set(counts) == set(corpus.CATEGORIES)
    assert min(counts.values()) >= 10
    chosen = suite.corpus("short")
    assert {c.category for c in chosen} == set(corpus.CATEGORIES)


def test_the_allow_list_gives_a_reason_for_every_entry(tmp_path: Path) -> None:
    compare.load_allow_list(ALLOW_LIST)
    bad = tmp_path / "allow.yaml"
    bad.write_text("- id: 'wire:x'\n  reason: because\n")
    with pytest.raises(compare.AllowListError, match="reason"):
        compare.load_allow_list(bad)


def test_differences_are_found_field_by_field_and_explained_by_pattern() -> None:
    verdict: dict[str, Any] = {"case": "cel-000", "shape": "l4", "category": "cel",
               "compared": {"created": {"pod": "ok"}, "node": "<node>", "allocations": {}, "message": "", "event": ""}}
    other = {**verdict, "compared": {**verdict["compared"], "node": None, "message": "0/1 nodes are available"}}
    step = {"id": "slice get", "row": "get resourceslices", "compared": "200", "message": ""}
    found = compare.differences({"scheduling": {"sandbox": [verdict], "upstream": [other]},
                                 "wire": {"sandbox": [step], "upstream": [{**step, "compared": "404 NotFound []"}]}})
    assert [d.id for d in found] == ["sched:cel-000@l4:node", "sched:cel-000@l4:message", "wire:slice get"]
    allowed = [compare.Allowed("sched:cel-*@l4:*", "an example reason that is long enough")]
    assert [compare.explain(d, allowed) is not None for d in found] == [True, True, False]
    text = compare.report({"scheduling": {"sandbox": [verdict]}, "wire": {"sandbox": [step]}}, found, allowed)
    assert "| scheduling | cel | 1 | 0 | 1 | 0 |" in text
    assert "| wire | get resourceslices | 1 | 0 | 0 | 1 |" in text
    assert "**NOT EXPLAINED**" in text


@pytest.fixture(scope="module")
def sandbox_run() -> Iterator[tuple[SandboxTarget, Run]]:
    target = SandboxTarget()
    try:
        run = Run(target, Fleet())
        run.prepare()
        yield target, run
    finally:
        target.close()


def test_the_harness_reads_verdicts_off_the_sandbox(sandbox_run: tuple[SandboxTarget, Run]) -> None:
    """The harness itself: a MIG claim binds on the MIG node only, a claim that fits nowhere leaves a FailedScheduling
    Event with the pod's message, a claim the API server refuses is recorded with its field."""
    _, run = sandbox_run
    by_id = {c.id: c for c in corpus.cases()}
    chosen = [by_id["counters-000"], by_id["fits-nowhere-000"], by_id["cel-042"]]
    verdicts = {v.key: v for v in run.run(chosen, batch_size=len(chosen))}
    assert len(verdicts) == len(chosen) * len(SHAPE_NAMES)
    mig = verdicts["counters-000@h100"]
    assert mig.node == "<node>"
    [result] = mig.allocations["mig"]["devices"]["results"]
    assert result["pool"] == "<node>" and "-mig-1g10gb-" in result["device"]
    assert verdicts["counters-000@l4"].node is None
    nowhere = verdicts["fits-nowhere-000@h100"]
    assert nowhere.node is None and "cannot allocate all claims" in nowhere.message
    assert nowhere.events and nowhere.events[-1] == nowhere.message
    refused = verdicts["cel-042@l4"]
    assert refused.created["gpu"] == "422 Invalid ['spec.devices.requests[0].exactly.selectors[0].cel.expression']"
    # Its pod waits without a verdict, as kube-scheduler's DynamicResources PreEnqueue holds it: no condition, no Event.
    assert refused.created["pod"] == "ok" and refused.node is None
    assert refused.message == "" and refused.events == ()


def _binaries() -> object:
    try:
        found = upstream_binaries(MINOR)
    except UpstreamUnavailable as exc:
        pytest.skip(f"{UPSTREAM_SKIP_PREFIX} {exc}")
    if found is None:
        pytest.skip(f"{UPSTREAM_SKIP_PREFIX} Kubernetes {MINOR} is not built here: run `make upstream K8S={MINOR}` "
                    "(make test does); the differential suite did not run")
    return found


@pytest.mark.upstream  # it runs kube-apiserver and kube-scheduler: make test's second phase, beside tests/upstream
@pytest.mark.xdist_group("upstream")  # one control plane at a time on the 2-core machines
def test_the_sandbox_answers_as_upstream_does(tmp_path: Path) -> None:
    binaries = _binaries()
    allowed = compare.load_allow_list(ALLOW_LIST)
    results = suite.run(MODE, tmp_path / "upstream", binaries)  # type: ignore[arg-type]
    (tmp_path / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True))
    assert len(results["wire"]["upstream"]) == len(wire.steps(Fleet()))
    found = compare.differences(results)
    unexplained = [d for d in found if compare.explain(d, allowed) is None]
    assert not unexplained, "differences not in tests/differential/allowlist.yaml:\n" + "\n".join(
        f"{d.id}\n  sandbox:  {d.sandbox}\n  upstream: {d.upstream}" for d in unexplained)
