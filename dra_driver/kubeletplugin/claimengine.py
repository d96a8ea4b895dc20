"""What every claim engine on this layer does the same way, whatever its driver: the claim record a checkpoint write
expects (`RecordChanged`, `expect_record`), what an effect made written into the claim's record the moment it exists
(`made_recorder`), and the release of claims whose ResourceClaim is gone (`release_stale`).

The one claim engine (claimstates.py, on claimsteps.py), which both drivers run with their rules (claimrules.py),
uses them; it steps through the driver's `ClaimEffects` (effect.py) and keeps the records in the layer's checkpoint
(claimrecord.py, checkpoint.py); per-claim and per-device locks are statedirs.KeyedLocks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, Literal

import structlog

from dra_driver.errors import DraDriverError
from dra_driver.k8s.client import ApiError
from dra_driver.kubeletplugin.checkpoint import CheckpointStore
from dra_driver.kubeletplugin.claimrecord import Checkpoint, ClaimRecord
from dra_driver.kubeletplugin.claims import ClaimSource
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.kubeletplugin.effect import Created, D, Made, X, record_made
from dra_driver.kubeletplugin.names import InvalidNameError
from dra_driver.observability.logging import claim_fields

log = structlog.get_logger(__name__)


class RecordChanged(Exception):
    """Raised inside a checkpoint change: the claim's record is not the one this operation decided on (a concurrent
    call, or another plugin instance on the node, finished or changed it meanwhile). Carries the record as it is."""

    def __init__(self, record: ClaimRecord[Any, Any] | None) -> None:
        super().__init__("the claim's record changed meanwhile")
        self.record = record


def expect_record(checkpoint: Checkpoint[D, X], uid: str, record: ClaimRecord[D, X] | None) -> Checkpoint[D, X]:
    """`checkpoint` when the claim's record in it is still `record` (None: absent); raises RecordChanged otherwise."""
    now = checkpoint.claims.get(uid)
    if now is not record and now != record:
        raise RecordChanged(now)
    return checkpoint


def made_recorder(
    store: CheckpointStore[Checkpoint[D, X]], uid: str, into: tuple[Literal["devices", "allocated"], ...]
) -> Created[D]:
    """A `Created` that writes what an effect made into the claim's device records (`into`: the planned ones of a
    PrepareStarted record, the prepared ones of a completed record being repaired), durably, before returning."""

    def created(device_name: str, made: Made[D]) -> None:
        def change(cp: Checkpoint[D, X]) -> Checkpoint[D, X]:
            record = cp.claims.get(uid)
            if record is None:
                # Only a record the operation wrote before it made anything can name what it made: without one,
                # the operation must fail (and undo what it made) rather than leave it unrecorded.
                raise DraDriverError(
                    f"the claim's record (UID {uid}) left the checkpoint while device {device_name} was being made, "
                    "so what was made cannot be recorded; the kubelet retries (recovery removes what no record owns)"
                )
            if "devices" in into:
                record = replace(record, devices=record_made(record.devices, device_name, made))
            if "allocated" in into:
                record = replace(record, allocated=record_made(record.allocated, device_name, made))
            return cp.with_claim(record)

        store.update(change)

    return created


def release_stale(
    records: Iterable[ClaimRecord[D, X]], claims: ClaimSource, release: Callable[[ClaimRef], str]
) -> list[str]:
    """Release (`release`: "" or why not, as the kubelet's unprepare answers) each recorded claim whose ResourceClaim
    is gone or was re-created under another UID; the UIDs released. An API error or a recorded name the API cannot
    hold (only a damaged or hand-edited checkpoint has one) leaves the claim alone until the next round."""
    released = []
    for record in records:
        try:
            claim = claims.get_claim(record.namespace, record.name)
        except ApiError as exc:
            log.warning("stale-claim check skipped: API error", error=str(exc), claim_uid=record.uid)
            continue
        except InvalidNameError as exc:
            log.warning("stale-claim check skipped: the recorded name is invalid", error=str(exc), claim_uid=record.uid)
            continue
        if claim is not None and (claim.get("metadata") or {}).get("uid") == record.uid:
            continue
        ref = ClaimRef(record.namespace, record.name, record.uid)
        if not release(ref):
            released.append(record.uid)
            log.info("unprepared a claim whose ResourceClaim is gone", **claim_fields(ref.namespace, ref.name, ref.uid))
    return released
