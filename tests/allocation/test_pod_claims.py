"""allocate_pod_claims: all claims of one pod in one search, backtracking across claims as upstream's allocator."""

from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver.allocation import PodAllocationOutcome, allocate_pod_claims
from dra_driver.defaults import DRIVER_NAME
from tests.allocation.objects import (
    GPU_CLASS,
    allocated,
    claim,
    device,
    exact,
    node,
    resource_slice,
    result,
    share_ids,
)

A = f'device.attributes["{DRIVER_NAME}"]'
TWO = [device("gpu-0", {"model": "H100", "numa": 0}), device("gpu-1", {"model": "A100", "numa": 1})]


def run_pod(claims: Sequence[Mapping[str, Any]], slices: Sequence[Mapping[str, Any]], *,
            allocated_claims: Sequence[Mapping[str, Any]] = (), max_steps: int = 200_000) -> PodAllocationOutcome:
    return allocate_pod_claims(claims, node=node(), classes=[GPU_CLASS], slices=slices,
                               allocated_claims=allocated_claims, new_share_id=share_ids(), max_steps=max_steps)


def picked(outcome: PodAllocationOutcome) -> list[list[tuple[str, str]]]:
    assert outcome.ok, outcome.failure
    out = []
    for claim_outcome in outcome.outcomes:
        assert claim_outcome.allocation is not None
        out.append([(r["request"], r["device"]) for r in claim_outcome.allocation["devices"]["results"]])
    return out


def test_a_later_claim_moves_an_earlier_claims_device() -> None:
    # claim-a could take either GPU, claim-b only the H100: claim after claim, claim-a takes gpu-0 and claim-b fails;
    # upstream's search moves claim-a to gpu-1.
    claims = [claim([exact("a")], name="claim-a"),
              claim([exact("b", selectors=[f'{A}.model == "H100"'])], name="claim-b")]
    outcome = run_pod(claims, [resource_slice("s", TWO)])
    assert picked(outcome) == [[("a", "gpu-1")], [("b", "gpu-0")]]
    assert [o.claim for o in outcome.outcomes] == ["default/claim-a", "default/claim-b"]


def test_claim_after_claim_is_kept_when_it_works() -> None:
    claims = [claim([exact("a")], name="claim-a"), claim([exact("b")], name="claim-b")]
    assert picked(run_pod(claims, [resource_slice("s", TWO)])) == [[("a", "gpu-0")], [("b", "gpu-1")]]


def test_constraints_stay_with_their_claim() -> None:
    # claim-a's matchAttribute on numa must not bind claim-b's device (a different numa is fine there).
    same_numa = [{"matchAttribute": f"{DRIVER_NAME}/numa"}]
    claims = [claim([exact("a")], name="claim-a", constraints=same_numa), claim([exact("b")], name="claim-b")]
    assert picked(run_pod(claims, [resource_slice("s", TWO)])) == [[("a", "gpu-0")], [("b", "gpu-1")]]


def test_more_claims_than_devices_fail_naming_the_claim_that_does_not_fit() -> None:
    claims = [claim([exact("a")], name="claim-a"), claim([exact("b")], name="claim-b"),
              claim([exact("c")], name="claim-c")]
    outcome = run_pod(claims, [resource_slice("s", TWO)])
    assert not outcome.ok and not outcome.outcomes
    assert outcome.failure is not None and outcome.failure.explanation is not None
    assert outcome.failure.claim == "default/claim-c"
    assert "0 available" in outcome.failure.explanation.summary


def test_results_are_capped_per_claim_not_per_pod() -> None:
    many = [device(f"gpu-{i}") for i in range(40)]
    claims = [claim([exact("a", count=20)], name="claim-a"), claim([exact("b", count=20)], name="claim-b")]
    outcome = run_pod(claims, [resource_slice("s", many)])
    assert [len(devices) for devices in picked(outcome)] == [20, 20]


def test_a_device_another_claim_holds_stays_out_of_the_search() -> None:
    claims = [claim([exact("a")], name="claim-a"),
              claim([exact("b", selectors=[f'{A}.model == "H100"'])], name="claim-b")]
    held = [allocated("other", [result("gpu-0")])]
    outcome = run_pod(claims, [resource_slice("s", TWO)], allocated_claims=held)
    assert outcome.failure is not None and outcome.failure.claim == "default/claim-b"


def test_admin_access_in_one_claim_ignores_the_other_claims_devices() -> None:
    # As with allocated claims: an admin-access request ignores devices in use, and its picks use nothing.
    claims = [claim([exact("a")], name="claim-a"), claim([exact("b", admin=True, count=2)], name="claim-b")]
    outcome = allocate_pod_claims(claims, node=node(), classes=[GPU_CLASS], slices=[resource_slice("s", TWO)],
                                  namespace_labels={"resource.kubernetes.io/admin-access": "true"},
                                  new_share_id=share_ids())
    assert picked(outcome) == [[("a", "gpu-0")], [("b", "gpu-0"), ("b", "gpu-1")]]


def test_the_search_budget_covers_every_claim() -> None:
    # Each claim alone needs few placements; together within (claims x max_steps) the backtracking still succeeds.
    claims = [claim([exact("a")], name="claim-a"),
              claim([exact("b", selectors=[f'{A}.model == "H100"'])], name="claim-b")]
    assert picked(run_pod(claims, [resource_slice("s", TWO)], max_steps=3)) == [[("a", "gpu-1")], [("b", "gpu-0")]]
