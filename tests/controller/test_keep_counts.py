"""keep_counts, the per-policy counter behind status.devices/nodes/claims, without kopf: a real ClusterView fed
with slice events, a policy body that plays kopf's live body, and a recording writer."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.controller.clusterview import ClusterView
from dra_driver.controller.operator import keep_counts
from tests.controller.test_controller_sandbox import policy
from tests.controller.test_status_and_hygiene import H100, gpu, resource_slice

DRIVER = "gpu.dra.dev"
TIMEOUT = 20.0


class Stopped:
    """kopf's `stopped` of an async daemon."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def __bool__(self) -> bool:
        return self.event.is_set()

    async def wait(self, timeout: float | None = None) -> Stopped:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.event.wait(), timeout)
        return self


def _slice(node: str, uid: str, count: int) -> dict[str, Any]:
    obj = resource_slice(node, [gpu(i, H100) for i in range(count)])
    obj["metadata"].update(uid=uid, resourceVersion="1")
    return obj


def test_a_change_after_a_quiet_spell_is_written_at_once_and_a_burst_once() -> None:
    """With a long interval (an hour), the first counts and the counts after a burst of slice events come
    within the settle time, each as one patch holding only the fields that differ."""

    async def scenario() -> tuple[list[dict[str, Any]], int]:
        view = ClusterView(DRIVER, DraCelEnvironment(), feeds=())  # no feeds to wait for: synced
        body = policy("p", {"devices": {"type": "gpu", "productNames": [H100]}})
        body["metadata"].update(uid="uid-p", generation=1)
        writes: list[dict[str, Any]] = []
        written = asyncio.Event()

        def write(changes: dict[str, Any]) -> None:
            writes.append(changes)
            body["status"] = {**body.get("status", {}), **changes}  # the watch brings our patch back
            loop.call_soon_threadsafe(written.set)

        loop = asyncio.get_running_loop()
        for node, uid in (("n1", "u1"), ("n2", "u2")):  # a burst of events before the first count
            view.on_slice("ADDED", _slice(node, uid, 2))
        stopped = Stopped()
        task = asyncio.create_task(keep_counts(body, view, write, driver=DRIVER, interval=3600.0, stopped=stopped))
        await asyncio.wait_for(written.wait(), TIMEOUT)
        stopped.event.set()
        await asyncio.wait_for(task, TIMEOUT)
        return writes, len(view._listeners)

    writes, listeners = asyncio.run(scenario())
    assert writes == [{"devices": 4, "nodes": 2, "claims": 0}]
    assert listeners == 0  # unsubscribed on the way out
