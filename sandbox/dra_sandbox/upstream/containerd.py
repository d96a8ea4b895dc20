"""The real node's containerd (docs/upstream.md "Real node"): its configuration and its process.

containerd runs as a host process with everything of its own under one directory (`NodeDirs`): root and state dirs,
its socket, the runc state, the CNI network config and the network namespaces. The config is version 3 (read by
containerd 2.0 to 2.4; 2.4 migrates it to its version 4 in memory):

- CRI images: the overlayfs snapshotter and the pod sandbox image `pinned_images.sandbox` = our local pause image
  (dra_sandbox/upstream/images.py), so no pod start pulls from a registry.
- CRI runtime: runc through `io.containerd.runc.v2` with `SystemdCgroup = false` (these machines' PID 1 is not
  systemd; the kubelet's `cgroupDriver: cgroupfs` matches), `cdi_spec_dirs` = the dir our kubelet plugin writes CDI
  specs to, and the CNI dirs. CDI injection is always on in containerd 2.3+ (the `enable_cdi` option is gone: 2.4
  skips it when it migrates a config), so the config names only where specs are.
- NRI off and the stream server on 127.0.0.1 with a port of the kernel's choosing: two nodes on one machine share
  neither.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_sandbox.children import terminate
from dra_sandbox.paths import Below
from dra_sandbox.polling import wait_for

CNI_BIN_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))  # Debian's containernetworking-plugins; upstream's
CNI_PLUGINS = ("bridge", "host-local", "loopback")
RUNC_PATHS = (Path("/usr/sbin/runc"), Path("/usr/bin/runc"), Path("/usr/local/sbin/runc"))
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


class ContainerdError(RuntimeError):
    pass


def toml_string(value: str) -> str:
    """A TOML basic string: JSON's escapes (\\", \\\\, \\n, \\uXXXX) are TOML's too."""
    return json.dumps(value, ensure_ascii=True)


def toml_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(toml_string(v) for v in values) + "]"


@dataclass(frozen=True)
class NodeDirs:
    """Where one node's containerd keeps everything (a node's work dir holds it as `containerd/`); its sockets go
    to `run` when given (a short path: AF_UNIX paths must stay below 108 bytes however deep the work dir is)."""

    root: Path
    run: Path | None = None

    config = Below("config.toml")
    data = Below("root")
    state = Below("state")
    runc_root = Below("runc")
    cni_conf_dir = Below("net.d")
    log = Below("containerd.log")

    @property
    def socket(self) -> Path:
        return (self.run or self.root) / "containerd.sock"


@dataclass(frozen=True)
class Network:
    """The node's pod network: a Linux bridge of its own with host-local addresses from `subnet`. The subnet's
    first address is the bridge's own (the node's address: dra_sandbox/upstream/node.py), never a pod's."""

    bridge: str  # at most 15 bytes (IFNAMSIZ)
    subnet: str  # e.g. "10.241.7.0/24"

    @property
    def host_address(self) -> str:
        return str(ipaddress.ip_network(self.subnet)[1])

    @property
    def prefix_length(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen

    def conflist(self) -> dict[str, object]:
        if not 0 < len(self.bridge) <= 15:
            raise ContainerdError(f"bridge name {self.bridge!r}: 1 to 15 characters")
        return {
            "cniVersion": "1.0.0",
            "name": "dra-sandbox",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    # No gateway route and no masquerade: the pods need no route off the bridge, and the host's
                    # forwarding switch and iptables stay as they are (the plugin turns forwarding on for a
                    # gateway). The bridge and its address are made before containerd starts (node.py).
                    "isGateway": False,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {"type": "host-local", "dataDir": "",  # set by ContainerdConfig.files
                             "ranges": [[{"subnet": self.subnet, "gateway": self.host_address}]]},
                },
                {"type": "loopback"},
            ],
        }


