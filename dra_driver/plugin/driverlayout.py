"""Is the plugin looking at the node's NVIDIA driver where the node keeps it? (docs/gpu-operator.md)

Two layouts are supported (chart value `driverRoot`, flags `--driver-root` / `--host-driver-root`):

- host-installed driver (package manager, .run installer): `driverRoot=/`;
- the NVIDIA GPU Operator's driver container, which exposes its root filesystem on the node at
  `/run/nvidia/driver` (the Operator's `hostPaths.driverInstallDir`): `driverRoot=/run/nvidia/driver`.

and the NVIDIA container toolkit's CDI hook (`nvidia-cdi-hook`, or `nvidia-ctk hook` of older toolkits) present
or not (chart values `containerToolkit.cdiHooks` / `containerToolkit.installDir`: `/usr/bin` for the packaged
toolkit, `/usr/local/nvidia/toolkit` with the Operator).

`probe_layout` reads a handful of paths (no writes, no NVML); `check_driver_layout` is pure: it turns those facts
into `LayoutProblem`s, each naming the chart value (and flag) to change. Severity decides what the plugin does:
`ERROR` = a layout that is clearly wrong (the plugin refuses to start: waiting would never help), `WAIT` = the
driver is not there yet (the reason the driver wait reports while it retries), `WARNING` = logged, start goes on.
"""

from __future__ import annotations

import enum
import os
import platform
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_driver.nvidiadriver.wait import DriverPaths
from dra_driver.nvml.real.loader import SONAME, driver_library_dirs, find_driver_library

# Where the GPU Operator's driver container exposes its root filesystem on the node (gpu-operator
# deployments/gpu-operator/values.yaml hostPaths.driverInstallDir; k8s-driver-manager's driverRoot).
OPERATOR_DRIVER_ROOT = "/run/nvidia/driver"
HOST_DRIVER_ROOT = "/"
# Where the toolkit's binaries are: the distribution package's, and the Operator's toolkit container's
# (its toolkit.installDir /usr/local/nvidia + /toolkit; mig-parted's DefaultNvidiaCDIHookPath).
PACKAGE_TOOLKIT_DIR = "/usr/bin"
OPERATOR_TOOLKIT_DIR = "/usr/local/nvidia/toolkit"
CDI_HOOK_BINARY = "nvidia-cdi-hook"
CTK_BINARY = "nvidia-ctk"  # toolkits before nvidia-cdi-hook existed: `nvidia-ctk hook <name>`
SMI_RELATIVE = "usr/bin/nvidia-smi"
KERNEL_VERSION_FILE = "driver/nvidia/version"  # under /proc: present while the nvidia module is loaded
_KERNEL_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)")
_LIBRARY_VERSION = re.compile(r"^libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$")

DRIVER_ROOT_VALUE = "driverRoot (flag --host-driver-root; --driver-root is where the plugin sees it)"
HOOKS_VALUE = "containerToolkit.cdiHooks (flag --cdi-hooks)"
TOOLKIT_VALUE = "containerToolkit.installDir (flag --host-toolkit-dir)"


class Severity(enum.Enum):
    ERROR = "error"  # clearly wrong: refuse to start, name the value to change
    WAIT = "wait"  # not there yet: the reason to report while waiting for the driver
    WARNING = "warning"  # works, but something an admin should know


@dataclass(frozen=True)
class LayoutProblem:
    severity: Severity
    message: str  # one line: what was seen, and the value to change

    def __str__(self) -> str:
        return f"{self.severity.value}: {self.message}"


class CdiHooks(enum.Enum):
    AUTO = "auto"  # use the toolkit's hook where it is found under the toolkit dir
    ON = "on"  # required: refuse to start without it
    OFF = "off"  # never: the CDI specs mount the driver's files themselves


