"""The kubelet plugin run from the container image (`make image`) under podman, as the Helm chart runs it with
simulated GPUs: a `PluginLauncher` for SandboxCluster (ClusterConfig.plugin_launcher).

The container gets the chart's plugin container settings for `nvml: fake:*` (charts/dra-driver/templates/
daemonset.yaml): not privileged, uid/gid 0, read-only root filesystem, every capability dropped, no privilege
escalation, a tmpfs on /tmp (the chart's emptyDir), and host paths mounted at the same paths: the plugin dir,
the kubelet's registry dir and the CDI root; the boot id at /host/boot_id. What the sandbox adds: the fake NVML
state directory and the kubeconfig of the sandbox API server (the chart uses the in-cluster service account), and
`--network host` so that the plugin reaches the API server on 127.0.0.1.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dra_driver import __version__
from dra_sandbox.cluster import PluginProcess

DEFAULT_IMAGE = f"localhost/dra-driver:{__version__}"
# Podman in a container (as on CI machines) refuses the host's unlimited limits; these are plenty.
ULIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
BOOT_ID_IN_CONTAINER = "/host/boot_id"  # the chart's mount path and DRA_DRIVER_BOOT_ID_PATH


def podman_binary() -> str | None:
    return shutil.which("podman")


def image_unavailable(image: str = DEFAULT_IMAGE, global_args: Sequence[str] = ()) -> str | None:
    """Why the plugin cannot be run from `image` here (None: it can): podman missing, the image not built, or
    podman unable to run a container of it. `global_args`: podman's arguments for this host
    (`dra_sandbox.imagebuild.podman_runtime()`, e.g. `--runtime runc` where crun cannot run)."""
    podman = podman_binary()
    if podman is None:
        return "podman is not installed (make system-deps)"
    exists = subprocess.run([podman, "image", "exists", image], capture_output=True, timeout=60, check=False)
    if exists.returncode != 0:
        return f"image {image} is not built (make image)"
    probe = subprocess.run(
        [podman, *global_args, "run", "--rm", *ULIMITS, "--network", "none", image, "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if probe.returncode != 0:
        return f"podman cannot run {image}: {(probe.stderr or probe.stdout).strip()[-300:]}"
    return None


@dataclass
class PodmanImageLauncher:
    """Starts each node's plugin as `podman run ... <image> kubelet-plugin` (the container is the process's child:
    SIGTERM to `podman run` reaches the plugin, and its exit status is the plugin's)."""

    image: str = DEFAULT_IMAGE
    podman: str = "podman"
    # podman's global arguments for this host, e.g. ("--runtime", "runc") where crun cannot run
    # (dra_sandbox.imagebuild.podman_runtime(), the sandbox's probe).
    global_args: tuple[str, ...] = ()
    # Seconds `podman stop` waits after SIGTERM (cleanup of a container whose `podman run` was killed).
    stop_timeout: int = 10
    containers: dict[str, str] = field(default_factory=dict)  # node -> name of its current container

    def prepare(self, plugin: PluginProcess) -> None:
        # The chart's hostPath volumes: DirectoryOrCreate for the plugin dir and the CDI root; the registry dir
        # is the kubelet's (the simulator makes it).
        for directory in (plugin.plugin_dir, plugin.registry_dir, plugin.cluster.cdi_root, plugin.state_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self.cleanup(plugin)

    def command(self, plugin: PluginProcess, env: Mapping[str, str]) -> list[str]:
        name = f"dra-plugin-{plugin.node.name}-{uuid.uuid4().hex[:8]}"
        self.containers[plugin.node.name] = name
        settings = {k: v for k, v in env.items() if k.startswith("DRA_DRIVER_")}
        settings["DRA_DRIVER_BOOT_ID_PATH"] = BOOT_ID_IN_CONTAINER
        settings["NVIDIA_VISIBLE_DEVICES"] = "void"  # as the chart: never let an NVIDIA runtime hand it GPUs
        kubeconfig = settings.get("DRA_DRIVER_KUBECONFIG", "")
        mounts = [
            bind(plugin.registry_dir),
            bind(plugin.plugin_dir),
            bind(plugin.cluster.cdi_root),
            bind(plugin.state_dir),
            bind(plugin.boot_id_file, BOOT_ID_IN_CONTAINER, read_only=True),
        ]
        if kubeconfig:
            mounts.append(bind(Path(kubeconfig), read_only=True))
        argv = [
            self.podman, *self.global_args, "run", "--rm", "--name", name,
            "--network", "host",
            # securityContext of the chart's plugin container for nvml: fake:*
            "--user", "0:0", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--tmpfs", "/tmp:rw,size=64m,mode=1777",  # noqa: S108 - the container's own /tmp, as the chart's emptyDir
            *ULIMITS,
        ]
        for mount in mounts:
            argv += ["--volume", mount]
        for key, value in sorted(settings.items()):
            argv += ["--env", f"{key}={value}"]
        return [*argv, self.image, "kubelet-plugin"]

    def cleanup(self, plugin: PluginProcess) -> None:
        """Remove the node's container if it is still there (its `podman run` was SIGKILLed, or it never ended)."""
        name = self.containers.get(plugin.node.name)
        if name is None:
            return
        subprocess.run(
            [self.podman, *self.global_args, "rm", "--force", "--ignore", "--time", str(self.stop_timeout), name],
            capture_output=True,
            timeout=self.stop_timeout + 60,
            check=False,
        )


def bind(source: Path, target: str | None = None, *, read_only: bool = False) -> str:
    """A --volume argument; by default at the same path in the container (the kubelet dials these paths)."""
    return f"{source}:{target or source}{':ro' if read_only else ''}"
