"""Kubernetes Events where users look: a failed prepare or unprepare is recorded on the ResourceClaim
(`kubectl describe resourceclaim` shows it), with the same message the kubelet gets; so is a Normal note of a
prepare that succeeded (e.g. TimeSlicing on a MIG device: nothing to apply).

Wraps the prepare engine for the gRPC servicers; the recorder deduplicates (count) and writes each claim's series
at most once a minute, off the kubelet's call path.
"""

from __future__ import annotations

from dra_driver.k8s.events import NORMAL, WARNING, EventRecorder, InvolvedObject
from dra_driver.kubeletplugin.driver import ClaimRef, Driver, PrepareResult

CLAIM_API_VERSION = "resource.k8s.io/v1"
PREPARE_FAILED, UNPREPARE_FAILED = "PrepareFailed", "UnprepareFailed"
SHARING_NOT_APPLIED = "SharingNotApplied"  # a prepare note: a sharing config with nothing to apply


def claim_object(ref: ClaimRef) -> InvolvedObject:
    return InvolvedObject(CLAIM_API_VERSION, "ResourceClaim", ref.name, ref.namespace, ref.uid)


class EventingEngine:
    """A Driver that records a Warning Event on each claim whose operation failed, and a Normal Event for each
    note of a prepare that succeeded."""

    def __init__(self, engine: Driver, events: EventRecorder) -> None:
        self._engine = engine
        self._events = events

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        results = self._engine.prepare(claims)
        for ref in claims:
            result = results.get(ref.uid)
            if result is not None and result.error:
                self._events.record(claim_object(ref), type=WARNING, reason=PREPARE_FAILED, message=result.error)
            for note in result.notes if result is not None else ():
                self._events.record(claim_object(ref), type=NORMAL, reason=SHARING_NOT_APPLIED, message=note)
        return results

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        results = self._engine.unprepare(claims)
        for ref in claims:
            error = results.get(ref.uid, "")
            if error:
                self._events.record(claim_object(ref), type=WARNING, reason=UNPREPARE_FAILED, message=error)
        return results
