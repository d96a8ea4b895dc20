"""The node's driver files in a claim's CDI spec (`RealCdiEdits`, for a real node): the GPU's device nodes, the
control nodes, and the driver's user-space libraries, tools, GSP firmware and daemon sockets mounted read-only from
the host driver root, with the container toolkit's hooks where the node has them, so a plain CUDA image works without
the NVIDIA runtime hook (compared with `nvidia-ctk cdi generate` in docs/nvml-real.md). The claim specs themselves
are written by plugin/cdi.py.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_driver.cdi.model import ContainerEdits, DeviceNode, Hook, Mount
from dra_driver.plugin.cdi import (
    CONTAINER_LIB_DIR,
    VFIO_VISIBLE_DEVICES,
    DeviceForCdi,
    device_identity_env,
    device_vfio,
    is_passthrough,
    mps_edits,
    vfio_claim_paths,
    vfio_device_paths,
    visible_edits,
)

# Driver user-space libraries a container gets (globs under the driver root's library dirs): compute, utility and
# video (NVIDIA_DRIVER_CAPABILITIES compute,utility,video). Graphics (GL/EGL/GLX/Vulkan) is left out: see
# docs/nvml-real.md "CDI edits compared with nvidia-ctk".
DRIVER_LIBRARY_GLOBS = (
    "libcuda.so*",
    "libnvidia-ml.so*",
    "libnvidia-ptxjitcompiler.so*",
    "libnvidia-nvvm.so*",
    "libnvidia-gpucomp.so*",
    "libcudadebugger.so*",
    "libnvidia-allocator.so*",
    "libnvidia-cfg.so*",
    "libnvidia-opencl.so*",
    "libnvidia-nscq.so*",
    "libnvidia-pkcs11.so*",
    "libnvidia-pkcs11-openssl3.so*",
    "libnvcuvid.so*",
    "libnvidia-encode.so*",
    "libnvidia-opticalflow.so*",
)
DRIVER_BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
)
LIBRARY_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib", "lib64")
BINARY_DIRS = ("usr/bin", "usr/sbin", "bin")
FIRMWARE_DIRS = ("lib/firmware/nvidia", "usr/lib/firmware/nvidia")
# The driver daemons' sockets, each where a container expects it; `var/run` is tried when `run` lacks it.
IPC_SOCKETS = ("run/nvidia-persistenced/socket", "run/nvidia-fabricmanager/socket")
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
READ_ONLY = ("ro", "nosuid", "nodev", "bind")
SOCKET_OPTIONS = ("ro", "nosuid", "nodev", "bind", "noexec")
# NVIDIA's container runtime hook (legacy mode, the GPU Operator's default runtime) injects the GPUs this variable
# names; "void" makes it inject nothing, so the claim's CDI edits are all a container gets.
VISIBLE_DEVICES_VOID = "NVIDIA_VISIBLE_DEVICES=void"

# The container toolkit's CDI hooks (NVIDIA/nvidia-container-toolkit internal/discover/hooks.go), run at
# createContainer by `nvidia-cdi-hook <name>` or `nvidia-ctk hook <name>`.
HOOK_CREATE_SYMLINKS = "create-symlinks"
HOOK_ENABLE_CUDA_COMPAT = "enable-cuda-compat"
HOOK_UPDATE_LDCACHE = "update-ldcache"
HOOK_DISABLE_DEVICE_NODE_MODIFICATION = "disable-device-node-modification"


@dataclass(frozen=True)
class DriverLibrary:
    """One driver library file and every name the host gives it (the real file, its soname and dev links)."""

    real: Path  # as this process sees it
    names: tuple[str, ...]  # file names in the library dir that resolve to `real`, the real name first


@dataclass(frozen=True)
class RealCdiEdits:
    """Device nodes and driver files for a real node.

    `driver_root` is where this process sees the host driver (e.g. /driver-root in the container);
    `host_driver_root` is the same directory as the runtime on the host sees it (e.g. /). Mount host paths
    are written in host terms; each file appears in the container at its path under the driver root, as
    `nvidia-ctk cdi generate` puts it. `dev_root` is where this process sees the host's /dev, `proc_root` its /proc.

    `hook_path` is the container toolkit's hook program as the runtime on the host finds it (`nvidia-cdi-hook` or
    `nvidia-ctk`), or None where the node has no toolkit. With it, the spec carries the toolkit's hooks
    (create-symlinks, enable-cuda-compat, update-ldcache, disable-device-node-modification) and mounts each
    library once; without it, every name of a library (soname and dev link too) is bound to the real file, both in
    the driver's library dir and in /usr/local/nvidia/lib64, so the loader finds `libcuda.so.1` with no hook
    (docs/nvml-real.md "CDI edits compared with nvidia-ctk").
    """

    driver_root: Path
    host_driver_root: Path = Path("/")
    dev_root: Path = Path("/dev")
    proc_root: Path = Path("/proc")
    hook_path: Path | None = None

    def device_edits(self, device: DeviceForCdi) -> ContainerEdits:
        if device.vfio is not None:
            # The VM's VFIO node only: the GPU is bound to vfio-pci, its /dev/nvidia<minor> serves nothing.
            paths = [p for vfio in device_vfio(device) for p in vfio_device_paths(vfio)]
            vfio_nodes = tuple(self._node(p.removeprefix("/dev/")) for p in paths)
            return ContainerEdits(env=device_identity_env(device), device_nodes=vfio_nodes)
        minor = device.allocatable.gpu.info.minor
        nodes = [self._node(f"nvidia{minor}")]
        if device.gpu_instance_id is not None and device.compute_instance_id is not None:
            caps = self.proc_root / "driver/nvidia/capabilities" / f"gpu{minor}" / "mig"
            for access in (
                caps / f"gi{device.gpu_instance_id}" / "access",
                caps / f"gi{device.gpu_instance_id}" / f"ci{device.compute_instance_id}" / "access",
            ):
                cap_minor = _cap_minor(access)
                if cap_minor is not None:
                    nodes.append(self._node(f"nvidia-caps/nvidia-cap{cap_minor}"))
        return ContainerEdits(env=device_identity_env(device), device_nodes=tuple(nodes))

    def claim_edits(self, devices: Sequence[DeviceForCdi]) -> ContainerEdits:
        if is_passthrough(devices):
            # No driver libraries or control nodes: a VM's process talks to VFIO, not to the nvidia driver.
            api_nodes = tuple(self._node(p.removeprefix("/dev/")) for p in vfio_claim_paths(devices))
            return ContainerEdits(env=(VFIO_VISIBLE_DEVICES,), device_nodes=api_nodes)
        nodes = tuple(self._node(n) for n in CONTROL_NODES if (self.dev_root / n).exists())
        libraries = self.driver_libraries()
        version = driver_version(libraries)
        mounts = (
            self._library_mounts(libraries)
            + self._binary_mounts()
            + self._firmware_mounts(version)
            + self._ipc_mounts()
        )
        visible, mps = visible_edits(devices), mps_edits(devices)
        # CUDA_VISIBLE_DEVICES where exact; never an LD_LIBRARY_PATH (a CDI env entry replaces the image's and the
        # pod's own value).
        cuda_visible = tuple(e for e in visible.env if e.startswith("CUDA_VISIBLE_DEVICES="))
        env = (VISIBLE_DEVICES_VOID, *cuda_visible, *mps.env)
        hooks = self._hooks(libraries, version)
        return ContainerEdits(env=env, device_nodes=nodes, hooks=hooks, mounts=mounts + mps.mounts)

    def _node(self, relative: str) -> DeviceNode:
        container_path = f"/dev/{relative}"
        if self.dev_root == Path("/dev"):
            return DeviceNode(path=container_path)
        # The runtime stats host_path to learn type/major/minor; host /dev is the same inode set.
        return DeviceNode(path=container_path, host_path=container_path)

    def _host_path(self, seen: Path) -> str:
        return str(self.host_driver_root / seen.relative_to(self.driver_root))

    def _container_path(self, seen: Path) -> str:
        return "/" + str(seen.relative_to(self.driver_root))

    def driver_libraries(self) -> tuple[DriverLibrary, ...]:
        """The driver's libraries under the first library dirs that hold them, each with all its host names."""
        found: dict[Path, list[str]] = {}
        seen_names: set[str] = set()
        for lib_dir in LIBRARY_DIRS:
            base = self.driver_root / lib_dir
            if not base.is_dir():
                continue
            for pattern in DRIVER_LIBRARY_GLOBS:
                for path in sorted(base.glob(pattern)):
                    real = path.resolve()
                    if path.name in seen_names or not real.is_file() or not real.is_relative_to(self.driver_root):
                        continue
                    seen_names.add(path.name)
                    found.setdefault(real, []).append(path.name)
        return tuple(DriverLibrary(real, _real_name_first(real, names)) for real, names in found.items())

    def _library_mounts(self, libraries: Sequence[DriverLibrary]) -> tuple[Mount, ...]:
        mounts: list[Mount] = []
        for lib in libraries:
            host, lib_dir = self._host_path(lib.real), self._container_path(lib.real.parent)
            if self.hook_path is not None:
                # The hooks make the links (update-ldcache's ldconfig the sonames, create-symlinks libcuda.so).
                mounts.append(Mount(host, f"{lib_dir}/{lib.real.name}", READ_ONLY))
                continue
            for container_dir in dict.fromkeys((lib_dir, CONTAINER_LIB_DIR)):
                mounts.extend(Mount(host, f"{container_dir}/{name}", READ_ONLY) for name in lib.names)
        return tuple(mounts)

    def _binary_mounts(self) -> tuple[Mount, ...]:
        mounts = []
        for name in DRIVER_BINARIES:
            for bin_dir in BINARY_DIRS:
                path = self.driver_root / bin_dir / name
                if path.is_file():
                    # At its own path (/usr/bin/nvidia-smi), which is on every image's PATH.
                    real = path.resolve()
                    if real.is_relative_to(self.driver_root):
                        mounts.append(Mount(self._host_path(real), self._container_path(path), READ_ONLY))
                    break
        return tuple(mounts)

    def _firmware_mounts(self, version: str | None) -> tuple[Mount, ...]:
        """The GSP firmware of the running driver version (`<fw>/nvidia/<version>/gsp*.bin`)."""
        if version is None:
            return ()
        for fw_dir in FIRMWARE_DIRS:
            base = self.driver_root / fw_dir / version
            files = sorted(p for p in base.glob("gsp*.bin") if p.is_file()) if base.is_dir() else []
            if files:
                return tuple(Mount(self._host_path(p), self._container_path(p), READ_ONLY) for p in files)
        return ()

    def _ipc_mounts(self) -> tuple[Mount, ...]:
        mounts = []
        for rel in IPC_SOCKETS:
            for candidate in (self.driver_root / rel, self.driver_root / "var" / rel):
                # Never resolved: /var/run is often an absolute link to /run, which would leave the driver root.
                if stat_is_socket(candidate):
                    mounts.append(Mount(self._host_path(candidate), f"/{rel}", SOCKET_OPTIONS))
                    break
        return tuple(mounts)

    def _hooks(self, libraries: Sequence[DriverLibrary], version: str | None) -> tuple[Hook, ...]:
        if self.hook_path is None:
            return ()
        hooks: list[Hook] = []
        cuda = next((lib for lib in libraries if lib.real.name.startswith("libcuda.so.")), None)
        if cuda is not None:
            link = f"{self._container_path(cuda.real.parent)}/libcuda.so"
            hooks.append(self._hook(HOOK_CREATE_SYMLINKS, "--link", f"libcuda.so.1::{link}"))
        if version is not None:
            hooks.append(self._hook(HOOK_ENABLE_CUDA_COMPAT, f"--host-driver-version={version}"))
        folders = dict.fromkeys(self._container_path(lib.real.parent) for lib in libraries)
        if folders:
            hooks.append(self._hook(HOOK_UPDATE_LDCACHE, *(a for f in folders for a in ("--folder", f))))
        hooks.append(self._hook(HOOK_DISABLE_DEVICE_NODE_MODIFICATION))
        return tuple(hooks)

    def _hook(self, name: str, *args: str) -> Hook:
        assert self.hook_path is not None
        program = self.hook_path.name
        # `nvidia-ctk` runs hooks as `nvidia-ctk hook <name>`, `nvidia-cdi-hook` as `nvidia-cdi-hook <name>`.
        prefix = (program, "hook") if program == "nvidia-ctk" else (program,)
        return Hook(hook_name="createContainer", path=str(self.hook_path), args=(*prefix, name, *args))


def _real_name_first(real: Path, names: Sequence[str]) -> tuple[str, ...]:
    """The real file's own name first, then its links in name order."""
    return tuple(sorted(names, key=lambda name: (name != real.name, name)))


def driver_version(libraries: Sequence[DriverLibrary]) -> str | None:
    """The driver version from libcuda's (else libnvidia-ml's) real file name: `libcuda.so.570.133.20`."""
    for stem in ("libcuda.so.", "libnvidia-ml.so."):
        for lib in libraries:
            suffix = lib.real.name.removeprefix(stem)
            if suffix != lib.real.name and re.fullmatch(r"\d+\.\d+(\.\d+)?", suffix):
                return suffix
    return None


def stat_is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.lstat().st_mode)
    except OSError:
        return False


def _cap_minor(access_file: Path) -> int | None:
    """Parse `DeviceFileMinor: N` from /proc/driver/nvidia/capabilities/.../access."""
    try:
        text = access_file.read_text()
    except OSError:
        return None
    match = re.search(r"DeviceFileMinor:\s*(\d+)", text)
    return int(match.group(1)) if match else None