@dataclass(frozen=True)
class ContainerdConfig:
    dirs: NodeDirs
    sandbox_image: str
    cdi_spec_dirs: Sequence[Path]
    network: Network
    runc: Path
    cni_bin_dirs: Sequence[Path] = CNI_BIN_DIRS
    # Without CAP_SYS_RESOURCE no process may lower an OOM score below its own, and runc fails every pod sandbox
    # (the kubelet asks -998 for it): "nsexec: failed to update /proc/self/oom_score_adj: Permission denied", then
    # "runc create failed: unable to start container process: can't get final child's PID from pipe: EOF".
    # containerd's restrict_oom_score_adj raises such requests to its own score instead (docs/upstream.md).
    restrict_oom_score_adj: bool = False

    def render(self) -> str:
        d = self.dirs
        cri_images = '[plugins."io.containerd.cri.v1.images"]'
        cri_runtime = '[plugins."io.containerd.cri.v1.runtime"]'
        runc = '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]'
        lines = [
            "# Written by dra_sandbox.upstream.containerd for one real node (docs/upstream.md \"Real node\").",
            "version = 3",
            f"root = {toml_string(str(d.data))}",
            f"state = {toml_string(str(d.state))}",
            "",
            "[grpc]",
            f"  address = {toml_string(str(d.socket))}",
            "",
            "[ttrpc]",
            f"  address = {toml_string(str(d.socket) + '.ttrpc')}",
            "",
            '[plugins."io.containerd.internal.v1.opt"]',
            f"  path = {toml_string(str(d.root / 'opt'))}",
            "",
            '[plugins."io.containerd.nri.v1.nri"]',
            "  disable = true",
            "",
            '[plugins."io.containerd.grpc.v1.cri"]',
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            "",
            cri_images,
            '  snapshotter = "overlayfs"',
            f"{cri_images[:-1]}.pinned_images]",
            f"  sandbox = {toml_string(self.sandbox_image)}",
            "",
            cri_runtime,
            f"  cdi_spec_dirs = {toml_list([str(p) for p in self.cdi_spec_dirs])}",
            "  netns_mounts_under_state_dir = true",
            f"  restrict_oom_score_adj = {'true' if self.restrict_oom_score_adj else 'false'}",
            f"{cri_runtime[:-1]}.cni]",
            f"  bin_dirs = {toml_list([str(p) for p in self.cni_bin_dirs])}",
            f"  conf_dir = {toml_string(str(d.cni_conf_dir))}",
            "  max_conf_num = 1",
            f"{cri_runtime[:-1]}.containerd]",
            '  default_runtime_name = "runc"',
            runc,
            '  runtime_type = "io.containerd.runc.v2"',
            f"{runc[:-1]}.options]",
            f"  BinaryName = {toml_string(str(self.runc))}",
            f"  Root = {toml_string(str(d.runc_root))}",
            "  SystemdCgroup = false",
            "",
        ]
        return "\n".join(lines)

    def files(self) -> Mapping[Path, str]:
        """Every file containerd reads, by path: its config and the CNI network config."""
        conflist = self.network.conflist()
        plugins = conflist["plugins"]
        assert isinstance(plugins, list)
        plugins[0]["ipam"]["dataDir"] = str(self.dirs.root / "cni-ipam")
        return {
            self.dirs.config: self.render(),
            self.dirs.cni_conf_dir / "10-dra-sandbox.conflist": json.dumps(conflist, indent=2) + "\n",
        }


# --- what the host must have ---------------------------------------------------------------------------------


def find_runc() -> Path | None:
    for path in RUNC_PATHS:
        if path.is_file():
            return path
    return None


def missing_host_parts(cni_bin_dirs: Sequence[Path] = CNI_BIN_DIRS) -> list[str]:
    """What this machine lacks for a real node beyond the built binaries (empty: nothing)."""
    missing = []
    if shutil.which("ip") is None:
        missing.append("the ip command (Debian's iproute2)")
    if find_runc() is None:
        missing.append("runc (Debian's runc; make system-deps)")
    for plugin in CNI_PLUGINS:
        if not any((d / plugin).is_file() for d in cni_bin_dirs):
            missing.append(f"the CNI plugin {plugin} (Debian's containernetworking-plugins; make system-deps)")
    return missing


# --- the process ---------------------------------------------------------------------------------------------


class Containerd:
    """containerd of one node: start() writes its config, starts it and waits until `ctr version` answers."""

    def __init__(self, binary: Path, ctr: Path, config: ContainerdConfig) -> None:
        self.binary = binary
        self.ctr = ctr
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None
        self.started_s: float | None = None  # seconds from start() until it answered

    @property
    def dirs(self) -> NodeDirs:
        return self.config.dirs

    @property
    def endpoint(self) -> str:
        return f"unix://{self.dirs.socket}"

    def start(self) -> None:
        started = time.monotonic()
        self.dirs.root.mkdir(parents=True, exist_ok=True)
        self.dirs.root.chmod(0o700)
        for path, text in self.config.files().items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        self.dirs.socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dirs.socket.unlink(missing_ok=True)  # a killed predecessor's; containerd refuses to bind over it
        with open(self.dirs.log, "ab") as out:
            self.process = subprocess.Popen([str(self.binary), "--config", str(self.dirs.config)],
                                            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        wait_for(self._answers, START_TIMEOUT_S, f"containerd to serve on {self.dirs.socket}", interval=0.2)
        self.started_s = time.monotonic() - started

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise ContainerdError(f"containerd exited with {self.process.returncode}; {self.dirs.log}:\n"
                                  f"{self.log_tail()}")
        if not self.dirs.socket.exists():
            return False
        out = self.ctr_run("version", timeout=10, check=False)
        return out.returncode == 0

    def ctr_run(self, *args: str, timeout: float = 60, check: bool = True,
                namespace: str = "k8s.io") -> subprocess.CompletedProcess[str]:
        out = subprocess.run([str(self.ctr), "--address", str(self.dirs.socket), "--namespace", namespace, *args],
                             capture_output=True, text=True, timeout=timeout, check=False)
        if check and out.returncode != 0:
            raise ContainerdError(f"ctr {' '.join(args)}: {(out.stderr or out.stdout).strip()[-800:]}")
        return out

    def log_tail(self, size: int = 3000) -> str:
        try:
            return self.dirs.log.read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def stop(self) -> None:
        terminate(self.process, STOP_TIMEOUT_S)
