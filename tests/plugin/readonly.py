"""A really read-only directory for tests: EACCES for a non-root user (mode 0555), EROFS for root (a read-only
bind mount of the directory onto itself). Skips where neither is possible."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    if os.geteuid() != 0:
        mode = stat.S_IMODE(path.stat().st_mode)
        os.chmod(path, 0o555)
        try:
            yield
        finally:
            os.chmod(path, mode)
        return
    target = str(path)
    bound = subprocess.run(["mount", "--bind", target, target], capture_output=True, text=True, check=False)
    if bound.returncode != 0:
        pytest.skip(f"root without mount rights cannot make {path} read-only: {bound.stderr.strip()}")
    try:
        remount = subprocess.run(
            ["mount", "-o", "remount,ro,bind", target], capture_output=True, text=True, check=False
        )
        if remount.returncode != 0:
            pytest.skip(f"cannot remount {path} read-only: {remount.stderr.strip()}")
        yield
    finally:
        subprocess.run(["umount", target], check=True)
