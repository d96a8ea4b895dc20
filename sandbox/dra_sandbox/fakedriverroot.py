"""A fake 570-series NVIDIA driver root: the files and symlinks the driver's installer puts on a node.

The layout follows what NVIDIA's driver installs on a Debian/Ubuntu host (the GPU Operator's driver container uses
the same layout under /run/nvidia/driver), as `nvidia-ctk cdi generate` finds it (docs/reference/cdi-toolkit.md):
versioned libraries `lib*.so.<version>` with their soname links (`libcuda.so.1 -> libcuda.so.<version>`) and the
development link `libcuda.so -> libcuda.so.1`, the tools in `usr/bin`, the GSP firmware in
`lib/firmware/nvidia/<version>/`, the Vulkan/EGL/GLVND JSON files in `usr/share`, the persistenced and fabric manager
sockets in `run/`, and, in a separate fake dev root and proc root, the device nodes (plain files: nothing opens them)
and the MIG capability files (`/proc/driver/nvidia/capabilities/gpu<N>/mig/gi<G>/ci<C>/access`).

Every library file holds its own name as its content, so a test can tell through a bind mount which real file a
name resolves to. `compile_stand_ins` replaces libcuda, libnvidia-ml and nvidia-smi with real ELF objects (built
with gcc) so a container's dynamic loader can be made to resolve them.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DRIVER_VERSION = "570.133.20"
LIB_DIR = "usr/lib/x86_64-linux-gnu"


@dataclass(frozen=True)
class FakeLibrary:
    """One driver library: `<stem>.so.<version>` plus its links (soname, then the development name)."""

    stem: str  # e.g. "libcuda"
    soname_suffix: str | None = "1"  # libcuda.so.1; None: the soname is the versioned name itself
    dev_link: bool = False  # libcuda.so -> libcuda.so.1
    version: str | None = None  # None: the driver version (the egl-gbm/wayland libraries have their own)


# Compute, utility and video libraries (NVIDIA_DRIVER_CAPABILITIES compute,utility,video).
COMPUTE_LIBRARIES: tuple[FakeLibrary, ...] = (
    FakeLibrary("libcuda", "1", dev_link=True),
    FakeLibrary("libnvidia-ml", "1", dev_link=True),
    FakeLibrary("libnvidia-ptxjitcompiler", "1", dev_link=True),
    FakeLibrary("libnvidia-nvvm", "4", dev_link=True),
    FakeLibrary("libcudadebugger", "1"),
    FakeLibrary("libnvidia-opencl", "1"),
    FakeLibrary("libnvidia-gpucomp", None),
    FakeLibrary("libnvidia-allocator", "1", dev_link=True),
    FakeLibrary("libnvidia-cfg", "1", dev_link=True),
    FakeLibrary("libnvidia-nscq", "2", dev_link=True),
    FakeLibrary("libnvidia-pkcs11", None),
    FakeLibrary("libnvidia-pkcs11-openssl3", None),
    FakeLibrary("libnvcuvid", "1", dev_link=True),
    FakeLibrary("libnvidia-encode", "1", dev_link=True),
    FakeLibrary("libnvidia-opticalflow", "1", dev_link=True),
)
# Graphics (GL, EGL, GLX, GLES, Vulkan, OptiX, FBC): installed by the driver, not injected by this driver.
GRAPHICS_LIBRARIES: tuple[FakeLibrary, ...] = (
    FakeLibrary("libEGL_nvidia", "0"),
    FakeLibrary("libGLX_nvidia", "0"),
    FakeLibrary("libGLESv2_nvidia", "2"),
    FakeLibrary("libGLESv1_CM_nvidia", "1"),
    FakeLibrary("libnvidia-glcore", None),
    FakeLibrary("libnvidia-eglcore", None),
    FakeLibrary("libnvidia-glsi", None),
    FakeLibrary("libnvidia-tls", None),
    FakeLibrary("libnvidia-glvkspirv", None),
    FakeLibrary("libnvidia-rtcore", None),
    FakeLibrary("libnvoptix", "1"),
    FakeLibrary("libnvidia-fbc", "1", dev_link=True),
    FakeLibrary("libnvidia-egl-gbm", "1", version="1.1.2"),
    FakeLibrary("libnvidia-egl-wayland", "1", version="1.1.17"),
)
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
CONFIG_FILES = (
    "usr/share/vulkan/icd.d/nvidia_icd.json",
    "usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
    "usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    "usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
    "usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
    "usr/share/nvidia/nvoptix.bin",
)
SOCKETS = ("run/nvidia-persistenced/socket", "run/nvidia-fabricmanager/socket")
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


@dataclass(frozen=True)
class FakeDriverRoot:
    root: Path  # the driver root (what --driver-root names)
    dev_root: Path  # the node's /dev
    proc_root: Path  # the node's /proc
    version: str = DRIVER_VERSION

    @property
    def lib_dir(self) -> Path:
        return self.root / LIB_DIR

    def library_path(self, stem: str, version: str | None = None) -> Path:
        return self.lib_dir / f"{stem}.so.{version or self.version}"

    def add_mig_instance(self, minor: int, gi: int, ci: int, gi_cap_minor: int, ci_cap_minor: int) -> None:
        """A MIG instance's capability files in proc and its two /dev/nvidia-caps nodes, as the driver creates them."""
        mig = self.proc_root / "driver/nvidia/capabilities" / f"gpu{minor}" / "mig"
        for access, cap_minor in ((mig / f"gi{gi}" / "access", gi_cap_minor),
                                  (mig / f"gi{gi}" / f"ci{ci}" / "access", ci_cap_minor)):
            access.parent.mkdir(parents=True, exist_ok=True)
            access.write_text(f"DeviceFileMinor: {cap_minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
            _touch(self.dev_root / "nvidia-caps" / f"nvidia-cap{cap_minor}")


def build_driver_root(base: Path, *, gpus: int = 2, version: str = DRIVER_VERSION) -> FakeDriverRoot:
    """Lay out `base/driver`, `base/dev` and `base/proc` as a node with `gpus` GPUs and the `version` driver."""
    tree = FakeDriverRoot(base / "driver", base / "dev", base / "proc", version)
    tree.lib_dir.mkdir(parents=True, exist_ok=True)
    for lib in (*COMPUTE_LIBRARIES, *GRAPHICS_LIBRARIES):
        _install_library(tree.lib_dir, lib, lib.version or version)
    # GBM's backend name for the allocator (a relative link into the library dir, as the installer makes it).
    (tree.lib_dir / "gbm").mkdir(exist_ok=True)
    _link(tree.lib_dir / "gbm" / "nvidia-drm_gbm.so", "../libnvidia-allocator.so.1")
    for name in BINARIES:
        path = tree.root / "usr/bin" / name
        _write(path, f"{name} {version}\n")
        path.chmod(0o755)
    for name in FIRMWARE:
        _write(tree.root / "lib/firmware/nvidia" / version / name, f"{name}\n")
    for rel in CONFIG_FILES:
        _write(tree.root / rel, f'{{"file": "{Path(rel).name}"}}\n')
    for rel in SOCKETS:
        path = tree.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        # A socket inode made by mknod: no path-length limit (tmp dirs can be longer than sun_path), no listener.
        os.mknod(path, stat.S_IFSOCK | 0o666)
    for name in (*(f"nvidia{i}" for i in range(gpus)), *CONTROL_NODES):
        _touch(tree.dev_root / name)
    (tree.dev_root / "nvidia-caps").mkdir(parents=True, exist_ok=True)
    params = tree.proc_root / "driver/nvidia/params"
    _write(params, "ModifyDeviceFiles: 1\nDeviceFileUID: 0\nDeviceFileGID: 0\nDeviceFileMode: 438\n")
    return tree


def _install_library(lib_dir: Path, lib: FakeLibrary, version: str) -> None:
    real = f"{lib.stem}.so.{version}"
    _write(lib_dir / real, f"{real}\n")
    if lib.soname_suffix is not None:
        soname = f"{lib.stem}.so.{lib.soname_suffix}"
        _link(lib_dir / soname, real)
        if lib.dev_link:
            _link(lib_dir / f"{lib.stem}.so", soname)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(path):
        path.unlink()
    path.symlink_to(target)


# Stand-ins that really load: libcuda and libnvidia-ml export one function each; nvidia-smi links libnvidia-ml.so.1
# (as the real one does), dlopens libcuda.so.1 by soname, and prints where the loader found each library.
_LIBCUDA_C = 'int cuDriverGetVersion(int *v) { *v = 12080; return 0; }\n'
_LIBNVML_C = 'const char *nvmlFakeDriverVersion(void) { return "%s"; }\n'
_SMI_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
const char *nvmlFakeDriverVersion(void);
int main(void) {
    struct link_map *map = 0;
    int (*get)(int *);
    int v = 0;
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (nvml && dlinfo(nvml, RTLD_DI_LINKMAP, &map) == 0) printf("NVML %s %s\n", map->l_name, nvmlFakeDriverVersion());
    if (!cuda) { printf("NOCUDA %s\n", dlerror()); return 3; }
    get = (int (*)(int *))dlsym(cuda, "cuDriverGetVersion");
    if (get) get(&v);
    if (dlinfo(cuda, RTLD_DI_LINKMAP, &map) == 0) printf("CUDA %s %d\n", map->l_name, v);
    return 0;
}
"""


class StandInBuildError(RuntimeError):
    """gcc could not build the stand-in ELF objects."""


def compile_stand_ins(tree: FakeDriverRoot, gcc: str = "gcc") -> None:
    """Replace libcuda.so.<v>, libnvidia-ml.so.<v> and usr/bin/nvidia-smi with real ELF objects (sonames set)."""
    compiler = shutil.which(gcc)
    if compiler is None:
        raise StandInBuildError(f"{gcc!r} not found")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cuda_src, nvml_src, smi_src = work / "cuda.c", work / "nvml.c", work / "smi.c"
        cuda_src.write_text(_LIBCUDA_C)
        nvml_src.write_text(_LIBNVML_C % tree.version)
        smi_src.write_text(_SMI_C)
        _cc(compiler, ["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(tree.library_path("libcuda")),
                       str(cuda_src)])
        _cc(compiler, ["-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o",
                       str(tree.library_path("libnvidia-ml")), str(nvml_src)])
        _cc(compiler, ["-o", str(tree.root / "usr/bin/nvidia-smi"), str(smi_src), f"-L{tree.lib_dir}",
                       "-lnvidia-ml", "-ldl"])


def _cc(compiler: str, args: Sequence[str]) -> None:
    proc = subprocess.run([compiler, *args], capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise StandInBuildError(f"gcc {' '.join(args)} failed: {proc.stderr.strip()[-400:]}")
