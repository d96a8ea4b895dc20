"""Real containers with podman: CDI devices injected by podman itself, the probe reports what it saw.

podman 4.3 (Debian 12) reads CDI specs only from /etc/cdi and /var/run/cdi and only cdiVersion <= 0.5.0;
newer or invalid specs fail with one generic "unresolvable CDI devices" error. Before starting a
container we therefore resolve the ids ourselves with the same rules (dra_driver.cdi) and turn those
cases into a clear message. On hosts with cgroup v1 + a v2 hierarchy carrying controllers ("hybrid"),
podman's default OCI runtime crun refuses to start; usability detection then retries with runc.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_driver.cdi import CdiError
from dra_driver.cdi.version import version_at_least
from dra_sandbox.runtime.cdi import load_registry
from dra_sandbox.runtime.probe import PROBE_NAME, parse_probe_output, probe_binary
from dra_sandbox.runtime.staticbuild import StaticBuildError
from dra_sandbox.runtime.types import ContainerRequest, ContainerResult

PODMAN_CDI_DIRS: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi")
PODMAN_MAX_CDI_VERSION = "0.5.0"
# Required on the project's machines (see docs/sandbox.md, runtime); harmless elsewhere.
BASE_RUN_ARGS: tuple[str, ...] = (
    "run",
    "--rm",
    "--network",
    "none",
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
)


@dataclass(frozen=True)
class PodmanAvailability:
    usable: bool
    reason: str
    global_args: tuple[str, ...] = ()  # e.g. ("--runtime", "runc")


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dra-driver" / "sandbox"


class PodmanRuntime:
    """Runs each container as ``podman run ... --device <cdi id> ... --rootfs <fresh dir> /probe``."""

    def __init__(
        self,
        *,
        podman: str = "podman",
        cache_dir: Path | None = None,
        work_dir: Path | None = None,
        cdi_dirs: Sequence[str | Path] = PODMAN_CDI_DIRS,
        timeout_s: float = 30.0,
    ) -> None:
        self._podman = podman
        self._cache_dir = cache_dir or default_cache_dir()
        self._work_dir = work_dir
        self._cdi_dirs = tuple(cdi_dirs)
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._availability: PodmanAvailability | None = None

    @property
    def name(self) -> str:
        return "podman"

    # ---- detection (once) --------------------------------------------------------------------------

    def availability(self) -> PodmanAvailability:
        """Detect once whether podman is installed and can really start a container here."""
        with self._lock:
            if self._availability is None:
                self._availability = self._detect()
            return self._availability

    def _detect(self) -> PodmanAvailability:
        exe = shutil.which(self._podman)
        if exe is None:
            return PodmanAvailability(False, f"{self._podman!r} is not installed (run scripts/install-system-deps.sh)")
        try:
            probe = probe_binary(self._cache_dir)
        except StaticBuildError as exc:
            return PodmanAvailability(False, f"cannot build the probe program: {exc}")
        attempts: list[tuple[str, ...]] = [()]
        if shutil.which("runc"):
            attempts.append(("--runtime", "runc"))
        errors: list[str] = []
        for global_args in attempts:
            proc = self._run_probe(probe, global_args, devices=(), env=(), paths=(), timeout_s=self._timeout_s)
            if isinstance(proc, str):
                errors.append(proc)
                continue
            if proc.returncode == 0 and parse_probe_output(proc.stdout).complete:
                label = " ".join(global_args) or "default OCI runtime"
                return PodmanAvailability(True, f"podman runs containers ({label})", global_args)
            errors.append(f"{' '.join(global_args) or 'default runtime'}: exit {proc.returncode}: "
                          f"{proc.stderr.strip()[-300:]}")
        return PodmanAvailability(False, "podman cannot start a container here: " + " | ".join(errors))

    # ---- running -----------------------------------------------------------------------------------

    def _run_probe(
        self,
        probe: Path,
        global_args: tuple[str, ...],
        *,
        devices: Sequence[str],
        env: Sequence[tuple[str, str]],
        paths: Sequence[str],
        timeout_s: float,
    ) -> subprocess.CompletedProcess[str] | str:
        if self._work_dir is not None:
            self._work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # A fresh rootfs per container: podman creates mount points inside it, so it must not be shared.
        rootfs = Path(tempfile.mkdtemp(prefix="rootfs-", dir=self._work_dir))
        try:
            try:
                os.link(probe, rootfs / PROBE_NAME)
            except OSError:
                shutil.copy2(probe, rootfs / PROBE_NAME)
            argv = [self._podman, *global_args, *BASE_RUN_ARGS]
            for key, value in env:
                argv += ["--env", f"{key}={value}"]
            for device in devices:
                argv += ["--device", device]
            argv += ["--rootfs", str(rootfs), f"/{PROBE_NAME}", *paths]  # --rootfs must come last before the path
            try:
                return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
            except subprocess.TimeoutExpired:
                return f"podman did not finish within {timeout_s:.0f} s"
            except OSError as exc:
                return f"cannot execute podman: {exc}"
        finally:
            shutil.rmtree(rootfs, ignore_errors=True)

    def precheck(self, cdi_devices: Sequence[str]) -> str | None:
        """Resolve the ids like podman will, but with a useful message; None when podman should succeed."""
        if not cdi_devices:
            return None
        registry = load_registry(self._cdi_dirs)
        try:
            registry.resolve(cdi_devices)
        except CdiError as exc:
            issues = "; ".join(f"{i.path}: {i.message}" for i in registry.issues)
            return f"{exc.message} (podman reads only {', '.join(map(str, self._cdi_dirs))})" + (
                f"; spec problems: {issues}" if issues else ""
            )
        for device in cdi_devices:
            source = registry.spec_for(device)
            if source is not None and not version_at_least(PODMAN_MAX_CDI_VERSION, source.spec.cdi_version):
                return (
                    f"{device} is defined in {source.path} with cdiVersion {source.spec.cdi_version}, but this "
                    f"podman only reads cdiVersion <= {PODMAN_MAX_CDI_VERSION}; write the lowest version that "
                    "covers the features used"
                )
        return None

    def run(self, request: ContainerRequest) -> ContainerResult:
        availability = self.availability()
        if not availability.usable:
            return self._failed(request, availability.reason)
        problem = self.precheck(request.cdi_devices)
        if problem is not None:
            return self._failed(request, problem)
        probe = probe_binary(self._cache_dir)
        proc = self._run_probe(
            probe,
            availability.global_args,
            devices=request.cdi_devices,
            env=request.env,
            paths=request.inspect_paths,
            timeout_s=self._timeout_s,
        )
        if isinstance(proc, str):
            return self._failed(request, proc)
        report = parse_probe_output(proc.stdout)
        error = None
        if proc.returncode != 0:
            error = f"podman exited {proc.returncode}: {proc.stderr.strip()[-500:]}"
        elif not report.complete:
            error = "the container's probe output is incomplete"
        return ContainerResult(
            runtime=self.name,
            executed=True,
            exit_code=proc.returncode if proc.returncode != 0 or report.complete else 1,
            cdi_devices=request.cdi_devices,
            env=report.env,
            mounts=report.mounts,
            device_nodes=report.devices,
            additional_gids=report.gids,
            files=report.files,
            error=error,
        )

    def _failed(self, request: ContainerRequest, message: str) -> ContainerResult:
        # 128 is what container runtimes report when the process never started.
        return ContainerResult(
            runtime=self.name, executed=False, exit_code=128, cdi_devices=request.cdi_devices, error=message
        )
