"""Shares of a whole GPU (KEP-5075) as the driver publishes them, through the allocator behind the sandbox
scheduler and `dra-driver explain`: consumed capacity, share IDs, counters charged once, exclusion with the
whole GPU, and the explanation when a share does not fit."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.allocation import AllocationOutcome, allocate
from dra_driver.allocation.explain import explain_text
from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.sharing import sharing_settings
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_sandbox.deviceclasses import device_classes
from tests.allocation.objects import NODE, allocated, claim, device, exact, node, resource_slice, result, run

SHARE_CLASS = f"gpu-share.{DRIVER_NAME}"
GPU0 = f'device.attributes["{DRIVER_NAME}"].index == 0'
CLASSES = device_classes(DRIVER_NAME)


def h100_slices(shared_gpus: str = "0") -> list[dict[str, Any]]:
    """What the kubelet plugin publishes for a fake DGX H100 with `--sharing-mode shares`."""
    backend = open_backend("fake:dgx-h100", driver_root=None)
    backend.init()
    try:
        inventory = discover(backend)
    finally:
        backend.shutdown()
    sharing = sharing_settings("shares", shared_gpus=shared_gpus)
    devices = catalog(inventory, MigOffering.STATIC, sharing)
    return build_slices(inventory.system, devices, SliceSettings(DRIVER_NAME, NODE, sharing=sharing), generation=1)


def share_claim(name: str, memory: str | None = None, **more: str) -> dict[str, Any]:
    requests = {**({"memory": memory} if memory else {}), **more}
    return claim([exact("gpu", SHARE_CLASS, capacity=requests or None)], name=name)


def whole_claim(name: str) -> dict[str, Any]:
    return claim([exact("gpu", DRIVER_NAME, selectors=[GPU0])], name=name)


def allocate_in_turn(claims: list[dict[str, Any]], slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Allocate each claim against the ones before it, as the scheduler does; returns the allocated claims."""
    done: list[dict[str, Any]] = []
    for obj in claims:
        # The allocator's own share IDs (random UUIDs), as the scheduler writes them.
        outcome = allocate(obj, node=node(), classes=CLASSES, slices=slices, allocated_claims=done)
        assert outcome.allocation is not None, outcome.explanation
        done.append({**obj, "status": {"allocation": outcome.allocation}})
    return done


