"""KEP-5963 compatibility groups in the allocator, as kube-scheduler 1.37 (DRADeviceCompatibilityGroups, alpha and
off): with the gate, devices drawing from one counter set are allocated together only while their groups intersect
(allocated devices included; a device without groups only with others without); without it a slice that names
groups is ignored and its pool counts as incomplete."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.allocation import allocate
from tests.allocation.objects import (
    GPU_CLASS,
    allocated,
    claim,
    device,
    devices_of,
    exact,
    node,
    reasons,
    resource_slice,
    result,
    run,
)

ON = {"DRADeviceCompatibilityGroups": True}
SET = "gpu-0-counter-set"


def _dev(name: str, *groups: str) -> dict[str, Any]:
    dev = device(name, consumes=[(SET, {"memory": "1"})])
    if groups:
        dev["consumesCounters"][0]["compatibilityGroups"] = list(groups)
    return dev


def _slice(*devices: dict[str, Any]) -> dict[str, Any]:
    # Counters alone would let all of them in (8 of memory, each takes 1): only the groups decide.
    return resource_slice("s", list(devices), counter_sets={SET: {"memory": "8"}})


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        ([_dev("a", "x"), _dev("b", "y")], None),  # no common group
        ([_dev("a", "x"), _dev("b", "x", "y")], ["a", "b"]),
        ([_dev("a", "x"), _dev("b")], None),  # grouped and ungrouped never mix
        ([_dev("a"), _dev("b")], ["a", "b"]),  # no groups at all: as without the feature
        # the running intersection: a∩b = {y}, c has only x
        ([_dev("a", "x", "y"), _dev("b", "y", "z"), _dev("c", "x"), _dev("d", "y")], ["a", "b", "d"]),
    ],
)
def test_devices_of_one_counter_set_share_a_group(devices: list[dict[str, Any]], expected: list[str] | None) -> None:
    count = len(expected) if expected else 2
    outcome = run(claim([exact("gpu", count=count)]), [_slice(*devices)], gates=ON)
    if expected is None:
        assert not outcome.ok
    else:
        assert [d for _, d in devices_of(outcome)] == expected


def test_allocated_devices_count_and_the_explanation_says_why() -> None:
    held = allocated("held", [result("a")])
    outcome = run(claim([exact("gpu")]), [_slice(_dev("a", "vfio"), _dev("b", "native"), _dev("c", "vfio"))],
                  allocated_claims=[held], gates=ON)
    assert devices_of(outcome) == [("gpu", "c")]
    blocked = run(claim([exact("gpu")]), [_slice(_dev("a", "vfio"), _dev("b", "native"))],
                  allocated_claims=[held], gates=ON)
    assert not blocked.ok
    assert any("compatibility groups do not intersect" in r for r in reasons(blocked)), reasons(blocked)


def test_without_the_gate_a_slice_with_groups_is_ignored_and_its_pool_incomplete() -> None:
    """The driver's layout from 1.35: the counter set in one slice, the devices in another; the pool's plain device
    (`c`, in a third slice) is not allocated either: the pool is incomplete."""
    sets = resource_slice("sets", counter_sets={SET: {"memory": "8"}}, count=3)
    grouped = resource_slice("grouped", [_dev("a", "x"), _dev("b", "x")], count=3)
    plain = resource_slice("plain", [device("c")], count=3)
    outcome = run(claim([exact("gpu")]), [sets, grouped, plain])
    assert not outcome.ok
    assert outcome.explanation is not None
    assert any("1 of its 3 slices name KEP-5963 compatibility groups" in p
               for p in outcome.explanation.pool_problems), outcome.explanation
    assert devices_of(run(claim([exact("gpu")]), [sets, grouped, plain], gates=ON)) == [("gpu", "a")]


def test_the_same_slice_without_groups_is_allocated_with_the_gate_off() -> None:
    outcome = allocate(claim([exact("gpu")]), node=node(), classes=[GPU_CLASS], slices=[_slice(_dev("a"))])
    assert devices_of(outcome) == [("gpu", "a")]
