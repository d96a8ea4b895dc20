"""The publisher's pure planning: which generation, which writes. The generation moves only with the content."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.slices.publisher import Attempt, content_key, plan_publish, target_generation


def slice_(devices: list[str], generation: int, *, name: str = "", count: int = 2) -> dict[str, Any]:
    return {
        "metadata": {"name": name or f"s-{'-'.join(devices)}-{generation}"},
        "spec": {
            "driver": DRIVER_NAME,
            "nodeName": "n",
            "pool": {"name": "n", "generation": generation, "resourceSliceCount": count},
            "devices": [{"name": d} for d in devices],
        },
    }


A, B, C = ["gpu-0"], ["gpu-1"], ["gpu-2"]
WANT = [slice_(A, 0), slice_(B, 0)]  # desired: {A, B}; the generation in desired slices is irrelevant
KEYS = frozenset(content_key(s) for s in WANT)
OLD_KEYS = frozenset(content_key(s) for s in (slice_(A, 0), slice_(C, 0)))


@pytest.mark.parametrize(
    ("existing", "last", "expected", "why"),
    [
        ([], None, 1, "first publish"),
        ([], Attempt(4, KEYS), 4, "wiped, same content: same generation"),
        ([], Attempt(4, OLD_KEYS), 5, "wiped, other content"),
        ([slice_(A, 3), slice_(B, 3)], None, 3, "restart at steady state"),
        ([slice_(A, 3), slice_(B, 3)], Attempt(3, KEYS), 3, "steady state"),
        ([slice_(A, 3)], None, 3, "restart after a pass stopped half-way: complete it"),
        ([slice_(A, 3), slice_(C, 2)], None, 3, "half-way, with the old generation's leftovers"),
        ([slice_(A, 3), slice_(C, 3)], None, 4, "restart, content changed"),
        ([slice_(A, 3), slice_(C, 3)], Attempt(3, KEYS), 3, "foreign edit of our generation: repair in place"),
        ([slice_(A, 3), slice_(A, 3, name="dup")], Attempt(3, KEYS), 3, "a duplicate of ours: repair in place"),
        ([slice_(A, 3), slice_(A, 3, name="dup")], None, 4, "duplicates, no memory: new generation"),
        ([slice_(A, 3), slice_(C, 3)], Attempt(3, OLD_KEYS), 4, "content changed"),
        ([slice_(A, 3)], Attempt(3, OLD_KEYS), 4, "content changed, even if what is left would fit"),
        ([slice_(A, 3), slice_(C, 3)], Attempt(4, KEYS), 4, "generation 4 was rolled back: reuse it"),
        ([slice_(A, 3), slice_(C, 3)], Attempt(4, frozenset({"x"})), 5, "rolled back, then changed again"),
        ([slice_(A, 4), slice_(A, 3), slice_(C, 3)], Attempt(4, KEYS), 4, "rollback failed: complete 4"),
        ([slice_(C, 9)], None, 10, "a stray slice of a higher generation"),
    ],
)
def test_target_generation(existing: list[dict[str, Any]], last: Attempt | None, expected: int, why: str) -> None:
    assert target_generation(existing, KEYS, last) == expected, why


def test_a_new_generation_leaves_the_newest_one_untouched_until_complete() -> None:
    old = [slice_(A, 3, count=2), slice_(C, 3, count=2), slice_(B, 1, name="ancient")]
    plan = plan_publish(old, WANT, Attempt(3, OLD_KEYS))
    assert (plan.generation, plan.new_generation) == (4, True)
    # Only the obsolete generation-1 slice may be overwritten; the generation-3 slices are deleted afterwards.
    assert [w.reuse["metadata"]["name"] if w.reuse else None for w in plan.writes] == [None, "ancient"]
    assert [s["metadata"]["name"] for s in plan.deletes] == [old[0]["metadata"]["name"], old[1]["metadata"]["name"]]
    assert all(w.body["spec"]["pool"]["generation"] == 4 and "name" not in w.body["metadata"] for w in plan.writes)


def test_drift_is_repaired_in_place_at_the_same_generation() -> None:
    edited = slice_(["gpu-1", "gpu-9"], 3, name="edited")
    plan = plan_publish([slice_(A, 3), edited], WANT, Attempt(3, KEYS))
    assert (plan.generation, plan.new_generation, plan.deletes) == (3, False, ())
    [write] = plan.writes
    assert write.reuse is edited and write.body["spec"]["devices"] == [{"name": "gpu-1"}]


def test_nothing_to_do_at_steady_state() -> None:
    plan = plan_publish([slice_(B, 5), slice_(A, 5)], WANT, None)
    assert (plan.generation, plan.writes, plan.deletes) == (5, (), ())


def test_content_key_ignores_name_generation_and_taint_times() -> None:
    one = slice_(A, 1, name="x")
    two = slice_(A, 7, name="y")
    one["spec"]["devices"][0]["taints"] = [{"key": "k", "effect": "NoSchedule", "timeAdded": "2026-01-01T00:00:00Z"}]
    two["spec"]["devices"][0]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    assert content_key(one) == content_key(two)
    two["spec"]["devices"][0]["taints"][0]["effect"] = "NoExecute"
    assert content_key(one) != content_key(two)
    assert one["spec"]["pool"]["generation"] == 1 and "timeAdded" in one["spec"]["devices"][0]["taints"][0]


def test_an_annotation_of_ours_is_content() -> None:
    """The device plugin's annotation (deviceplugin/published.py) says why a GPU is missing: a change of it alone is
    published, as a new generation with the same devices."""
    one, two = slice_(A, 1), slice_(A, 1)
    two["metadata"]["annotations"] = {"gpu.dra.dev/device-plugin": '{"gpus":[],"version":1}'}
    assert content_key(one) != content_key(two)
    plan = plan_publish([one], [two], Attempt(1, frozenset({content_key(one)})))
    assert plan.generation == 2 and len(plan.writes) == 1
