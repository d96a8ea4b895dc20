"""The --driver-root preload, proven with the real dynamic loader instead of patches.

A tiny C library with DT_SONAME libnvidia-ml.so.1 is built under a fake driver root (laid out like a
real driver: a versioned file plus the soname symlink). In a fresh interpreter (pynvml keeps its
library handle in a module global) RealNvml preloads it by path; pynvml's own
dlopen("libnvidia-ml.so.1") must then resolve to that object, which we see from the driver
version it reports. Without the driver root the same process cannot find any NVML at all.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FAKE_NVML_C = r"""
#include <stdlib.h>
#include <string.h>
int nvmlInitWithFlags(unsigned int flags) {
    const char *rc = getenv("FAKE_NVML_INIT_RC");
    (void)flags;
    return rc ? atoi(rc) : 0;
}
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int code) { (void)code; return "fake"; }
int nvmlSystemGetDriverVersion(char *buf, unsigned int len) {
    strncpy(buf, "999.88.77", len);
    return 0;
}
int nvmlSystemGetNVMLVersion(char *buf, unsigned int len) {
    strncpy(buf, "13.999.88.77", len);
    return 0;
}
int nvmlSystemGetCudaDriverVersion_v2(int *version) {
    *version = 13010;
    return 0;
}
"""

PROBE = """
import sys
from dra_driver.nvml.real.backend import RealNvml
from dra_driver.nvml.types import NvmlUnavailableError
root = sys.argv[1] or None
backend = RealNvml(driver_root=root, environ={})
try:
    backend.init()
except NvmlUnavailableError as exc:
    print("UNAVAILABLE", exc)
    raise SystemExit(0)
info = backend.system_info()
print("OK", info.driver_version, info.cuda_version, backend.library_path)
backend.shutdown()
"""

CC = shutil.which("cc") or shutil.which("gcc")


def _real_nvml_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


pytestmark = [
    pytest.mark.skipif(CC is None, reason="needs a C compiler to build the stand-in libnvidia-ml"),
    pytest.mark.skipif(sys.platform != "linux", reason="glibc dlopen semantics"),
]


@pytest.fixture(scope="module")
def driver_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("driver-root")
    libdir = root / "usr" / "lib64"
    libdir.mkdir(parents=True)
    source = root / "fake_nvml.c"
    source.write_text(FAKE_NVML_C)
    versioned = libdir / "libnvidia-ml.so.999.88.77"
    assert CC is not None
    subprocess.run(
        [CC, "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(versioned), str(source)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    (libdir / "libnvidia-ml.so.1").symlink_to(versioned.name)
    return root


def probe(root: Path | None, **extra_env: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in {"LD_LIBRARY_PATH", "LD_PRELOAD"}}
    env.update(extra_env)
    repo = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = str(repo)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(root) if root else ""],
        capture_output=True,
        text=True,
        env=env,
        cwd=repo,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def test_pynvml_soname_load_resolves_to_the_preloaded_driver_root_file(driver_root: Path) -> None:
    out = probe(driver_root)
    assert out == f"OK 999.88.77 13.1 {driver_root / 'usr/lib64/libnvidia-ml.so.1'}"


@pytest.mark.skipif(_real_nvml_present(), reason="a real NVML is installed, so the loader search would succeed")
def test_without_the_driver_root_the_same_process_finds_no_nvml(driver_root: Path) -> None:
    out = probe(None)
    assert out.startswith("UNAVAILABLE NVML is unavailable: libnvidia-ml.so.1 was not found")


def test_driver_not_loaded_from_the_real_library_names_the_file(driver_root: Path) -> None:
    out = probe(driver_root, FAKE_NVML_INIT_RC="9")
    lib = driver_root / "usr/lib64/libnvidia-ml.so.1"
    assert out.startswith(f"UNAVAILABLE NVML is unavailable: {lib} was loaded but the NVIDIA kernel driver")
    assert "modprobe nvidia" in out
