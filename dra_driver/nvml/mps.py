"""The MPS control daemon as the plugin sees it: what one daemon serves and which limits it enforces.

MPS (Multi-Process Service) is not part of NVML, but like the time-slice it is per-device hardware state the plugin
changes and must find again after a restart, so it sits beside the NVML backend: the fake backend keeps daemons in
its state file (they survive a plugin restart like real processes do), the real one runs the host driver's
`nvidia-cuda-mps-control` (`dra_driver/nvml/real/mps.py`).

One daemon has its own directory `<mps-root>/<id>/` (`--mps-root`, default `<plugin-dir>/mps`) holding `pipe/`
(CUDA_MPS_PIPE_DIRECTORY: the control and server sockets), `log/` (CUDA_MPS_LOG_DIRECTORY: control.log, server.log)
and `shm/` (shared memory between clients and the server; mounted as /dev/shm into every client). The plugin
creates the directories and the compute mode; the control here starts, re-limits, checks and stops the daemon
process itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

PIPE_DIR = "pipe"
LOG_DIR = "log"
SHM_DIR = "shm"


@dataclass(frozen=True)
class MpsShareLimits:
    """The limits of one consumable-capacity share served by a daemon (handed to its clients by CDI env)."""

    share_id: str
    claim: str  # namespace/name, for people reading the state
    active_thread_percentage: int | None = None
    pinned_memory_limit: int | None = None  # bytes


@dataclass(frozen=True)
class MpsDaemonSpec:
    """What one control daemon serves and the limits it sets on its servers.

    `visible_uuids` is the daemon's CUDA_VISIBLE_DEVICES (GPU UUIDs, or MIG UUIDs), sorted. The limits are the
    daemon-wide defaults every server (so every client) gets: `active_thread_percentage` (1-100, None: MPS'
    default of 100) and `pinned_memory_limits` (visible UUID -> bytes; absent: no limit). `shares` lists the
    consumable-capacity shares on the daemon and their own, narrower limits."""

    id: str
    directory: str  # host path <mps-root>/<id>
    visible_uuids: tuple[str, ...]
    active_thread_percentage: int | None = None
    pinned_memory_limits: Mapping[str, int] = field(default_factory=dict)
    shares: tuple[MpsShareLimits, ...] = ()
    # `-M`: one server serves clients of every UID (Volta and newer). Without it a server belongs to one UID and
    # clients of another wait until it is idle, so containers of different users would take turns, not share.
    multi_user: bool = False

    @property
    def pipe_directory(self) -> str:
        return f"{self.directory}/{PIPE_DIR}"

    @property
    def log_directory(self) -> str:
        return f"{self.directory}/{LOG_DIR}"

    @property
    def shm_directory(self) -> str:
        return f"{self.directory}/{SHM_DIR}"


@dataclass(frozen=True)
class MpsDaemonStatus:
    """A daemon as found: running (answering its control pipe) or not, and the limits it reports."""

    id: str
    running: bool
    pid: int | None = None
    active_thread_percentage: int | None = None
    pinned_memory_limits: Mapping[str, int] = field(default_factory=dict)
    detail: str = ""  # why it is not running, for logs and repair messages


class MpsError(Exception):
    """Starting, limiting or stopping a daemon failed; the message says what and where to look (control.log)."""


@runtime_checkable
class MpsControl(Protocol):
    def start(self, spec: MpsDaemonSpec) -> None:
        """Make the daemon of `spec.id` run with `spec`'s limits. Idempotent: a daemon already running in
        `spec.directory` is kept (adopted after a plugin restart) and only re-limited, including servers that are
        already running. The directories exist (the plugin made them). Raises MpsError."""

    def status(self, spec: MpsDaemonSpec) -> MpsDaemonStatus:
        """Whether the daemon of `spec` runs and answers; never raises for a daemon that is simply gone."""

    def stop(self, spec: MpsDaemonSpec) -> None:
        """Stop the daemon (and its servers). Idempotent: a daemon that does not run is a success. The plugin
        removes the directories afterwards. Raises MpsError when a running daemon cannot be stopped."""
