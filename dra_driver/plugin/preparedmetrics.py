"""Prepared claims, devices by type and MPS daemons in the metrics, from a checkpoint the engine just wrote."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping

from dra_driver.observability.metrics import PREPARED_TYPES, PluginMetrics
from dra_driver.plugin.checkpoint import Checkpoint, ClaimRecord, ClaimState, PreparedDevice


class PreparedMetrics:
    """The gauges show the checkpoint last recorded. Kept as counts updated by the records that differ from the
    checkpoint recorded before (records are immutable: an unchanged claim is the same object), so a write costs
    O(records changed) of counting instead of a recount of every prepared claim and device: with 64 claims held,
    each claim's two writes recounted all of them."""

    def __init__(self, metrics: PluginMetrics) -> None:
        self._metrics = metrics
        self._recorded: Mapping[str, ClaimRecord] = {}  # the claims of the checkpoint last put in the metrics
        self._claims = 0
        self._devices = dict.fromkeys(PREPARED_TYPES, 0)
        self._daemons: Counter[str] = Counter()  # MPS daemon -> prepared devices it serves
        self._lock = threading.Lock()

    def record(self, checkpoint: Checkpoint) -> None:
        """The checkpoint is immutable: one already recorded is skipped (concurrent claims often finish on the same
        one)."""
        with self._lock:
            before, after = self._recorded, checkpoint.claims
            if after is before:
                return
            derived = checkpoint.derived_from
            if derived is not None and derived[0] is before:
                # The usual write: made from the checkpoint recorded last, by one claim's record.
                self._one_changed(before.get(derived[1]), after.get(derived[1]))
            else:
                self._each_changed(before, after)
            self._recorded = after
            # Read at once, under the lock (the counts are not copied); `set_prepared` sets only the gauges whose
            # value changed.
            self._metrics.set_prepared(self._claims, self._devices, len(self._daemons))

    def _one_changed(self, old: ClaimRecord | None, new: ClaimRecord | None) -> None:
        if old is not new:
            if old is not None:
                self._count(old, -1)
            if new is not None:
                self._count(new, 1)

    def _each_changed(self, before: Mapping[str, ClaimRecord], after: Mapping[str, ClaimRecord]) -> None:
        """Any two checkpoints: O(claims held)."""
        still = 0  # claims of `before` still in `after`
        for uid, record in after.items():
            old = before.get(uid)
            if old is not None:
                still += 1
            if old is not record:
                if old is not None:
                    self._count(old, -1)
                self._count(record, 1)
        if still < len(before):  # some claims left the checkpoint
            for uid in before.keys() - after.keys():
                self._count(before[uid], -1)

    def _count(self, record: ClaimRecord, sign: int) -> None:
        if record.state is not ClaimState.PREPARE_COMPLETED:
            return
        self._claims += sign
        for device in record.devices:
            self._devices[prepared_type(device)] += sign
            if device.mps is not None:
                daemon = device.mps.daemon
                self._daemons[daemon] += sign
                if not self._daemons[daemon]:
                    del self._daemons[daemon]


def recount(checkpoint: Checkpoint) -> tuple[int, dict[str, int], int]:
    """Prepared claims, devices by type and MPS daemons counted afresh from every record (what `PreparedMetrics`
    keeps by deltas; tests compare the two)."""
    done = [r for r in checkpoint.claims.values() if r.state is ClaimState.PREPARE_COMPLETED]
    devices = dict.fromkeys(PREPARED_TYPES, 0)
    daemons: set[str] = set()
    for record in done:
        for device in record.devices:
            devices[prepared_type(device)] += 1
            if device.mps is not None:
                daemons.add(device.mps.daemon)
    return len(done), devices, len(daemons)


def prepared_type(device: PreparedDevice) -> str:
    """What a prepared device is, for the metrics: `share` (a consumable-capacity share or a shared GPU), `mig`
    (a MIG device, dynamic or static) or `gpu`."""
    if device.share_id is not None or device.device.endswith("-shared"):
        return "share"
    if device.mps is not None and device.mps.share:
        return "share"
    if device.mig is not None or "-mig-" in device.device:
        return "mig"
    return "gpu"
