"""The fake node's NVIDIA kernel driver: loaded or not, which version, and how often it was (re)loaded.

A real node's driver comes and goes under the plugin: the GPU Operator's driver container installs it after the
plugin started (NVIDIA/k8s-dra-driver-gpu#1008), and a driver upgrade unloads the `nvidia` module and loads
another version while the plugin runs (NVIDIA/k8s-driver-manager#203). The fake copies what a process holding
NVML sees:

- unloaded: `nvmlInit` fails with DRIVER_NOT_LOADED; on a handle opened earlier, every call about a GPU raises
  GPU_IS_LOST and every other call DRIVER_NOT_LOADED;
- loaded again (a new *generation*): a handle opened before still fails, with UNINITIALIZED, until the process
  calls shutdown() and init() again; the new driver reports its version, and what lived in the old driver is gone
  (MIG GPU/compute instances, MPS daemons, busy processes, compute mode, time-slice, persistence mode; MIG mode
  itself is kept, as the GPU keeps it across a module reload).

With a state file, the driver lives in a sidecar `<state>.driver` (JSON), so a test or `dra-sandbox` in another
process can unload and reload the driver of a fake node a running plugin uses. Checking it costs one stat per
NVML call (the file is re-read only when its inode, mtime or size changed).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from dra_driver.fsutil import atomic_write


@dataclass(frozen=True)
class FakeDriver:
    """The fake's kernel driver: loaded or not, its version and load generation."""

    loaded: bool
    version: str  # the version loaded now, or the one loaded last while unloaded
    generation: int = 0  # +1 at every load; NVML handles opened in an earlier generation are stale


def driver_file(state_path: Path | str) -> Path:
    return Path(f"{state_path}.driver")


def _encode(driver: FakeDriver) -> bytes:
    return json.dumps({"loaded": driver.loaded, "version": driver.version, "generation": driver.generation}).encode()


def _decode(data: bytes, path: Path) -> FakeDriver:
    try:
        doc = json.loads(data)
        loaded, version, generation = doc["loaded"], doc["version"], doc["generation"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a fake driver file ({exc}); delete it to start with the driver loaded") from exc
    if not isinstance(loaded, bool) or not isinstance(version, str) or not isinstance(generation, int):
        raise ValueError(f"{path}: loaded must be a bool, version a string, generation an integer")
    return FakeDriver(loaded=loaded, version=version, generation=generation)


class DriverStore:
    """Where one FakeNvml keeps its driver: in memory, or in the state file's sidecar (shared between processes)."""

    def __init__(self, initial: FakeDriver, state_path: Path | None) -> None:
        self._path = driver_file(state_path) if state_path is not None else None
        self._lock = threading.Lock()
        self._memory = initial
        self._seen: tuple[int, int, int] | None = None  # (inode, mtime_ns, size) of the sidecar last read
        if self._path is not None and not initial.loaded and not self._path.exists():
            self.write(initial)  # `driver=absent`: the node starts without a driver (the first process decides)

    def read(self) -> FakeDriver:
        if self._path is None:
            with self._lock:
                return self._memory
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            with self._lock:
                return self._memory  # never unloaded or reloaded: the node file's driver
        key = (st.st_ino, st.st_mtime_ns, st.st_size)  # each write is a rename: a new inode
        with self._lock:
            if key == self._seen:
                return self._memory
        driver = _decode(self._path.read_bytes(), self._path)
        with self._lock:
            self._memory, self._seen = driver, key
            return driver

    def write(self, driver: FakeDriver) -> None:
        with self._lock:
            self._memory = driver
            self._seen = None
            if self._path is not None:
                atomic_write(self._path, _encode(driver), mode=0o600)
