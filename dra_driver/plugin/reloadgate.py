"""The driver-reload gate on the prepare pipeline: claims wait while the NVIDIA driver reloads (plugin/driverreload.py).

A guard and an observer in one (plugin/claimpipeline.py registers it as both):
- guard: while the board says RELOADING, every prepare is refused with a retryable error, and so is each unprepare
  that needs the driver (its record is kept); an unprepare that only removes files goes on;
- observer: a claim operation the engine failed asks the reload watcher whether the driver went (the answers stand
  whatever it says).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import structlog

from dra_driver.errors import DraDriverError
from dra_driver.kubeletplugin.driver import ClaimRef, PrepareResult
from dra_driver.kubeletplugin.pipeline import PrepareOutcome, UnprepareOutcome
from dra_driver.nvidiadriver.state import DriverState, DriverStatusBoard
from dra_driver.plugin.driverreload import needs_driver, retry_message
from dra_driver.plugin.engine import PrepareEngine

log = structlog.get_logger(__name__)


class ReloadGate:
    def __init__(self, board: DriverStatusBoard, *, node_name: str, engine: PrepareEngine,
                 suspect: Callable[[], object]) -> None:  # fmt: skip
        self._board = board
        self._node = node_name
        self._engine = engine
        self._suspect = suspect

    def _reloading(self) -> bool:
        return self._board.status().state is DriverState.RELOADING

    # -- guard ---------------------------------------------------------------------------------------------

    def refuse_prepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        if not self._reloading():
            return {}
        error = retry_message(self._node, "claims are prepared once it is back")
        return {c.uid: f"prepare {c.namespace}/{c.name}: {error}" for c in claims}

    def refuse_unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        if not self._reloading():
            return {}
        try:
            checkpoint = self._engine.prepared_claims()
        except DraDriverError as exc:  # which claims need the driver is unknowable: each claim is told, none dropped
            return {c.uid: f"unprepare {c.namespace}/{c.name}: {exc}" for c in claims}
        error = retry_message(self._node, "unpreparing this claim needs it (its record is kept)")
        return {
            c.uid: f"unprepare {c.namespace}/{c.name}: {error}"
            for c in claims
            if needs_driver(checkpoint.claims.get(c.uid), self._engine)
        }

    # -- observer ------------------------------------------------------------------------------------------

    def prepared(self, outcomes: Sequence[PrepareOutcome]) -> dict[str, PrepareResult]:
        if any(o.result.error and not o.refused for o in outcomes):
            self._check_driver()
        return {}

    def unprepared(self, outcomes: Sequence[UnprepareOutcome]) -> dict[str, str]:
        if any(o.error and not o.refused for o in outcomes):
            self._check_driver()
        return {}

    def _check_driver(self) -> None:
        """Ask the watcher whether a failure was the driver going; the claims' answers stand whatever it says."""
        if self._reloading():
            return  # known already (what the engine answered meanwhile came from claims that need no driver)
        try:
            self._suspect()
        except Exception:
            log.exception("checking the NVIDIA driver after a failed claim operation failed")
