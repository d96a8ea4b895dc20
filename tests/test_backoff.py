"""The product's one retry pacing (dra_driver/backoff.py) and the shapes the eight retry loops rely on."""

from __future__ import annotations

import random

import pytest

from dra_driver.backoff import Backoff, Retries
from dra_driver.controller.operator import retry_delay
from dra_driver.slices.publisher import RequestRetries


def test_exact_delays_double_up_to_the_cap() -> None:
    policy = Backoff(0.25, 10.0)
    assert [policy.delay(n) for n in range(8)] == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_a_loop_failing_for_days_stays_at_the_cap() -> None:
    assert Backoff(1.0, 30.0).delay(100_000) == 30.0
    assert Backoff(1.0, 30.0, factor=10.0).delay(10_000) == 30.0
    assert Backoff(0.0, 30.0).delay(10_000) == 0.0


def test_jitter_draws_from_the_lower_part_of_the_exact_delay() -> None:
    policy = Backoff(0.2, 5.0, jitter=0.5)
    rng = random.Random(7)
    for failures in range(10):
        exact = min(5.0, 0.2 * 2**failures)
        drawn = policy.delay(failures, rng)
        assert exact / 2 <= drawn < exact
    # The same draw as the hand-written `base * (0.5 + rng.random() / 2)` the loops used before.
    a, b = random.Random(3), random.Random(3)
    assert [policy.delay(n, a) for n in range(6)] == [min(5.0, 0.2 * 2**n) * (0.5 + b.random() / 2) for n in range(6)]


def test_a_jittered_policy_without_a_random_source_is_refused() -> None:
    with pytest.raises(ValueError, match="random source"):
        Backoff(1.0, 2.0, jitter=0.5).delay(0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"initial": -1.0, "cap": 1.0}, "initial"), ({"initial": 1.0, "cap": -1.0}, "cap"),
     ({"initial": 1.0, "cap": 1.0, "factor": 0.5}, "factor"), ({"initial": 1.0, "cap": 1.0, "jitter": 2.0}, "jitter")],
)
def test_bad_settings_name_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=f"backoff {field}"):
        Backoff(**kwargs)


def test_retries_count_failures_and_a_success_resets_them() -> None:
    retries = Retries(Backoff(1.0, 30.0))
    assert [retries.next() for _ in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert retries.failures == 7
    retries.reset()
    assert retries.next() == 1.0


def test_the_callers_keep_their_schedules() -> None:
    # The controller's reconcile retries: 1, 2, 4... s, at most 30 s or the resync interval.
    assert [retry_delay(n, 60.0) for n in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert retry_delay(3, 5.0) == 5.0
    # One slice request: 25, 50, 100, 200, 400 ms, jittered down to half.
    rng = random.Random(1)
    delays = [RequestRetries().delay(n, rng) for n in range(5)]
    assert all(0.025 * 2**n / 2 <= d < 0.025 * 2**n for n, d in enumerate(delays))
