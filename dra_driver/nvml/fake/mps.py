"""MPS control daemons of a fake node, kept in the fake's state (file): they outlive a plugin restart the way
`nvidia-cuda-mps-control -d` processes outlive theirs, and tests and `dra-driver inventory` read them back.

A daemon "runs" while its entry exists. Like the real one it needs its pipe directory: starting a daemon whose
directory is missing fails, and a daemon whose directory was removed under it counts as not running.
"""

from __future__ import annotations

import os
from dataclasses import replace

from dra_driver.nvml.fake.state import FakeNodeState, MpsDaemonState
from dra_driver.nvml.fake.store import StateStore
from dra_driver.nvml.mps import MpsDaemonSpec, MpsDaemonStatus, MpsError


class FakeMpsControl:
    """`MpsControl` over a fake node's state store."""

    def __init__(self, store: StateStore) -> None:
        self._store = store

    def start(self, spec: MpsDaemonSpec) -> None:
        if not os.path.isdir(spec.pipe_directory):
            raise MpsError(f"MPS daemon {spec.id}: pipe directory {spec.pipe_directory} does not exist")
        daemon = MpsDaemonState.of(spec)

        def change(state: FakeNodeState) -> tuple[FakeNodeState, None]:
            others = tuple(d for d in state.mps_daemons if d.id != spec.id)
            return replace(state, mps_daemons=tuple(sorted((*others, daemon), key=lambda d: d.id))), None

        self._store.update(change)

    def status(self, spec: MpsDaemonSpec) -> MpsDaemonStatus:
        daemon = self.daemon(spec.id)
        if daemon is None:
            return MpsDaemonStatus(spec.id, running=False, detail="no such daemon")
        if not os.path.isdir(daemon.pipe_directory):
            return MpsDaemonStatus(spec.id, running=False, detail=f"pipe directory {daemon.pipe_directory} is gone")
        return MpsDaemonStatus(
            spec.id,
            running=True,
            active_thread_percentage=daemon.active_thread_percentage,
            pinned_memory_limits=dict(daemon.pinned_memory_limits),
        )

    def stop(self, spec: MpsDaemonSpec) -> None:
        def change(state: FakeNodeState) -> tuple[FakeNodeState, None]:
            return replace(state, mps_daemons=tuple(d for d in state.mps_daemons if d.id != spec.id)), None

        self._store.update(change)

    # --- for inventory and tests -----------------------------------------------------------------

    def daemon(self, daemon_id: str) -> MpsDaemonState | None:
        return next((d for d in self._store.snapshot().mps_daemons if d.id == daemon_id), None)

    def daemons(self) -> tuple[MpsDaemonState, ...]:
        return self._store.snapshot().mps_daemons
