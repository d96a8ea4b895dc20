"""Prepared claims, devices by type and MPS daemons in the metrics, from a checkpoint the engine just wrote."""

from __future__ import annotations

import threading

from dra_driver.observability.metrics import PluginMetrics
from dra_driver.plugin.checkpoint import Checkpoint, ClaimState, PreparedDevice


class PreparedMetrics:
    def __init__(self, metrics: PluginMetrics) -> None:
        self._metrics = metrics
        self._recorded: Checkpoint | None = None  # the checkpoint last put in the metrics
        self._lock = threading.Lock()

    def record(self, checkpoint: Checkpoint) -> None:
        """The checkpoint is immutable: one already recorded is skipped (concurrent claims often finish on the same
        one, and counting every record per operation made a burst of claims quadratic)."""
        with self._lock:
            if checkpoint is self._recorded:
                return
            done = [r for r in checkpoint.claims.values() if r.state is ClaimState.PREPARE_COMPLETED]
            devices = {"gpu": 0, "mig": 0, "share": 0}
            daemons: set[str] = set()
            for record in done:
                for device in record.devices:
                    devices[prepared_type(device)] += 1
                    if device.mps is not None:
                        daemons.add(device.mps.daemon)
            self._metrics.set_prepared(len(done), devices, len(daemons))
            self._recorded = checkpoint


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