@dataclass(frozen=True)
class CdiHookBinary:
    """The toolkit's CDI hook as a CDI spec names it: a path ON THE HOST and the argv before the hook's name."""

    host_path: str
    argv_prefix: tuple[str, ...]  # ("nvidia-cdi-hook",) or ("nvidia-ctk", "hook")


@dataclass(frozen=True)
class LayoutSettings:
    """The flags the check judges: the driver's paths (`paths`, as the driver wait reads them) and the toolkit's.
    `toolkit_dir`: as this process sees it; `host_toolkit_dir`: on the node."""

    paths: DriverPaths
    cdi_hooks: CdiHooks = CdiHooks.OFF
    toolkit_dir: Path | None = None  # None: not mounted (cdi hooks off)
    host_toolkit_dir: str = PACKAGE_TOOLKIT_DIR


@dataclass(frozen=True)
class DriverFiles:
    """What one candidate driver root holds."""

    library: str | None  # libnvidia-ml.so.1 found (path as this process sees it)
    library_version: str | None  # from the file the soname link resolves to (libnvidia-ml.so.<version>)
    smi: bool  # usr/bin/nvidia-smi

    @property
    def present(self) -> bool:
        return self.library is not None or self.smi


@dataclass(frozen=True)
class LayoutFacts:
    """What `probe_layout` saw; the input of the pure check (tests build it by hand)."""

    driver_root_is_dir: bool
    at_root: DriverFiles  # under the configured driver root
    nested_operator: DriverFiles | None  # under <driver root>/run/nvidia/driver, only when driverRoot is /
    operator_dir_exists: bool  # <driver root>/run/nvidia/driver exists (the Operator made it), driverRoot /
    kernel_version: str | None  # the loaded nvidia kernel module's version (/proc/driver/nvidia/version)
    nvidiactl: bool  # <dev root>/nvidiactl is a character device (the module is loaded)
    hook: CdiHookBinary | None  # the toolkit's hook found under the toolkit dir
    toolkit_dir_mounted: bool


def _driver_files(root: Path) -> DriverFiles:
    library = find_driver_library(driver_library_dirs(str(root), platform.machine()))
    version = None
    if library is not None:
        match = _LIBRARY_VERSION.match(os.path.basename(os.path.realpath(library)))
        version = match.group(1) if match else None
    return DriverFiles(library=library, library_version=version, smi=(root / SMI_RELATIVE).is_file())


def kernel_module_version(text: str) -> str | None:
    """The version in /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64
    570.133.20  Release Build ..."), or None."""
    match = _KERNEL_VERSION.search(text)
    return match.group(1) if match else None


def _find_hook(toolkit_dir: Path, host_toolkit_dir: str) -> CdiHookBinary | None:
    for name, prefix in ((CDI_HOOK_BINARY, (CDI_HOOK_BINARY,)), (CTK_BINARY, (CTK_BINARY, "hook"))):
        seen = toolkit_dir / name
        if seen.is_file() and os.access(seen, os.X_OK):
            return CdiHookBinary(host_path=os.path.join(host_toolkit_dir, name), argv_prefix=prefix)
    return None


def probe_layout(settings: LayoutSettings) -> LayoutFacts:
    """Read the paths the check needs (stat and two small reads; never writes, never loads a library)."""
    root = settings.paths.driver_root
    nested = root / OPERATOR_DRIVER_ROOT.lstrip("/")
    host_root_is_slash = os.path.normpath(settings.paths.host_driver_root) == HOST_DRIVER_ROOT
    try:
        kernel = kernel_module_version((settings.paths.proc_root / KERNEL_VERSION_FILE).read_text(errors="replace"))
    except OSError:
        kernel = None
    ctl = settings.paths.dev_root / "nvidiactl"
    mounted = settings.toolkit_dir is not None and settings.toolkit_dir.is_dir()
    return LayoutFacts(
        driver_root_is_dir=root.is_dir(),
        at_root=_driver_files(root),
        nested_operator=_driver_files(nested) if host_root_is_slash and nested.is_dir() else None,
        operator_dir_exists=host_root_is_slash and nested.is_dir(),
        kernel_version=kernel,
        nvidiactl=ctl.exists() and ctl.is_char_device(),
        hook=_find_hook(settings.toolkit_dir, settings.host_toolkit_dir)
        if settings.toolkit_dir is not None and mounted
        else None,
        toolkit_dir_mounted=mounted,
    )


