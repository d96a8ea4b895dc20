"""The DRA side of "one GPU, one world": a prepare guard and observer for the GPU plugin's prepare pipeline.

The ResourceSlices leave out every GPU the device plugin allocated, so the scheduler does not pick one; this
guard is for the race that is left (a claim allocated from a slice published just before an Allocate). Before the
engine runs, it reads the claim, maps this driver's results in this pool to GPUs, and under the ownership lock
either refuses the claim (a GPU is the device plugin's) or reserves its GPUs for it, so an Allocate that comes
next sees them as DRA's. The observer drops the reservation of a claim that failed and of a claim unprepared; a
reservation a crash left behind is dropped by the agent's reconcile once the claim checkpoint does not name it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import structlog

from dra_driver.deviceplugin.gpus import gpus_of_devices
from dra_driver.deviceplugin.ownership import OwnershipFile
from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.k8s.client import ApiError
from dra_driver.kubeletplugin.claims import ClaimSource
from dra_driver.kubeletplugin.driver import ClaimRef, PrepareResult
from dra_driver.kubeletplugin.pipeline import PrepareOutcome, UnprepareOutcome
from dra_driver.resourceapi.claim import parse_resource_claim
from dra_driver.resourceapi.fields import InvalidObjectError

log = structlog.get_logger(__name__)


class DevicePluginGuard:
    """A `Guard` and an `Observer` of kubeletplugin/pipeline.py."""

    def __init__(self, ownership: OwnershipFile, claims: ClaimSource, catalog: Callable[[],
                 Mapping[str, AllocatableDevice]], *, driver_name: str, pool_name: str, changed: Callable[[], None],
                 clock: Callable[[], float], faults: Callable[[str], None] | None = None) -> None:  # fmt: skip
        self._ownership = ownership
        self._reached = faults or (lambda point: None)  # crash points (plugin/faults.py), for tests
        self._claims = claims
        self._catalog = catalog
        self._driver = driver_name
        self._pool = pool_name
        self._changed = changed
        self._clock = clock

    def _gpus(self, ref: ClaimRef) -> set[str] | str:
        """The claim's GPUs on this node, or why they cannot be known."""
        try:
            obj = self._claims.get_claim(ref.namespace, ref.name)
        except ApiError as exc:
            return f"reading the claim to check it against the device plugin's GPUs failed: {exc}"
        if obj is None:
            return f"ResourceClaim {ref.namespace}/{ref.name} does not exist"
        try:
            claim = parse_resource_claim(obj)
        except InvalidObjectError as exc:
            return str(exc)
        if claim.uid != ref.uid:
            return f"ResourceClaim {ref.namespace}/{ref.name} has UID {claim.uid}, not {ref.uid}: it was replaced"
        return gpus_of_devices(self._catalog(), (r.device for r in claim.for_driver(self._driver, self._pool).results))

    def refuse_prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        wanted = {ref.uid: self._gpus(ref) for ref in claims}
        refused = {uid: gpus for uid, gpus in wanted.items() if isinstance(gpus, str)}
        with self._ownership.change() as changing:
            new = changing.old
            for uid, gpus in wanted.items():
                if isinstance(gpus, str):
                    continue
                taken = gpus & set(new.allocated)
                if taken:
                    refused[uid] = (f"GPU {', '.join(sorted(taken))} is allocated to a pod through the device plugin "
                                    "(nvidia.com/gpu) on this node; it returns to DRA when that pod ends, and the "
                                    "claim must be allocated again (delete the pod to reschedule it)")  # fmt: skip
                    continue
                new = new.with_reserved(uid, gpus, self._clock())
            changing.new = new
        if changing.new != changing.old:
            self._reached("deviceplugin:guard-after-reserve")  # reserved; the engine has not run
            self._changed()
        for uid, why in refused.items():
            log.warning("claim refused: its GPU is the device plugin's", claim_uid=uid, error=why)
        return refused

    def refuse_unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        return {}

    def _release(self, uids: set[str]) -> None:
        if not uids:
            return
        with self._ownership.change() as changing:
            changing.new = changing.old.without_claims(uids)
        if changing.new != changing.old:
            self._changed()

    def prepared(self, outcomes: Sequence[PrepareOutcome]) -> Mapping[str, PrepareResult]:
        self._release({o.ref.uid for o in outcomes if o.result.error and not o.refused})
        return {}

    def unprepared(self, outcomes: Sequence[UnprepareOutcome]) -> Mapping[str, str]:
        self._release({o.ref.uid for o in outcomes if not o.error})
        return {}
