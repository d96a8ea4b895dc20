"""The crash campaign's trials for either driver (crashcampaign.py: the GPU plugin's operations and checks;
cdcrashcampaign.py: the ComputeDomain plugin's): one trial (a weighted random operation, then the driver's
checks), the report's counts, the kubelet's calls retried until they succeed across restarts, the restart that is
half graceful and half SIGKILL, violations reported once each, and `run_together`, the one trial loop that drives
the plugins of both drivers, each trial going to one of them."""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import grpc

from dra_driver.kubeletplugin.server import SocketPaths
from dra_sandbox.kubelet.draclient import ClaimRef, DraClient, PrepareResult

RETRY_LIMIT = 20  # calls of one claim before the node counts as stuck


class PluginUnderTest(Protocol):
    """A kubelet plugin process the campaign kills and restarts (dra_sandbox.cluster / .computedomainplugin)."""

    @property
    def sockets(self) -> SocketPaths: ...

    @property
    def log_file(self) -> Path: ...

    def start(self, extra_env: Mapping[str, str] | None = None) -> None: ...

    def stop(self, timeout: float = 20.0) -> int | None: ...

    def wait_serving(self, timeout: float = 30.0) -> None: ...


class TrialClaim(Protocol):
    @property
    def ref(self) -> ClaimRef: ...


@dataclass
class TrialsReport(ABC):
    """The counts every campaign reports; a campaign's report adds its own."""

    trials: int = 0
    crashes: int = 0
    restarts: int = 0
    operations: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)

    @abstractmethod
    def summary(self) -> str:
        """One line for people: the counts and the violations found."""

    def operations_line(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.operations.items()))


ClaimT = TypeVar("ClaimT", bound=TrialClaim)
ReportT = TypeVar("ReportT", bound=TrialsReport)


