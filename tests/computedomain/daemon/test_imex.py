"""The SIGUSR1 rate limit (NVIDIA #1443: IMEX honours one per 5 s): at most one per interval, a trailing one for
what came in between, and none right after a start."""

from __future__ import annotations

from dra_driver.computedomain.daemon.imex import RELOAD_INTERVAL_S, ReloadLimiter


def test_default_interval_is_above_imexs_five_seconds() -> None:
    assert RELOAD_INTERVAL_S > 5.0


def test_first_reload_goes_at_once_and_later_ones_trail() -> None:
    limiter = ReloadLimiter(5.0)
    assert limiter.request(100.0)
    assert not limiter.request(101.0) and not limiter.request(102.0)  # coalesced into one trailing signal
    assert limiter.next_due() == 105.0
    assert not limiter.due(104.9)
    assert limiter.due(105.0)
    assert not limiter.due(120.0) and limiter.next_due() is None  # nothing pending any more
    assert limiter.request(120.0)  # a quiet interval passed: at once again


def test_a_start_counts_as_a_reload() -> None:
    limiter = ReloadLimiter(5.0, last_sent=50.0)
    assert not limiter.request(51.0)
    assert limiter.due(55.0)
