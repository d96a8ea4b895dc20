"""The `nvidia-imex` process the runner supervises, and its control tool `nvidia-imex-ctl`.

IMEX reads its config and node map only at start; it re-resolves the node map's names when it gets SIGUSR1
(driver >= 570.158.01), which is how membership changes reach it without a restart. NVIDIA's #1443: IMEX honours
SIGUSR1 at most once per 5 s, so `ReloadLimiter` sends at most one per interval (5.25 s: 5 s and a margin) and
one trailing signal for the changes that came in between (the last mapping always reaches IMEX).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import structlog

from dra_driver.errors import DraDriverError

log = structlog.get_logger(__name__)

IMEX_BINARY: Final = "nvidia-imex"
IMEX_CTL_BINARY: Final = "nvidia-imex-ctl"
# IMEX's 5 s plus a margin: a signal sent exactly 5 s after the last might reach IMEX a hair early and be dropped.
RELOAD_INTERVAL_S: Final = 5.25
READY_OUTPUT: Final = "READY\n"  # what `nvidia-imex-ctl -q` prints on a node whose IMEX reached quorum
QUERY_TIMEOUT_S: Final = 10.0
STOP_GRACE_S: Final = 10.0


class ImexNotFound(DraDriverError):
    """nvidia-imex or nvidia-imex-ctl is neither in --imex-bin-dir nor on PATH."""


def find_binary(name: str, bin_dir: str, environ: dict[str, str] | None = None) -> str:
    """`bin_dir/name` when bin_dir is given, else the first `name` on PATH."""
    directories = [bin_dir] if bin_dir else (environ or dict(os.environ)).get("PATH", "").split(os.pathsep)
    for directory in directories:
        candidate = Path(directory or ".", name)
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    where = f"in --imex-bin-dir {bin_dir}" if bin_dir else "on PATH"
    raise ImexNotFound(f"{name} not found {where}: the daemon image ships it, or pass --imex-bin-dir")


@dataclass
class ReloadLimiter:
    """At most one reload per `interval`, and a trailing one for what was asked in between."""

    interval: float = RELOAD_INTERVAL_S
    last_sent: float | None = None
    pending: bool = False

    def request(self, now: float) -> bool:
        """A reload was asked for: True when it may be sent now (then it counts as sent)."""
        if self.last_sent is None or now - self.last_sent >= self.interval:
            self.last_sent, self.pending = now, False
            return True
        self.pending = True
        return False

    def due(self, now: float) -> bool:
        """True when a trailing reload is due now (then it counts as sent)."""
        if self.pending and self.last_sent is not None and now - self.last_sent >= self.interval:
            self.last_sent, self.pending = now, False
            return True
        return False

    def next_due(self) -> float | None:
        return self.last_sent + self.interval if self.pending and self.last_sent is not None else None


@dataclass
class ImexProcess:
    """One `nvidia-imex -c <config>` child: started once, restarted by the watchdog when it dies, signalled for
    reloads, stopped with SIGTERM (SIGKILL after `stop_grace`)."""

    binary: str
    config_path: str
    clock: Callable[[], float] = time.monotonic
    stop_grace: float = STOP_GRACE_S
    limiter: ReloadLimiter = field(default_factory=ReloadLimiter)
    starts: int = 0
    reloads_sent: int = 0
    _child: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def start(self) -> None:
        # No pipes: IMEX logs to stderr (LOG_FILE_NAME empty), which is the container's log.
        self._child = subprocess.Popen([self.binary, "-c", self.config_path], stdin=subprocess.DEVNULL)
        self.starts += 1
        # A fresh IMEX reads the current mapping itself; and no SIGUSR1 before it can have installed its handler
        # (the signal's default action ends a process): the start counts as the last reload.
        self.limiter = ReloadLimiter(self.limiter.interval, last_sent=self.clock())
        log.info("started nvidia-imex", binary=self.binary, config=self.config_path, pid=self._child.pid,
                 start=self.starts)

    def watchdog(self) -> bool:
        """Restart IMEX when it has died; True when it did."""
        if self._child is None:
            return False
        code = self._child.poll()
        if code is None:
            return False
        log.warning("nvidia-imex exited; restarting it", pid=self._child.pid, status=code)
        self.start()
        return True

    def reload(self) -> None:
        """The hosts mapping changed: SIGUSR1 now, or as the trailing signal once the interval has passed."""
        if self.limiter.request(self.clock()):
            self._signal_reload()

    def tick(self) -> None:
        if self.limiter.due(self.clock()):
            self._signal_reload()

    def _signal_reload(self) -> None:
        child = self._child
        if child is None or child.poll() is not None:
            return  # the watchdog's fresh start reads the current mapping
        child.send_signal(signal.SIGUSR1)
        self.reloads_sent += 1
        log.info("sent SIGUSR1 to nvidia-imex: peers changed", pid=child.pid)

    def stop(self) -> int | None:
        child, self._child = self._child, None
        if child is None:
            return None
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(self.stop_grace)
            except subprocess.TimeoutExpired:
                log.warning("nvidia-imex ignored SIGTERM; killing it", pid=child.pid, grace_s=self.stop_grace)
                child.kill()
                child.wait()
        return child.returncode


def query_ready(ctl_binary: str, config_path: str, timeout: float = QUERY_TIMEOUT_S) -> bool:
    """`nvidia-imex-ctl -c <config> -q` printed exactly READY (NVIDIA's check; anything else is not ready)."""
    try:
        done = subprocess.run([ctl_binary, "-c", config_path, "-q"], capture_output=True, timeout=timeout,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("readiness query failed", binary=ctl_binary, error=str(exc))
        return False
    return done.returncode == 0 and done.stdout == READY_OUTPUT.encode()