def check_driver_layout(settings: LayoutSettings, facts: LayoutFacts) -> list[LayoutProblem]:
    """Every problem with the driver layout, most severe first; [] when the driver is where the flags say."""
    problems = _driver_root_problems(settings, facts) + _hook_problems(settings, facts)
    order = {Severity.ERROR: 0, Severity.WAIT: 1, Severity.WARNING: 2}
    return sorted(problems, key=lambda p: order[p.severity])


def inspect_driver_layout(settings: LayoutSettings) -> list[LayoutProblem]:
    """`check_driver_layout` on what this node shows now (what the plugin calls at start and while waiting)."""
    return check_driver_layout(settings, probe_layout(settings))


def resolve_cdi_hook(settings: LayoutSettings, facts: LayoutFacts) -> CdiHookBinary | None:
    """The hook the CDI specs may call: None with `off`, or where none was found (`auto`)."""
    return None if settings.cdi_hooks is CdiHooks.OFF else facts.hook


def _driver_root_problems(settings: LayoutSettings, facts: LayoutFacts) -> list[LayoutProblem]:
    host = str(settings.paths.host_driver_root)
    if not os.path.isabs(host):
        return [_error(f"driverRoot={host!r} is not an absolute path: set {DRIVER_ROOT_VALUE} to / or "
                       f"{OPERATOR_DRIVER_ROOT}")]
    if not facts.driver_root_is_dir:
        return [_error(f"--driver-root {settings.paths.driver_root} is not a directory in the plugin's container: it "
                       f"must be where driverRoot={host} is mounted (the chart mounts it at /driver-root)")]
    nested = facts.nested_operator
    if nested is not None and nested.present:
        smi = f"{OPERATOR_DRIVER_ROOT}/{SMI_RELATIVE}" if nested.smi else f"{OPERATOR_DRIVER_ROOT}/.../{SONAME}"
        kernel_matches_nested = facts.kernel_version is not None and facts.kernel_version == nested.library_version
        if not facts.at_root.present or (
            kernel_matches_nested and facts.at_root.library_version != facts.kernel_version
        ):
            return [_error(f"driverRoot=/ but {smi} exists on the node: this node's driver comes from the GPU "
                           f"Operator's driver container; set driverRoot={OPERATOR_DRIVER_ROOT}")]
        return [_warning(f"driverRoot=/ holds a driver and so does {OPERATOR_DRIVER_ROOT} (the GPU Operator's "
                         f"driver container): using /; if the Operator manages this node's driver, set "
                         f"driverRoot={OPERATOR_DRIVER_ROOT} (and remove the host driver)")]
    if facts.operator_dir_exists and not facts.at_root.present:
        return [_error(f"driverRoot=/ has no NVIDIA driver, but {OPERATOR_DRIVER_ROOT} exists on the node: the GPU "
                       f"Operator installs the driver here (its driver container may still be starting); set "
                       f"driverRoot={OPERATOR_DRIVER_ROOT}")]
    problems: list[LayoutProblem] = []
    at_root = facts.at_root
    if at_root.library is None:
        if os.path.normpath(host) == OPERATOR_DRIVER_ROOT:
            hint = ("either the GPU Operator's driver container is still installing the driver (wait for its "
                    "nvidia-driver-daemonset pod on this node), or the driver is installed on the host: then set "
                    "driverRoot=/")
        elif os.path.normpath(host) == HOST_DRIVER_ROOT:
            hint = (f"install the NVIDIA driver on the node, or, if the GPU Operator installs it, set "
                    f"driverRoot={OPERATOR_DRIVER_ROOT}")
        else:
            hint = f"set {DRIVER_ROOT_VALUE} to / (host-installed driver) or {OPERATOR_DRIVER_ROOT} (GPU Operator)"
        loaded = " (the nvidia kernel module is loaded)" if facts.kernel_version or facts.nvidiactl else ""
        problems.append(_wait(f"no {SONAME} under driverRoot={host}{loaded}: {hint}"))
    elif not at_root.smi:
        problems.append(_warning(f"{SONAME} is under driverRoot={host} but {SMI_RELATIVE} is not: containers get "
                                 f"no nvidia-smi; is driverRoot the driver's root (where usr/bin and usr/lib are)?"))
    if not facts.nvidiactl:
        problems.append(_wait(f"{settings.paths.dev_root}/nvidiactl is missing: the nvidia kernel module is not loaded "
                              f"(modprobe nvidia, or wait for the GPU Operator's driver pod)"))
    lib_version = at_root.library_version
    if facts.kernel_version and lib_version and lib_version != facts.kernel_version:
        problems.append(_wait(f"the loaded nvidia kernel module is {facts.kernel_version} but {SONAME} under "
                              f"driverRoot={host} is {lib_version}: NVML refuses a mismatch (reboot or reload the "
                              f"module after a driver upgrade, or point {DRIVER_ROOT_VALUE} at the driver that "
                              f"loaded the module)"))
    return problems