class CrashTrials(ABC, Generic[ClaimT, ReportT]):
    """Random operations against one plugin, each followed by the campaign's checks (`check`)."""

    retry_pause_s = 0.0  # between a claim's failed calls

    def __init__(self, plugin: PluginUnderTest, report: ReportT, seed: int, trials: int,
                 progress: Callable[[str], None] | None) -> None:
        self.plugin = plugin
        self.report = report
        self.rng = random.Random(seed)  # noqa: S311 - reproducible trials, not security
        self.trial_count = trials
        self.progress = progress
        self.prepared: dict[str, ClaimT] = {}
        self.released: list[ClaimT] = []
        self._seen: set[str] = set()

    @abstractmethod
    def operations(self) -> Sequence[tuple[Callable[[], None], int]]:
        """The operations a trial picks from, with their weights."""

    @abstractmethod
    def check(self, when: str) -> None:
        """Report (through `report_new`) every invariant the node breaks now."""

    def final_check(self) -> None:
        """The checks once every claim is unprepared."""
        self.check("after unprepare of all")

    @abstractmethod
    def _alive(self) -> bool: ...

    @abstractmethod
    def _restart(self, env: dict[str, str] | None = None) -> object:
        """SIGKILL the plugin and start it again (armed with `env`), serving."""

    # --- the kubelet's calls --------------------------------------------------------------------------------------

    @contextmanager
    def _client(self) -> Iterator[DraClient]:
        channel = grpc.insecure_channel(f"unix://{self.plugin.sockets.dra}")
        try:
            yield DraClient(channel, "v1.DRAPlugin", timeout_s=30)
        finally:
            channel.close()

    def _prepared(self, claim: ClaimT) -> PrepareResult:
        """The claim's successful NodePrepareResources answer, restarting a plugin that died in between."""
        result: PrepareResult | None = None
        for _ in range(RETRY_LIMIT):
            with self._client() as client:
                result = client.prepare([claim.ref])[claim.ref.uid]
            if result.ok:
                return result
            self._after_failed_call()
        raise AssertionError(f"prepare of {claim.ref.name} never succeeded: {result.error if result else ''}")

    def _unprepare_until_ok(self, claim: ClaimT) -> None:
        error: str | None = None
        for _ in range(RETRY_LIMIT):
            with self._client() as client:
                error = client.unprepare([claim.ref])[claim.ref.uid]
            if error is None:
                return
            self._after_failed_call()
        raise AssertionError(f"unprepare of {claim.ref.name} never succeeded: {error}")

    def _after_failed_call(self) -> None:
        if not self._alive():
            self._restart()
        if self.retry_pause_s:
            time.sleep(self.retry_pause_s)  # pacing between a refused call and its retry, not synchronisation

    def _restart_gracefully_or_crash(self) -> bool:
        """Half the time a graceful stop and start, else a SIGKILL and start; True for the SIGKILL."""
        if self.rng.random() < 0.5:
            self.plugin.stop()
            self.plugin.start()
            self.plugin.wait_serving()
            self.report.restarts += 1
            return False
        self.report.crashes += 1
        self._restart()
        return True

    # --- findings and the run -------------------------------------------------------------------------------------

    def report_new(self, when: str, found: Iterable[str]) -> None:
        """Each finding as a violation at `when`; a lasting violation is reported once, at the trial that caused it."""
        for detail in found:
            if detail not in self._seen:
                self._seen.add(detail)
                self.report.violations.append(f"{when}: {detail}")

    def trial(self, number: int) -> bool:
        """Trial `number` of the campaign: a random operation, then the checks. False when the node got stuck or the
        plugin did not come back (reported as a violation): the campaign stops there."""
        ops = self.operations()
        op = self.rng.choices([f for f, _ in ops], [w for _, w in ops])[0]
        name = op.__name__.removeprefix("op_")
        self.report.operations[name] += 1
        try:
            op()
        except AssertionError as exc:  # an operation that never succeeded: the node is stuck, stop here
            self.report.violations.append(f"trial {number} ({name}): {exc}")
            return False
        except (RuntimeError, TimeoutError) as exc:  # the plugin did not come back: say why while its log exists
            log = self.plugin.log_file
            tail = log.read_text(errors="replace")[-4000:] if log.exists() else "(no log)"
            self.report.violations.append(f"trial {number} ({name}): {exc}; the plugin log's tail:\n{tail}")
            return False
        self.report.trials += 1
        self.check(f"trial {number} ({name})")
        if self.progress is not None and self.report.trials % 50 == 0:
            self.progress(self.report.summary())
        return True

    def finish(self) -> ReportT:
        """Every claim still prepared unprepared, then the final checks."""
        for claim in list(self.prepared.values()):
            self._unprepare_until_ok(claim)
            self.released.append(self.prepared.pop(claim.ref.uid))
        self.final_check()
        return self.report

    def run(self) -> ReportT:
        """This campaign's trials alone, then `finish`."""
        for number in range(self.trial_count):
            if not self.trial(number):
                return self.report
        return self.finish()


def run_together(campaigns: Sequence[CrashTrials[Any, Any]], seed: int) -> None:
    """One trial loop over the campaigns of several plugins (both drivers'): each trial goes to a campaign drawn in
    proportion to the trials it has left, so the drivers' operations, crashes and restarts interleave and each
    campaign runs exactly its `trial_count`; trials are numbered across the whole loop. A stuck node stops the
    loop; then every campaign that is not stuck is finished (its claims unprepared, its final checks)."""
    rng = random.Random(seed)  # noqa: S311 - reproducible trials, not security
    left = [c.trial_count for c in campaigns]
    stuck: set[int] = set()
    number = 0
    while any(left) and not stuck:
        index = rng.choices(range(len(campaigns)), left)[0]
        left[index] -= 1
        if not campaigns[index].trial(number):
            stuck.add(index)
        number += 1
    for index, campaign in enumerate(campaigns):
        if index not in stuck:
            campaign.finish()