def results(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list(obj["status"]["allocation"]["devices"]["results"])


def explanation_text(outcome: AllocationOutcome) -> str:
    return explain_text(outcome)


@pytest.fixture(scope="module")
def slices() -> list[dict[str, Any]]:
    return h100_slices()


@pytest.fixture(scope="module")
def three_shares(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return allocate_in_turn([share_claim("a", "20Gi"), share_claim("b", "20Gi"), share_claim("c", "30Gi")], slices)


def test_three_shares_land_on_one_gpu_with_their_own_ids_and_amounts(three_shares: list[dict[str, Any]]) -> None:
    got = [results(c) for c in three_shares]
    assert [[(r["device"], r["consumedCapacity"]) for r in rs] for rs in got] == [
        [("gpu-0-shared", {"memory": "20Gi", "compute": "10"})],
        [("gpu-0-shared", {"memory": "20Gi", "compute": "10"})],
        [("gpu-0-shared", {"memory": "30Gi", "compute": "10"})],
    ]
    share_ids = [rs[0]["shareID"] for rs in got]
    assert len(set(share_ids)) == 3


def test_a_share_that_does_not_fit_stays_unallocated_and_says_why(
    slices: list[dict[str, Any]], three_shares: list[dict[str, Any]]
) -> None:
    outcome = run(share_claim("d", "20Gi"), slices, classes=CLASSES, allocated_claims=three_shares)
    assert outcome.allocation is None
    assert outcome.explanation is not None
    [request] = outcome.explanation.requests
    [reason] = [r for r in request.reasons if r.reason == "insufficient capacity 'memory'"]
    assert reason.examples == (
        f"{DRIVER_NAME}/{NODE}/gpu-0-shared (memory 20Gi requested, 70Gi of 81559Mi already consumed by 3 shares)",
    )
    # 9Gi still fits: 70Gi + 9Gi <= 81559Mi
    assert run(share_claim("e", "9Gi"), slices, classes=CLASSES, allocated_claims=three_shares).ok


def test_the_whole_gpu_is_blocked_while_shares_exist(
    slices: list[dict[str, Any]], three_shares: list[dict[str, Any]]
) -> None:
    outcome = run(whole_claim("w"), slices, classes=CLASSES, allocated_claims=three_shares)
    assert outcome.allocation is None
    assert outcome.explanation is not None
    [request] = outcome.explanation.requests
    [reason] = [r for r in request.reasons if r.reason.startswith("counter ")]
    assert reason.count == 1
    assert reason.examples[0].startswith(f"{DRIVER_NAME}/{NODE}/gpu-0 (needs ")
    assert reason.examples[0].endswith("; held by gpu-0-shared (3 shares))")
    # GPU 1 is not shared: it stays available whole.
    other = claim([exact("gpu", DRIVER_NAME, selectors=[f'device.attributes["{DRIVER_NAME}"].index == 1'])])
    assert run(other, slices, classes=CLASSES, allocated_claims=three_shares).ok


def test_shares_are_blocked_while_the_whole_gpu_is_allocated(slices: list[dict[str, Any]]) -> None:
    [whole] = allocate_in_turn([whole_claim("w")], slices)
    assert [r["device"] for r in results(whole)] == ["gpu-0"]
    outcome = run(share_claim("a", "1Gi"), slices, classes=CLASSES, allocated_claims=[whole])
    assert outcome.allocation is None
    assert "held by gpu-0 (claim default/w)" in explanation_text(outcome)


def test_a_claim_asking_nothing_consumes_the_defaults(slices: list[dict[str, Any]]) -> None:
    [only] = allocate_in_turn([share_claim("plain")], slices)
    assert [r["consumedCapacity"] for r in results(only)] == [{"memory": "4Gi", "compute": "10"}]


def test_requests_round_up_to_the_policy(slices: list[dict[str, Any]]) -> None:
    [obj] = allocate_in_turn([share_claim("r", "1500Mi", compute="30")], slices)
    assert [r["consumedCapacity"] for r in results(obj)] == [{"memory": "2Gi", "compute": "30"}]
    [small] = allocate_in_turn([share_claim("s", "1Mi")], slices)
    assert [r["consumedCapacity"]["memory"] for r in results(small)] == ["1Gi"]  # raised to min


@pytest.mark.parametrize(
    ("requests", "reason"),
    [
        ({"compute": "101"}, "capacity 'compute' request policy not satisfiable"),  # above max
        ({"memory": "80Gi"}, "insufficient capacity 'memory'"),  # more than the GPU has
        ({"multiprocessors": "1"}, "device has no capacity 'multiprocessors'"),  # not published on the share
    ],
)
def test_a_share_the_policy_refuses_is_not_allocated(
    slices: list[dict[str, Any]], requests: dict[str, str], reason: str
) -> None:
    outcome = run(claim([exact("gpu", SHARE_CLASS, capacity=requests)]), slices, classes=CLASSES)
    assert outcome.allocation is None
    assert outcome.explanation is not None
    shared = [r.reason for r in outcome.explanation.requests[0].reasons if any("-shared" in e for e in r.examples)]
    assert shared == [reason]


def test_two_shares_in_one_claim_charge_the_counters_once(slices: list[dict[str, Any]]) -> None:
    """The shared device consumes the whole counter set; a second share in the same attempt must not be
    charged again (else it would find the set exhausted)."""
    obj = claim([exact("a", SHARE_CLASS, capacity={"memory": "8Gi"}), exact("b", SHARE_CLASS)], name="two")
    outcome = run(obj, slices, classes=CLASSES)
    assert outcome.allocation is not None, outcome.explanation
    got = outcome.allocation["devices"]["results"]
    assert [(r["request"], r["device"], r["consumedCapacity"]["memory"]) for r in got] == [
        ("a", "gpu-0-shared", "8Gi"),
        ("b", "gpu-0-shared", "4Gi"),
    ]
    assert got[0]["shareID"] != got[1]["shareID"]


# -- policies the driver does not publish, but the allocator must follow as the scheduler does ---------------


def policy_device(policy: dict[str, Any]) -> list[dict[str, Any]]:
    return [resource_slice("s", [device("d", capacity={"memory": {"value": "80Gi", "requestPolicy": policy}},
                                        multi=True)])]


@pytest.mark.parametrize(
    ("policy", "requested", "consumed"),
    [
        ({"default": "4Gi"}, None, "4Gi"),  # a default-only policy: the default
        ({"default": "4Gi"}, "4Gi", "4Gi"),
        ({"default": "4Gi"}, "2Gi", None),  # anything else violates it
        ({"default": "1", "validRange": {"min": "1", "step": "2"}}, "2", "3"),  # min + n*step, rounded up
        ({"default": "1", "validRange": {"min": "1", "max": "4", "step": "2"}}, "4", None),  # 5 > max
        ({"default": "2Gi", "validValues": ["2Gi", "8Gi"]}, "3Gi", "8Gi"),
        ({"default": "2Gi", "validValues": ["2Gi", "8Gi"]}, "9Gi", None),
    ],
)
def test_request_policy_outcomes(policy: dict[str, Any], requested: str | None, consumed: str | None) -> None:
    capacity = {"memory": requested} if requested else None
    outcome = run(claim([exact("gpu", capacity=capacity)]), policy_device(policy))
    if consumed is None:
        assert outcome.allocation is None
        return
    assert outcome.allocation is not None, outcome.explanation
    assert outcome.allocation["devices"]["results"][0]["consumedCapacity"] == {"memory": consumed}


def test_existing_share_skips_the_counter_check() -> None:
    """A device with allocations already holds its counters: more shares are not checked against them."""
    dev = device("d", capacity={"memory": "80Gi"}, consumes=[("set", {"c": "1"})], multi=True)
    slices = [resource_slice("s", [dev], counter_sets={"set": {"c": "1"}})]
    existing = [allocated("x", [result("d", shareID="s-x", consumedCapacity={"memory": "10Gi"})])]
    outcome = run(claim([exact("gpu", capacity={"memory": "10Gi"})]), slices, allocated_claims=existing)
    assert outcome.allocation is not None, outcome.explanation
