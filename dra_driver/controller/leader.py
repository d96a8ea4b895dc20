"""Leader election with a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does it.

Every replica runs an elector on the same Lease (`<release>-controller` in the release namespace). The holder
renews `spec.renewTime` every `retry_seconds`; a candidate takes the Lease over only when the record it last
saw has not changed for `duration_seconds` (measured on its own monotonic clock, so clock skew between nodes
does not matter). Writes carry the Lease's resourceVersion: of two candidates racing for an expired Lease,
one gets 409 Conflict and stays a follower.

The leader steps down when it cannot renew for `renew_deadline_seconds` (< duration, so it stops before
anybody else can take over) or when it sees another holder. On a clean stop it releases the Lease (empty
holder) so a peer takes over at its next try instead of after the full duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dra_driver.k8s.client import ApiError, KubeRest

log = logging.getLogger(__name__)

LEADER_LEASES = "/apis/coordination.k8s.io/v1/namespaces"


@dataclass(frozen=True)
class LeaseSettings:
    name: str
    namespace: str
    identity: str
    duration_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 5.0
    release_on_stop: bool = True  # False: a stop looks like a crash (the tests' way to kill a leader)

    def __post_init__(self) -> None:
        if not 0 < self.retry_seconds < self.renew_deadline_seconds < self.duration_seconds:
            raise ValueError("leader election needs 0 < retry < renew deadline < lease duration")
        if not self.identity:
            raise ValueError("leader election needs an identity")


class Attempt(enum.Enum):
    LEADING = "leading"  # we hold the Lease (acquired or renewed)
    HELD = "held"  # somebody else holds a live Lease
    FAILED = "failed"  # the API failed or a write lost a race; try again


def micro_time(now: datetime) -> str:
    """metav1.MicroTime on the wire."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        rest: KubeRest,
        options: LeaseSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.rest = rest
        self.options = options
        self.clock = clock
        self.wall = wall
        self._observed: dict[str, Any] | None = None  # the last spec seen
        self._observed_at = 0.0
        self.leading = threading.Event()
        self.transitions = 0  # times this elector became the leader

    def _spec(self, previous: dict[str, Any] | None) -> dict[str, Any]:
        now = micro_time(self.wall())
        ours = previous is not None and previous.get("holderIdentity") == self.options.identity
        transitions = int((previous or {}).get("leaseTransitions") or 0)
        return {
            "holderIdentity": self.options.identity,
            "leaseDurationSeconds": max(1, math.ceil(self.options.duration_seconds)),
            "acquireTime": (previous or {}).get("acquireTime", now) if ours else now,
            "renewTime": now,
            "leaseTransitions": transitions if ours or previous is None else transitions + 1,
        }

    def try_acquire_or_renew(self) -> Attempt:
        """One step: create the Lease, renew ours, or take over an expired one."""
        try:
            lease = self.rest.get(f"{LEADER_LEASES}/{self.options.namespace}/leases/{self.options.name}")
        except ApiError as exc:
            log.warning("leader election: cannot read Lease %s: %s", self.options.name, exc)
            return Attempt.FAILED
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.options.name, "namespace": self.options.namespace},
                "spec": self._spec(None),
            }
            return self._write(
                lambda: self.rest.request("POST", f"{LEADER_LEASES}/{self.options.namespace}/leases", body=body)
            )
        spec = dict(lease.get("spec") or {})
        now = self.clock()
        if spec != self._observed:
            self._observed, self._observed_at = spec, now
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self.options.duration_seconds)
        if holder and holder != self.options.identity and now < self._observed_at + duration:
            return Attempt.HELD
        update = {**lease, "spec": self._spec(spec)}
        return self._write(
            lambda: self.rest.request(
                "PUT", f"{LEADER_LEASES}/{self.options.namespace}/leases/{self.options.name}", body=update
            )
        )

    def _write(self, send: Callable[[], dict[str, Any]]) -> Attempt:
        try:
            written = send()
        except ApiError as exc:
            if exc.status != 409:
                log.warning("leader election: cannot write Lease %s: %s", self.options.name, exc)
            return Attempt.FAILED
        self._observed, self._observed_at = dict(written.get("spec") or {}), self.clock()
        return Attempt.LEADING

    def release(self) -> None:
        """Give the Lease up (empty holder), if we still hold it."""
        try:
            lease = self.rest.get(f"{LEADER_LEASES}/{self.options.namespace}/leases/{self.options.name}")
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.options.identity:
                return
            spec = {
                **lease["spec"],
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "renewTime": micro_time(self.wall()),
            }
            self.rest.request(
                "PUT",
                f"{LEADER_LEASES}/{self.options.namespace}/leases/{self.options.name}",
                body={**lease, "spec": spec},
            )
            log.info("leader election: released Lease %s/%s", self.options.namespace, self.options.name)
        except ApiError as exc:
            log.warning("leader election: cannot release Lease %s: %s", self.options.name, exc)

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this replica leads (True) or `stop` is set (False)."""
        loop = asyncio.get_running_loop()
        logged = False
        while not stop.is_set():
            attempt = await loop.run_in_executor(None, self.try_acquire_or_renew)
            if attempt is Attempt.LEADING:
                self.transitions += 1
                self.leading.set()
                log.info(
                    "leader election: %s leads (Lease %s/%s)",
                    self.options.identity,
                    self.options.namespace,
                    self.options.name,
                )
                return True
            if not logged and attempt is Attempt.HELD:
                log.info(
                    "leader election: %s is a follower; %s leads",
                    self.options.identity,
                    (self._observed or {}).get("holderIdentity"),
                )
                logged = True
            await _wait(stop, self.options.retry_seconds)
        return False

    async def keep(self, stop: asyncio.Event) -> bool:
        """Renew until `stop` is set (True: we stopped while leading) or leadership is lost (False)."""
        loop = asyncio.get_running_loop()
        renewed = self.clock()
        try:
            while True:
                await _wait(stop, self.options.retry_seconds)
                if stop.is_set():
                    return True
                attempt = await loop.run_in_executor(None, self.try_acquire_or_renew)
                if attempt is Attempt.LEADING:
                    renewed = self.clock()
                    continue
                if attempt is Attempt.HELD:
                    log.error(
                        "leader election: %s lost the Lease to %s",
                        self.options.identity,
                        (self._observed or {}).get("holderIdentity"),
                    )
                    return False
                if self.clock() - renewed >= self.options.renew_deadline_seconds:
                    log.error(
                        "leader election: %s could not renew the Lease for %.1fs; stepping down",
                        self.options.identity,
                        self.options.renew_deadline_seconds,
                    )
                    return False
        finally:
            self.leading.clear()


async def _wait(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
