"""dra_sandbox.loopthread.LoopThread: a component's one loop thread, stopped by its event."""

from __future__ import annotations

import threading

from dra_sandbox.loopthread import LoopThread


def test_stop_ends_the_loop_and_waits_for_it() -> None:
    passes: list[int] = []
    started = threading.Event()
    worker: LoopThread

    def loop() -> None:
        started.set()
        while not worker.stopping.wait(0.01):
            passes.append(1)
        passes.append(0)  # the loop saw the event and returned

    worker = LoopThread(loop, "test-loop")
    worker.start()
    assert started.wait(5)
    worker.stop()
    assert passes[-1] == 0  # stop() returned after the loop ended, not before
    assert worker.stopping.is_set()


def test_stop_before_start_returns_at_once() -> None:
    worker = LoopThread(lambda: None, "never-started", join_timeout_s=30.0)
    worker.stop()
    assert worker.stopping.is_set()
