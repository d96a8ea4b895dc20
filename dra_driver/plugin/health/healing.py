"""Health that heals: which device problems end, when, and what an admin overrides. Pure (times are passed in).

A problem (an Xid, a double-bit ECC error, a lost GPU) taints its devices at once. It ends when the device has had
a whole *healthy window* (`--health-heal-after`) with no new event — for a problem that made the device
UNHEALTHY, only if an NVML probe of the GPU also succeeds (the caller's job: `HealthLedger.due` says which devices
to probe). A lost GPU and Xid 79 (fallen off the bus) never heal: they need a reset and a plugin restart, or an
admin's clear. Flapping is damped: an event while a device is tainted, or within the last window after it healed,
doubles the device's next window (capped at `--health-heal-after-max`); a full window without events resets it.

An admin's taints are DeviceTaintRules (`dra-driver health taint`), outside this ledger. What is left here of the
Node annotation `<driver>/device-health: gpu-3=healthy,gpu-5=unhealthy` of earlier releases is its format, which
`dra-driver health migrate` reads once to convert it (docs/operations.md, "Upgrading: admin overrides").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from dra_driver.plugin.health.problems import DeviceProblem

ANNOTATION_NAME = "device-health"  # the Node annotation is <driver>/device-health
OVERRIDE_HEALTHY = "healthy"
OVERRIDE_UNHEALTHY = "unhealthy"
NEVER_HEAL_XIDS = frozenset({79})  # the GPU has fallen off the bus: a reset is needed

# Metric label values (bounded): the change and why.
TAINTED, UNTAINTED = "tainted", "untainted"
REASON_XID, REASON_XID_APP, REASON_ECC, REASON_LOST = "xid", "xid-application", "ecc", "gpu-lost"
REASON_HEALED = "healthy-window"


@dataclass(frozen=True)
class Transition:
    """A device tainted or untainted by the ledger, and why."""

    device: str
    change: str  # TAINTED | UNTAINTED
    reason: str  # one of the REASON_* values
    problem: DeviceProblem  # the taint added or removed
    detail: str  # for people: logs and the Node event

    @property
    def message(self) -> str:
        verb = "tainted" if self.change == TAINTED else "untainted"
        taint = f"{self.problem.key}={self.problem.value}:{self.problem.effect}"
        return f"{self.device} {verb} ({taint}): {self.detail}"


@dataclass(frozen=True)
class _State:
    """The ledger's memory of one device: its current problem (taint), last event and healthy window."""

    problem: DeviceProblem | None
    last_event: float
    window: float
    healed_at: float | None = None


def annotation_key(driver_name: str) -> str:
    return f"{driver_name}/{ANNOTATION_NAME}"


def parse_overrides(text: str) -> tuple[dict[str, str], list[str]]:
    """`"gpu-3=healthy@17, gpu-5=unhealthy"` -> ({device: value}, [problems with bad entries]). Pure."""
    entries: dict[str, str] = {}
    problems: list[str] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        device, sep, value = part.partition("=")
        device, value = device.strip(), value.strip()
        state = value.split("@", 1)[0]
        if not sep or not device or state not in (OVERRIDE_HEALTHY, OVERRIDE_UNHEALTHY):
            problems.append(f"{part!r}: write <device>=healthy or <device>=unhealthy")
            continue
        entries[device] = value
    return entries, problems


def format_overrides(entries: Mapping[str, str]) -> str:
    return ",".join(f"{device}={value}" for device, value in sorted(entries.items()))


def reason_of(problem: DeviceProblem) -> str:
    kind = problem.key.rsplit("/", 1)[-1]
    if kind == "xid":
        return REASON_XID if problem.unhealthy else REASON_XID_APP
    return {"ecc": REASON_ECC, "gpu-lost": REASON_LOST}.get(kind, kind)


def _rank(problem: DeviceProblem | None, never_heal: frozenset[int]) -> int:
    if problem is None:
        return 0
    if not _healable(problem, never_heal):
        return 3
    return 2 if problem.unhealthy else 1


def _healable(problem: DeviceProblem, never_heal: frozenset[int]) -> bool:
    kind = problem.key.rsplit("/", 1)[-1]
    if kind == "gpu-lost":
        return False
    return not (kind == "xid" and problem.value.isdigit() and int(problem.value) in never_heal)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds % 3600 == 0 and seconds:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0 and seconds:
        return f"{seconds // 60}m"
    return f"{seconds}s"


class HealthLedger:
    """Each device's current problem and healthy window. Not thread-safe: one owner."""

    def __init__(
        self,
        driver_name: str,
        *,
        heal_after: float,
        heal_after_max: float,
        never_heal_xids: Iterable[int] = NEVER_HEAL_XIDS,
    ) -> None:
        self._driver = driver_name
        self.heal_after = heal_after  # 0: problems never heal by themselves
        self.heal_after_max = max(heal_after, heal_after_max)
        self._never_heal = frozenset(never_heal_xids)
        self._states: dict[str, _State] = {}

    # --- reading --------------------------------------------------------------------------------------

    def problems(self) -> dict[str, tuple[DeviceProblem, ...]]:
        """Every tainted device's taint: its NVML problem."""
        return {name: (state.problem,) for name, state in sorted(self._states.items()) if state.problem is not None}

    def window(self, device: str) -> float:
        state = self._states.get(device)
        return state.window if state else self.heal_after

    def due(self, now: float) -> list[tuple[str, bool]]:
        """Devices whose healthy window has passed: (name, needs an NVML probe first)."""
        if self.heal_after <= 0:
            return []
        return [
            (name, s.problem.unhealthy)
            for name, s in sorted(self._states.items())
            if s.problem is not None and _healable(s.problem, self._never_heal) and now - s.last_event >= s.window
        ]

    # --- changing -------------------------------------------------------------------------------------

    def record(self, names: Iterable[str], problem: DeviceProblem, now: float) -> list[Transition]:
        """An NVML event hit these devices. A device keeps its worst problem; every event restarts its window."""
        out: list[Transition] = []
        for name in names:
            state = self._states.get(name)
            flapping = state is not None and (
                state.problem is not None or (state.healed_at is not None and now - state.healed_at < state.window)
            )
            window = min(state.window * 2, self.heal_after_max) if state is not None and flapping else self.heal_after
            old = state.problem if state else None
            worst = problem if _rank(problem, self._never_heal) >= _rank(old, self._never_heal) else old
            self._states[name] = _State(worst, now, window)
            if worst != old:
                detail = problem.message
                if flapping and self.heal_after > 0:
                    detail += f"; a repeated problem: the next healthy window is {_duration(window)}"
                out.append(Transition(name, TAINTED, reason_of(problem), problem, detail))
        return out

    def heal(self, name: str, now: float) -> list[Transition]:
        state = self._states.get(name)
        if state is None or state.problem is None:
            return []
        self._states[name] = replace(state, problem=None, healed_at=now)
        detail = f"no new event for {_duration(state.window)}" + (
            " and the NVML probe of the GPU succeeded" if state.problem.unhealthy else ""
        )
        return [Transition(name, UNTAINTED, REASON_HEALED, state.problem, detail)]

    def forget_quiet(self, now: float) -> None:
        """Drop healed devices whose damping has run out (a full window after healing): their window resets."""
        for name, state in list(self._states.items()):
            if state.problem is None and state.healed_at is not None and now - state.healed_at >= state.window:
                del self._states[name]
