"""A recording fake of the durability primitives (`os.fsync`, `os.replace`, `os.unlink`, `os.mkdir`): each call
is recorded in order with its path, then done for real, so a test can assert what was made durable, in which order,
and before which answer."""

from __future__ import annotations

import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Op:
    kind: str  # "fsync-file", "fsync-dir", "rename", "unlink", "mkdir"
    path: Path  # the file or directory (a rename's target)
    ok: bool = True  # False: the call raised (e.g. mkdir's EEXIST)


class DurabilityLog:
    """Records the primitives of every thread, in call order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ops: list[Op] = []
        self._lock = threading.Lock()
        real_fsync, real_replace, real_unlink, real_mkdir = os.fsync, os.replace, os.unlink, os.mkdir

        def fsync(fd: int) -> None:
            is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
            self._add("fsync-dir" if is_dir else "fsync-file", os.readlink(f"/proc/self/fd/{fd}"))
            real_fsync(fd)

        def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str], **kwargs: object) -> None:
            real_replace(src, dst, **kwargs)  # type: ignore[arg-type]
            self._add("rename", dst)

        def unlink(path: str | os.PathLike[str], **kwargs: object) -> None:
            real_unlink(path, **kwargs)  # type: ignore[arg-type]
            self._add("unlink", path)

        def mkdir(path: str | os.PathLike[str], mode: int = 0o777, **kwargs: object) -> None:
            try:
                real_mkdir(path, mode, **kwargs)  # type: ignore[arg-type]
            except OSError:
                self._add("mkdir", path, ok=False)
                raise
            self._add("mkdir", path)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(os, "unlink", unlink)
        monkeypatch.setattr(os, "mkdir", mkdir)

    def _add(self, kind: str, path: str | os.PathLike[str], ok: bool = True) -> None:
        with self._lock:
            self.ops.append(Op(kind, Path(os.path.abspath(path)), ok))

    def mark(self) -> int:
        """The position to take `since` from."""
        with self._lock:
            return len(self.ops)

    def since(self, mark: int, under: Path | None = None) -> list[Op]:
        """The ops recorded after `mark`, those at or under `under` only where given."""
        with self._lock:
            ops = self.ops[mark:]
        if under is None:
            return ops
        root = Path(os.path.abspath(under))
        return [op for op in ops if op.path == root or op.path.is_relative_to(root)]


def durable_renames(ops: list[Op], directory: Path) -> list[Path]:
    """The renames into `directory` that a later fsync of `directory` covers, in order."""
    directory = Path(os.path.abspath(directory))
    last_sync = max((i for i, op in enumerate(ops) if op.kind == "fsync-dir" and op.path == directory), default=-1)
    return [op.path for op in ops[:last_sync] if op.kind == "rename" and op.path.parent == directory]
