"""Small static C programs the bench runs inside containers (the runtime probe, the pause image's binary), compiled
here with `gcc -static` once per source text."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path


class StaticBuildError(RuntimeError):
    """A static program could not be compiled (no gcc, no static libc): the message says which and what to install."""


def static_binary(cache_dir: Path, name: str, source: str, *, flags: Sequence[str], gcc: str = "gcc") -> Path:
    """`source` compiled by `gcc -static <flags>` into `cache_dir/<name>-<digest of source>`, once per source
    (atomically: parallel callers are safe); StaticBuildError where it cannot be."""
    target = cache_dir / f"{name}-{hashlib.sha256(source.encode()).hexdigest()[:16]}"
    if target.is_file() and os.access(target, os.X_OK):
        return target
    compiler = shutil.which(gcc)
    if compiler is None:
        raise StaticBuildError(f"{gcc!r} not found: the {name} program is compiled here (`make system-deps` installs "
                               "gcc and libc6-dev)")
    cache_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".build-") as tmp:
        src = Path(tmp) / f"{name}.c"
        src.write_text(source)
        out = Path(tmp) / name
        proc = subprocess.run([compiler, "-static", *flags, "-o", str(out), str(src)], capture_output=True,
                              text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise StaticBuildError(f"gcc -static failed for the {name} program (is libc6-dev installed?): "
                                   f"{proc.stderr.strip()[-500:]}")
        out.chmod(0o755)
        os.replace(out, target)
    return target
