"""Shared helpers for the benchmarks: percentiles, a sandbox API server with claims, output."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

SHORT = os.environ.get("BENCH_SHORT") == "1"
# BENCH_SIZE=medium: the full benches' shapes (64 GPUs, 64 concurrent callers) with fewer repetitions, so a
# before/after pair fits in a few minutes on a shared machine. BENCH_SHORT=1 wins over it.
# Any other value is refused: a typo (BENCH_SIZE=small) once ran the full sizes without a word.
_SIZE = os.environ.get("BENCH_SIZE", "")
if _SIZE not in ("", "medium", "full"):
    raise SystemExit(f"BENCH_SIZE={_SIZE!r} is not a size the benches know: use 'medium', 'full' or leave it unset")
MEDIUM = not SHORT and _SIZE == "medium"


def sized(short: int, medium: int, full: int) -> int:
    """The repetition count for the size this run was asked for."""
    return short if SHORT else medium if MEDIUM else full


def percentile(samples: Sequence[float], pct: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    k = (len(ordered) - 1) * pct / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary_ms(samples: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(samples),
        "p50_ms": round(percentile(samples, 50) * 1000, 3),
        "p99_ms": round(percentile(samples, 99) * 1000, 3),
        "mean_ms": round(statistics.fmean(samples) * 1000, 3) if samples else float("nan"),
    }


# Packages the dev venv has (import-linter and pytest bring them) but the image does not (requirements/image.lock),
# which the plugin still imports where they are installed: structlog loads rich (and rich pygments) when it finds
# it, ≈ 4 MiB of RSS and ≈ 80 modules that no node runs. The benches start the plugin without them.
DEV_ONLY_IMPORTS = ("rich",)


# The image's environment that changes how the plugin runs (Dockerfile `ENV`), set for the bench's plugin too.
IMAGE_ENV = {"MALLOC_ARENA_MAX": "2"}


def image_like_pythonpath(work: Path, pythonpath: str) -> str:
    """`pythonpath` with a directory first in which each of DEV_ONLY_IMPORTS refuses to import, as it would be
    missing in the image (the plugin's optional imports then take the path they take there)."""
    shadow = work / "image-like-imports"
    for name in DEV_ONLY_IMPORTS:
        (shadow / name).mkdir(parents=True, exist_ok=True)
        (shadow / name / "__init__.py").write_text(
            f"raise ImportError('{name}: in the dev venv only, not in the image (bench.common.DEV_ONLY_IMPORTS)')\n"
        )
    return os.pathsep.join([str(shadow), *filter(None, pythonpath.split(os.pathsep))])


def cpu_seconds_from_stat(stat: str, clock_ticks: int) -> float:
    """utime + stime (fields 14 and 15 of a /proc/<pid>/stat text) in seconds; the command name may hold spaces and
    ')', so the fields are counted from its last ')'."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / clock_ticks


def system_seconds_from_stat(stat: str, clock_ticks: int) -> float:
    """stime alone (field 15): the kernel's share of `cpu_seconds_from_stat` (fsyncs, file creation, thread
    hand-offs)."""
    return int(stat.rsplit(")", 1)[1].split()[12]) / clock_ticks


def rss_mib_from_status(status: str) -> float:
    """VmRSS of a /proc/<pid>/status text in MiB; NaN when the process has none (a zombie)."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def rss_mib() -> float:
    return rss_mib_from_status(Path("/proc/self/status").read_text())


def many_gpus_node(path: Path, count: int) -> str:
    """A fake node file with `count` L4 GPUs (enough distinct devices for wide concurrency)."""
    path.write_text(
        "name: bench\n"
        'driver_version: "580.105.08"\n'
        "cuda_driver_version: 13000\n"
        'numa_nodes:\n  0: "0-63"\n'
        "nvlink: none\nfabric: none\n"
        "gpus:\n" + "".join(f"  - model: L4\n    count: {min(16, count - i)}\n" for i in range(0, count, 16))
    )
    return f"fake:{path}"


def filesystem_of(path: Path, mounts: str) -> str:
    """The type of the filesystem `path` lies on, from a /proc/mounts text: that of the longest mount point above it
    ("?" where none is; mount points with spaces are written with octal escapes there and are not matched)."""
    best, kind = -1, "?"
    target = os.path.normpath(path)
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1]
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, kind = len(point), fields[2]
    return kind


def filesystem(path: Path) -> str:
    """`filesystem_of` this machine's mounts, e.g. "tmpfs" or "ext4"."""
    try:
        return filesystem_of(path.absolute(), Path("/proc/mounts").read_text())
    except OSError:
        return "?"


def work_dir(prefix: str) -> Path:
    """A fresh directory for a bench's plugin dirs and state (the caller removes it): under `BENCH_WORK_DIR` where
    set, else /tmp. This VM's root filesystem is an ext4 without a journal, whose inode allocator skips every inode
    freed in the last seconds: while a bench creates and removes files by the thousand, each new file costs the
    plugin 0.3-0.6 ms of system CPU instead of ≈ 15 µs, and the plugin's CPU per claim moves by ±1 ms between runs.
    BENCH_WORK_DIR on a journaled filesystem (docs/benchmarks.md "Where the benches' files lie" has the three
    commands for an ext4 on a loop device) measures what a node's disk costs instead."""
    base = os.environ.get("BENCH_WORK_DIR") or "/tmp"
    if not os.path.isdir(base):
        raise SystemExit(f"BENCH_WORK_DIR={base!r} is not a directory: create it (or leave it unset for /tmp)")
    return Path(tempfile.mkdtemp(dir=base, prefix=prefix))


SHM = Path("/dev/shm")


@contextlib.contextmanager
def runtime_dir(prefix: str) -> Iterator[Path]:
    """A fresh directory for what a node keeps under /run, removed after: on a tmpfs where this machine has one at
    /dev/shm, else under /tmp. Why: the container runtime's CDI dir /var/run/cdi (containerd's and CRI-O's default)
    lies on /run, a tmpfs on systemd hosts and in kind's nodes, so a CDI spec costs a node no disk I/O; a bench that
    wrote specs to a disk would charge each plugin (ours writes two specs per claim, the example driver one) for
    inodes and fsyncs no node pays (docs/benchmarks.md "Where the benches' files lie")."""
    base = SHM if SHM.is_dir() and filesystem(SHM) == "tmpfs" and os.access(SHM, os.W_OK) else Path("/tmp")
    path = Path(tempfile.mkdtemp(dir=base, prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def emit(name: str, results: dict[str, Any]) -> None:
    print(f"== {name}")
    print(json.dumps(results, indent=2))
