"""Kubernetes Events where users look: a failed prepare or unprepare is recorded on the ResourceClaim
(`kubectl describe resourceclaim` shows it), with the same message the kubelet gets; so is a Normal note of a
prepare that succeeded (e.g. TimeSlicing on a MIG device: nothing to apply).

An observer on the prepare pipeline (plugin/claimpipeline.py); the recorder deduplicates (count) and writes each
claim's series at most once a minute, off the kubelet's call path.
"""

from __future__ import annotations

from collections.abc import Sequence

from dra_driver.k8s.events import NORMAL, WARNING, EventRecorder, InvolvedObject
from dra_driver.kubeletplugin.driver import ClaimRef, PrepareResult
from dra_driver.kubeletplugin.pipeline import PrepareOutcome, UnprepareOutcome

CLAIM_API_VERSION = "resource.k8s.io/v1"
PREPARE_FAILED, UNPREPARE_FAILED = "PrepareFailed", "UnprepareFailed"
SHARING_NOT_APPLIED = "SharingNotApplied"  # a prepare note: a sharing config with nothing to apply


def claim_object(ref: ClaimRef) -> InvolvedObject:
    return InvolvedObject(CLAIM_API_VERSION, "ResourceClaim", ref.name, ref.namespace, ref.uid)


class ClaimEvents:
    """The prepare pipeline's observer that records a Warning Event on each claim whose operation failed (refused by
    a guard too), and a Normal Event for each note of a prepare that succeeded."""

    def __init__(self, events: EventRecorder) -> None:
        self._events = events

    def prepared(self, outcomes: Sequence[PrepareOutcome]) -> dict[str, PrepareResult]:
        for ref, result in ((o.ref, o.result) for o in outcomes):
            if result.error:
                self._events.record(claim_object(ref), type=WARNING, reason=PREPARE_FAILED, message=result.error)
            for note in result.notes:
                self._events.record(claim_object(ref), type=NORMAL, reason=SHARING_NOT_APPLIED, message=note)
        return {}

    def unprepared(self, outcomes: Sequence[UnprepareOutcome]) -> dict[str, str]:
        for outcome in outcomes:
            if outcome.error:
                self._events.record(claim_object(outcome.ref), type=WARNING, reason=UNPREPARE_FAILED,
                                    message=outcome.error)  # fmt: skip
        return {}