def _hook_problems(settings: LayoutSettings, facts: LayoutFacts) -> list[LayoutProblem]:
    if settings.cdi_hooks is CdiHooks.OFF or facts.hook is not None:
        return []
    toolkit = settings.host_toolkit_dir
    operator_layout = os.path.normpath(settings.paths.host_driver_root) == OPERATOR_DRIVER_ROOT
    suggestion = (
        f"set containerToolkit.installDir={OPERATOR_TOOLKIT_DIR} (the GPU Operator's toolkit)"
        if operator_layout and os.path.normpath(toolkit) != OPERATOR_TOOLKIT_DIR
        else f"set {TOOLKIT_VALUE} to where {CDI_HOOK_BINARY} is on the node ({PACKAGE_TOOLKIT_DIR} for the packaged "
        f"toolkit, {OPERATOR_TOOLKIT_DIR} with the GPU Operator)"
    )
    seen = (
        f"containerToolkit.installDir={toolkit} holds neither {CDI_HOOK_BINARY} nor {CTK_BINARY}"
        if facts.toolkit_dir_mounted
        else f"containerToolkit.installDir={toolkit} is not mounted in the plugin's container"
    )
    if settings.cdi_hooks is CdiHooks.ON:
        return [_error(f"containerToolkit.cdiHooks=on but {seen}: {suggestion}, or set {HOOKS_VALUE} to auto/off")]
    if operator_layout and os.path.normpath(toolkit) != OPERATOR_TOOLKIT_DIR:
        return [_warning(f"containerToolkit.cdiHooks=auto found no hook: {seen}; {suggestion}")]
    return []


def _error(message: str) -> LayoutProblem:
    return LayoutProblem(Severity.ERROR, message)


def _wait(message: str) -> LayoutProblem:
    return LayoutProblem(Severity.WAIT, message)


def _warning(message: str) -> LayoutProblem:
    return LayoutProblem(Severity.WARNING, message)


def refusal(problems: Sequence[LayoutProblem]) -> str | None:
    """The message to refuse to start with (every ERROR, joined), or None."""
    errors = [p.message for p in problems if p.severity is Severity.ERROR]
    return "; ".join(errors) if errors else None


def wait_reason(problems: Sequence[LayoutProblem]) -> str | None:
    """The driver-not-ready reason (every WAIT, joined) for the driver wait loop, or None."""
    waits = [p.message for p in problems if p.severity is Severity.WAIT]
    return "; ".join(waits) if waits else None
