"""Shared counters (partitionable devices) with a MIG-like layout: one counter set per GPU with
memory-slice-0..7, and 1g (1 slice), 2g (2), 3g (4) and 7g/full (all 8) placements."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_driver.defaults import DRIVER_NAME
from tests.allocation.objects import (
    allocated,
    claim,
    device,
    devices_of,
    exact,
    reasons,
    resource_slice,
    result,
    run,
)

PROFILES = {"1g": 1, "2g": 2, "3g": 4, "7g": 8}
# Placements (start slice) as NVIDIA publishes them for a 7-slice-compute / 8-memory-slice GPU.
STARTS = {"1g": range(7), "2g": (0, 2, 4), "3g": (0, 4), "7g": (0,)}


def counter_set(gpu: int) -> str:
    return f"gpu-{gpu}-counter-set"


def mig_devices(gpu: int = 0) -> list[dict[str, Any]]:
    devs = []
    for profile, size in PROFILES.items():
        for start in STARTS[profile]:
            slices = {f"memory-slice-{i}": "1" for i in range(start, start + size)}
            devs.append(
                device(
                    f"gpu-{gpu}-{profile}-{start}",
                    {"profile": profile, "parentIndex": gpu},
                    {"memory": f"{10 * size}Gi"},
                    consumes=[(counter_set(gpu), {**slices, "memory": f"{10 * size}Gi"})],
                )
            )
    return devs


def counters(gpu: int = 0) -> dict[str, dict[str, str]]:
    return {counter_set(gpu): {**{f"memory-slice-{i}": "1" for i in range(8)}, "memory": "80Gi"}}


def mig_slices(gpus: int = 1) -> list[dict[str, Any]]:
    """1.35 split layout: counter sets in their own slice, devices in another, one pool."""
    devs = [d for g in range(gpus) for d in mig_devices(g)]
    sets = {k: v for g in range(gpus) for k, v in counters(g).items()}
    return [
        resource_slice("node-1-counters", counter_sets=sets, count=2),
        resource_slice("node-1-devices", devs, count=2),
    ]


def profile(p: str) -> str:
    return f'device.attributes["{DRIVER_NAME}"].profile == "{p}"'


def mig(name: str, p: str, count: int = 1) -> dict[str, Any]:
    return exact(name, selectors=[profile(p)], count=count)


def holding(*devices: str) -> list[dict[str, Any]]:
    return [allocated(f"holder-{i}", [result(d)], namespace="team-a") for i, d in enumerate(devices)]


def test_full_gpu_is_excluded_by_any_partition() -> None:
    outcome = run(claim([mig("gpu", "7g")]), mig_slices(), allocated_claims=holding("gpu-0-1g-3"))
    assert not outcome.ok
    assert reasons(outcome, "gpu") == {
        "counter 'memory-slice-3' of counter set 'gpu-0-counter-set' exhausted": 1,
        "allocated to claim team-a/holder-0": 1,
        "request 'gpu' selector #0 is false: " + profile("7g"): 11,
    }
    assert devices_of(run(claim([mig("gpu", "7g")]), mig_slices())) == [("gpu", "gpu-0-7g-0")]


def test_full_gpu_excludes_every_partition() -> None:
    outcome = run(claim([mig("gpu", "1g")]), mig_slices(), allocated_claims=holding("gpu-0-7g-0"))
    assert not outcome.ok
    assert outcome.explanation is not None
    assert outcome.explanation.requests[0].available == 0


def test_overlapping_placements_are_never_both_allocated() -> None:
    # 3g-0 holds slices 0-3, so the only 2g placement left is 2g-4.
    assert devices_of(run(claim([mig("gpu", "2g")]), mig_slices(), allocated_claims=holding("gpu-0-3g-0"))) == [
        ("gpu", "gpu-0-2g-4")
    ]
    # within one claim: 1g takes slice 0, so the 2g must avoid 2g-0
    assert devices_of(run(claim([mig("a", "1g"), mig("b", "2g")]), mig_slices())) == [
        ("a", "gpu-0-1g-0"),
        ("b", "gpu-0-2g-2"),
    ]


def test_two_3g_fit_three_do_not() -> None:
    assert devices_of(run(claim([mig("gpu", "3g", 2)]), mig_slices())) == [("gpu", "gpu-0-3g-0"), ("gpu", "gpu-0-3g-4")]
    outcome = run(claim([mig("gpu", "3g", 3)]), mig_slices())
    assert outcome.explanation is not None
    assert outcome.explanation.summary == "request 'gpu' cannot be satisfied: needs 3 devices, 2 available"


def test_full_and_partition_in_one_claim_compete() -> None:
    outcome = run(claim([mig("full", "7g"), mig("part", "1g")]), mig_slices())
    assert outcome.explanation is not None
    assert outcome.explanation.summary.startswith("each request can be satisfied on its own, but not all together")


def test_counters_of_shared_counter_slice_must_be_published() -> None:
    only_devices = [mig_slices()[1]]
    outcome = run(claim([mig("gpu", "1g")]), only_devices)
    assert outcome.explanation is not None
    assert outcome.explanation.pool_problems == (
        "pool gpu.dra.dev/pool-1 is incomplete: 1 of 2 slices published at generation 1; "
        "the driver is still updating it",
    )


def test_missing_counter_set_makes_the_pool_invalid() -> None:
    devs = mig_devices(0)
    outcome = run(claim([mig("gpu", "1g")]), [resource_slice("s", devs)])
    assert outcome.explanation is not None
    assert outcome.explanation.pool_problems == (
        "pool gpu.dra.dev/pool-1 is invalid: device 'gpu-0-1g-0' consumes from counter set 'gpu-0-counter-set', "
        "which the pool does not define",
    )


def test_partitionable_gate_off_blocks_counter_devices() -> None:
    outcome = run(claim([mig("gpu", "1g")]), mig_slices(), gates={"DRAPartitionableDevices": False})
    assert reasons(outcome, "gpu")["consumes shared counters but DRAPartitionableDevices is disabled"] == 7


def test_single_slice_layout_with_counters_in_the_device_slice() -> None:
    combined = resource_slice("s", mig_devices(0), counter_sets=counters(0))
    assert devices_of(run(claim([mig("gpu", "3g")]), [combined])) == [("gpu", "gpu-0-3g-0")]


def test_quantity_counters_use_exact_arithmetic() -> None:
    # memory counter 80Gi; a 7g device asks for 80Gi expressed in bytes
    devs = [device("big", consumes=[("set", {"memory": "85899345920"})])]
    sl = resource_slice("s", devs, counter_sets={"set": {"memory": "80Gi"}})
    assert devices_of(run(claim([exact("gpu")]), [sl])) == [("gpu", "big")]
    over = [device("big", consumes=[("set", {"memory": "85899345921"})])]
    sl2 = resource_slice("s", over, counter_sets={"set": {"memory": "80Gi"}})
    assert reasons(run(claim([exact("gpu")]), [sl2])) == {"counter 'memory' of counter set 'set' exhausted": 1}


# -- property: no allocation ever exceeds a counter ----------------------------------------------

ALL_DEVICES = {d["name"]: d for g in range(2) for d in mig_devices(g)}
DEVICE_NAMES = sorted(ALL_DEVICES)


def consumption(names: list[str]) -> dict[tuple[str, str], int]:
    used: dict[tuple[str, str], int] = {}
    for name in names:
        for c in ALL_DEVICES[name]["consumesCounters"]:
            for counter, value in c["counters"].items():
                if counter.startswith("memory-slice"):
                    key = (c["counterSet"], counter)
                    used[key] = used.get(key, 0) + int(value["value"])
    return used


def fits(names: list[str]) -> bool:
    return len(set(names)) == len(names) and all(v <= 1 for v in consumption(names).values())


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, list[str], list[tuple[str, int]]]:
    gpus = draw(st.integers(1, 2))
    names = [n for n in DEVICE_NAMES if int(n.split("-")[1]) < gpus]
    pre: list[str] = []
    for name in draw(st.lists(st.sampled_from(names), max_size=4)):
        if fits([*pre, name]):  # pre-existing allocations are themselves consistent
            pre.append(name)
    requests = draw(st.lists(st.tuples(st.sampled_from(sorted(PROFILES)), st.integers(1, 2)), min_size=1, max_size=3))
    return gpus, pre, requests


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_claims_never_exceed_any_counter(scenario: tuple[int, list[str], list[tuple[str, int]]]) -> None:
    gpus, pre, requests = scenario
    claim_obj = claim([mig(f"r{i}", p, n) for i, (p, n) in enumerate(requests)])
    outcome = run(claim_obj, mig_slices(gpus), allocated_claims=holding(*pre))
    if outcome.ok:
        chosen = [dev for _, dev in devices_of(outcome)]
        assert fits([*pre, *chosen]), (pre, chosen)
        # every request got exactly its count, all of the requested profile
        got = devices_of(outcome)
        assert [req for req, _ in got] == [f"r{i}" for i, (_, n) in enumerate(requests) for _ in range(n)]
        for req, dev in got:
            assert ALL_DEVICES[dev]["attributes"]["profile"]["string"] == requests[int(req[1:])][0]
        return
    if gpus == 1 and sum(n for _, n in requests) <= 3:
        # Completeness on small cases: brute force finds no solution either.
        per_request = [
            [
                d
                for d in DEVICE_NAMES
                if d.startswith("gpu-0-") and ALL_DEVICES[d]["attributes"]["profile"]["string"] == p
            ]
            for p, n in requests
            for _ in range(n)
        ]
        for combo in itertools.product(*per_request):
            assert not fits([*pre, *combo]), f"allocator missed a solution: {combo}"
