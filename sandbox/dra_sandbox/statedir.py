"""The state dir of `dra-sandbox up` (default `~/.local/state/dra-sandbox`): the files `up`, `down` and
`nvidia-driver` share (docs/sandbox.md "State dir"). Its own module, below the commands that use it, so that
`nvidia-driver` reads it without importing `up` (and through it the e2e runner, which imports `nvidia-driver`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from dra_driver.commands.flags import FlagParser
from dra_sandbox.children import alive, cmdline
from dra_sandbox.paths import Below


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "dra-sandbox"


def add_state_dir_argument(parser: FlagParser) -> None:
    parser.add_argument("--state-dir", type=Path, default=None,
                        help=f"the sandbox's state dir (default {default_state_dir()})")


@dataclass(frozen=True)
class StateDir:
    root: Path

    pid_file = Below("up.pid")
    children_file = Below("children.json")
    ready_file = Below("ready")
    kubeconfig = Below("kubeconfig")  # where SandboxCluster writes it (its work dir is the state dir)
    log_file = Below("up.log")
    cdi_file = Below("cdi-root")  # the CDI dir the plugins write to (the system one when podman runs)

    @classmethod
    def chosen(cls, path: Path | None) -> StateDir:
        """The state dir a `--state-dir` value names (None: the default), as an absolute path."""
        return cls((path or default_state_dir()).expanduser().resolve())

    @property
    def down_command(self) -> str:
        """How to stop the sandbox of this state dir (`--state-dir` only where it is not the default)."""
        return "dra-sandbox down" + ("" if self.root == default_state_dir() else f" --state-dir {self.root}")

    def owner(self) -> int | None:
        """The PID of the live `dra-sandbox up` that owns this state dir, if any."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if is_sandbox_process(pid) else None

    def children(self) -> dict[str, int]:
        try:
            raw = json.loads(self.children_file.read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): int(v) for k, v in raw.items()} if isinstance(raw, dict) else {}

    def clear(self) -> None:
        for path in (self.pid_file, self.children_file, self.ready_file, self.kubeconfig, self.cdi_file):
            path.unlink(missing_ok=True)


def is_sandbox_process(pid: int) -> bool:
    """A live `dra-sandbox up` (the PID may have been reused by something else since it was written)."""
    cmd = cmdline(pid)
    return alive(pid) and "up" in cmd and any("dra_sandbox" in part or "dra-sandbox" in part for part in cmd)
