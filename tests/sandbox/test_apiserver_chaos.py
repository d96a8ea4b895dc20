"""ChaosFaults: random faults and outages of the sandbox API server, seen by a real client."""

from __future__ import annotations

from collections import Counter

import pytest

from dra_driver.k8s.client import ApiError, KubeRest
from dra_sandbox.apiserver import ApiServer, ChaosFaults

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _outcomes(rest: KubeRest, n: int, path: str = SLICES) -> Counter[int | str]:
    seen: Counter[int | str] = Counter()
    for _ in range(n):
        try:
            rest.request("GET", path)
            seen["ok"] += 1
        except ApiError as exc:
            seen[exc.status] += 1
    return seen


def test_random_faults_hit_about_the_given_share_of_matching_requests_only() -> None:
    chaos = ChaosFaults(seed=3)
    with ApiServer(faults=chaos) as srv:
        rest = srv.rest()
        chaos.fail_randomly(0.3, (500, 409), verb="list", resource="resourceslices")
        seen = _outcomes(rest, 200)
        assert 40 <= seen[500] + seen[409] <= 80 and seen[500] and seen[409]
        assert seen["ok"] + seen[500] + seen[409] == 200 == srv.request_log.count(verb="list")
        assert chaos.random_failures == seen[500] + seen[409]
        assert _outcomes(rest, 20, "/api/v1/nodes") == {"ok": 20}  # another resource: untouched
        chaos.clear()
        assert _outcomes(rest, 20) == {"ok": 20}


def test_an_outage_fails_everything_until_it_ends() -> None:
    clock = FakeClock()
    chaos = ChaosFaults(clock=clock)
    with ApiServer(faults=chaos) as srv:
        rest = srv.rest()
        chaos.outage(500, seconds=30)
        assert _outcomes(rest, 3) == {500: 3} and _outcomes(rest, 2, "/api/v1/nodes") == {500: 2}
        clock.now += 29.9
        assert chaos.in_outage() and _outcomes(rest, 1) == {500: 1}
        clock.now += 0.2
        assert not chaos.in_outage() and _outcomes(rest, 3) == {"ok": 3}
        chaos.outage(500)  # open-ended
        clock.now += 1000
        assert _outcomes(rest, 2) == {500: 2}
        chaos.end_outage()
        assert _outcomes(rest, 2) == {"ok": 2}
        assert chaos.outage_failures == 8
        # One-shot faults still come first.
        chaos.inject(verb="list", resource="resourceslices", status=409)
        assert _outcomes(rest, 2) == {409: 1, "ok": 1}


def test_bad_arguments_are_refused() -> None:
    chaos = ChaosFaults()
    with pytest.raises(ValueError, match="probability"):
        chaos.fail_randomly(0.0)
    with pytest.raises(ValueError, match="HTTP error codes"):
        chaos.fail_randomly(0.5, (200,))
    with pytest.raises(ValueError, match="unknown verb"):
        chaos.fail_randomly(0.5, verb="fetch")
    with pytest.raises(ValueError, match="not an HTTP error"):
        chaos.outage(302)
