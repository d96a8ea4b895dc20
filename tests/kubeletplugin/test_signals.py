"""kubeletplugin/signals.py: a plugin's stop runs once, and both of its events are set by the first."""

from __future__ import annotations

import threading

from dra_driver.kubeletplugin.signals import begin_stop


def test_the_first_stop_sets_both_events_and_a_second_does_nothing() -> None:
    stopped, requested = threading.Event(), threading.Event()
    assert begin_stop(stopped, requested) is True
    assert stopped.is_set() and requested.is_set()
    assert begin_stop(stopped, requested) is False


def test_a_plugin_already_stopped_is_not_stopped_again() -> None:
    stopped, requested = threading.Event(), threading.Event()
    stopped.set()
    assert begin_stop(stopped, requested) is False
    assert not requested.is_set()
