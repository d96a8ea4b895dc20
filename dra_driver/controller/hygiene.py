"""Slice hygiene: the driver's ResourceSlices whose `spec.nodeName` names a Node that no longer exists are
deleted once that Node has been missing for a grace period.

Slices the kubelet plugin publishes carry an ownerReference to their Node and go with it (garbage collector);
this covers the ones without (an older plugin, a plugin that could not read its Node, slices written by
hand). Only slices of this driver (`spec.driver`) are ever touched; before deleting, the Node's absence is
confirmed with a GET (the watch-fed view may lag), and each DELETE carries the slice's uid as a precondition
so a slice re-created under the same name in the meantime is left alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from dra_driver.controller.clusterview import ClusterView
from dra_driver.k8s.client import ApiError, KubeRest

log = logging.getLogger(__name__)

HYGIENE_SLICES = "/apis/resource.k8s.io/v1/resourceslices"
HYGIENE_NODES = "/api/v1/nodes"


class Janitor:
    def __init__(
        self,
        view: ClusterView,
        rest: KubeRest,
        *,
        grace_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        on_deleted: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.view = view
        self.rest = rest
        self.grace_seconds = grace_seconds
        self.clock = clock
        self._missing_since: dict[str, float] = {}
        self.deleted: list[str] = []  # names of the slices deleted so far (for logs and tests)
        self.on_deleted = on_deleted  # called after each sweep that deleted some (metrics)

    def sweep(self) -> list[str]:
        """One pass; returns the names of the slices deleted."""
        if not self.view.synced:
            return []  # until the Nodes' and slices' first LISTs are in, a slice's Node may just not be seen yet
        now = self.clock()
        nodes = self.view.nodes()
        by_node = self.view.slices_by_node()
        missing = {n for n in by_node if n not in nodes}
        self._missing_since = {n: self._missing_since.get(n, now) for n in missing}
        deleted: list[str] = []
        for node, since in sorted(self._missing_since.items()):
            if now - since < self.grace_seconds:
                continue
            try:
                if self.rest.get(f"{HYGIENE_NODES}/{node}") is not None:
                    del self._missing_since[node]  # the view lags; the Node is there
                    continue
            except ApiError as exc:
                log.warning("slice hygiene: cannot check Node %s: %s", node, exc)
                continue
            for name, uid in by_node[node]:
                try:
                    self.rest.request(
                        "DELETE",
                        f"{HYGIENE_SLICES}/{name}",
                        body={"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}},
                    )
                except ApiError as exc:
                    if exc.status not in (404, 409):
                        log.warning("slice hygiene: cannot delete ResourceSlice %s: %s", name, exc)
                    continue
                log.info(
                    "slice hygiene: deleted ResourceSlice %s of missing Node %s (missing > %ss)",
                    name,
                    node,
                    self.grace_seconds,
                )
                deleted.append(name)
        self.deleted += deleted
        if deleted and self.on_deleted is not None:
            self.on_deleted(deleted)
        return deleted

    async def run(self) -> None:
        """Sweep forever (until cancelled), a few times per grace period (at least every 30 s)."""
        period = max(0.05, min(self.grace_seconds / 4, 30.0))
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(period)
            try:
                await loop.run_in_executor(None, self.sweep)
            except Exception:
                log.exception("slice hygiene: sweep failed")
