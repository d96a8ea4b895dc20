"""A real node on this machine (docs/upstream.md "Real node"): upstream's kubelet with containerd 2.x, runc and CNI
(bridge, host-local, loopback), joined to the upstream control plane, and our GPU kubelet plugin on fake NVML
registering through the kubelet's plugin watcher.

start() in order: leftovers of a killed predecessor are removed (`reap`), containerd starts and the two local images
are imported (dra_sandbox/upstream/images.py), the kubelet gets a client certificate (`system:node:<name>`, group
`system:nodes`) and a serving certificate for the node's address from the control plane's CA and registers its Node,
then the plugin starts with a token of the chart's plugin ServiceAccount bound to that Node, registers with the
kubelet and publishes its ResourceSlices. stop() ends them in reverse and then removes what outlives the processes:
containers (through runc, whose state dir is the node's), containerd's shims, mounts under the node's dir, the pod
cgroups and the bridge; the sysctls the kubelet sets at start are put back.

The node's files are under `<work dir>/<node>/`: `containerd/` (its root, state, config, log), `cdi/` (the CDI specs
the plugin writes and containerd reads), `nvml/` (the fake NVML's state), `logs/` (kubelet.log, plugin.log),
`node.json` (its Footprint). Its sockets need short paths (AF_UNIX: < 108 bytes) and go to
`/run/dra-sandbox/<control plane address>/`: containerd's socket and the kubelet's --root-dir `kubelet/` (plugin
registry and plugin sockets, pods).
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dra_driver import defaults
from dra_driver.k8s.client import ApiError, JsonObject
from dra_sandbox.children import cmdline, terminate
from dra_sandbox.paths import Below
from dra_sandbox.polling import wait_for
from dra_sandbox.startstop import StartStop
from dra_sandbox.upstream.build import ReleaseBinaries
from dra_sandbox.upstream.containerd import (
    Containerd,
    ContainerdConfig,
    Network,
    NodeDirs,
    find_runc,
    missing_host_parts,
)
from dra_sandbox.upstream.controlplane import FEATURE_GATES, ControlPlane
from dra_sandbox.upstream.images import PAUSE_IMAGE, import_node_images
from dra_sandbox.upstream.install import plugin_kubeconfig
from dra_sandbox.upstream.kubeletconfig import (
    KubeletSettings,
    kubelet_argv,
    kubelet_configuration,
    plugins_dir,
    registration_dir,
)
from dra_sandbox.upstream.machinelock import MachineLock
from dra_sandbox.upstream.pki import kubeconfig, write_private

NODE_READY_TIMEOUT_S = 120.0
PLUGIN_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0
GPU_NODE_LABELS = {"nvidia.com/gpu.present": "true", "feature.node.kubernetes.io/pci-10de.present": "true"}
# The kernel settings a kubelet sets at start unless protectKernelDefaults (pkg/kubelet/cm: setupKernelTunables);
# recorded before it starts and put back after it stopped.
KUBELET_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                   "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
FOOTPRINT_FILE = "node.json"
RUN_ROOT = Path("/run/dra-sandbox")
MACHINE_LOCK = RUN_ROOT / "real-node.lock"  # one real kubelet per machine (machinelock.py)
PLUGIN_REGISTERED_LINE = "registered with the kubelet"  # dra_driver/kubeletplugin/services.py logs it


class RealNodeError(RuntimeError):
    pass


def unavailable_reason() -> str | None:
    """Why a real node cannot run on this machine (None: it can, given the built binaries)."""
    if sys.platform != "linux":
        return "a real node needs Linux"
    if os.geteuid() != 0:
        return "a real node needs root (containerd, runc, CNI and the kubelet's cgroups)"
    missing = missing_host_parts()
    if missing:
        return "missing " + "; ".join(missing)
    return None


@dataclass(frozen=True)
class RealNodeSpec:
    name: str
    nvml: str = "fake:dgx-h100"  # the fake NVML of the plugin (a state file and a seed are added)
    mig_mode: str = "dynamic"
    labels: Mapping[str, str] = field(default_factory=dict)
    plugin_env: Mapping[str, str] = field(default_factory=dict)  # extra DRA_DRIVER_* settings (its flags)


CAP_SYS_RESOURCE = 24  # linux/capability.h


def has_capability(bit: int, status: Path = Path("/proc/self/status")) -> bool:
    """Whether this process has capability `bit` in its effective set (CapEff of /proc/self/status)."""
    for line in status.read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> bit & 1)
    return False


def network_for(control_plane_address: str) -> Network:
    """A bridge name and pod subnet of the node's own: derived from the control plane's loopback address
    127.<b>.<c>.<d>, which that control plane holds for itself alone among sandboxes (controlplane.AddressLease).
    The subnet is 10.1<b mod 100>.<d>.0/24 (10.140-149.x.0/24 for the leases' 127.240-249.0.x)."""
    _, b, c, d = ipaddress.IPv4Address(control_plane_address).packed
    return Network(bridge=f"drasb{b:02x}{c:02x}{d:02x}", subnet=f"10.{100 + b % 100}.{d}.0/24")


def run_dir_for(control_plane_address: str) -> Path:
    """The node's sockets (containerd's, the kubelet's plugin registry and plugin sockets) need short paths; the
    control plane's address names them uniquely on this machine."""
    return RUN_ROOT / control_plane_address


def _remove_tree(path: Path) -> None:
    """rm -rf that stays on one file system (a mount left below is never crossed)."""
    if path.exists():
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False, timeout=120)


def cgroup_root_for(control_plane_address: str) -> str:
    return "/dra-sandbox-" + control_plane_address.replace(".", "-")


# --- leftovers -------------------------------------------------------------------------------------------------


def _mount_points_under(root: Path) -> list[str]:
    """Mount points at or below `root`, deepest first (from /proc/self/mountinfo; octal escapes decoded)."""
    points = []
    prefix = str(root).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as info:
        for line in info:
            raw = line.split()[4]
            point = raw.encode().decode("unicode_escape")
            if point.startswith(prefix) or point == str(root):
                points.append(point)
    return sorted(points, key=len, reverse=True)


_MNT_DETACH = 2


def unmount_under(root: Path) -> list[str]:
    """Lazily unmount everything below `root` (the node's dir: netns bind mounts, rootfs overlays, volume tmpfs)."""
    libc = ctypes.CDLL(None, use_errno=True)
    done = []
    for point in _mount_points_under(root):
        if libc.umount2(point.encode(), _MNT_DETACH) == 0:
            done.append(point)
    return done


def _shims_of(socket: Path) -> list[int]:
    """The containerd shims started by the containerd serving on `socket` (their -address names it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        argv = cmdline(int(entry.name))
        if argv and argv[0].endswith("containerd-shim-runc-v2") and str(socket) in argv:
            pids.append(int(entry.name))
    return pids


def _runc(runc: Path, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(runc), "--root", str(root), *args], capture_output=True, text=True, timeout=60,
                          check=False)


def kill_containers(runc: Path, runc_root: Path) -> list[str]:
    """Every container runc keeps state for under the node's runc root (one dir per containerd namespace)."""
    killed: list[str] = []
    if not runc_root.is_dir():
        return killed
    for namespace in sorted(p for p in runc_root.iterdir() if p.is_dir()):
        listed = _runc(runc, namespace, "list", "-q")
        for cid in listed.stdout.split():
            _runc(runc, namespace, "kill", "--all", cid, "KILL")
            _runc(runc, namespace, "delete", "--force", cid)
            killed.append(cid)
    return killed


def _remove_cgroups(cgroup_root: str) -> None:
    """rmdir the node's cgroup tree in every hierarchy, deepest first (only empty ones go)."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        top = hierarchy / cgroup_root.lstrip("/")
        if not top.is_dir():  # the unified hierarchy too: runc makes the path there on hybrid hosts
            continue
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for path in [*dirs, top]:
            with contextlib.suppress(OSError):
                path.rmdir()


def _make_cgroups(cgroup_root: str) -> None:
    """The kubelet refuses a cgroupRoot that does not exist: make it in every v1 hierarchy (cpuset needs the parent's
    CPUs and memory nodes before anything can join it)."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        if hierarchy.name == "unified" or not (hierarchy / "cgroup.procs").exists():
            continue
        top = hierarchy / cgroup_root.lstrip("/")
        top.mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":
            for name in ("cpuset.cpus", "cpuset.mems"):
                mine = top / name
                if not mine.read_text().strip():
                    mine.write_text((hierarchy / name).read_text())


def _ip(*args: str, check: bool = True) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and out.returncode != 0:
        raise RealNodeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


def _make_bridge(network: Network) -> None:
    """The pod bridge with the node's address on it, before the kubelet needs the address (the CNI bridge plugin
    takes a bridge of that name as it finds it)."""
    _ip("link", "add", "name", network.bridge, "type", "bridge")
    _ip("addr", "add", f"{network.host_address}/{network.prefix_length}", "dev", network.bridge)
    _ip("link", "set", network.bridge, "up")


def _delete_link(name: str) -> None:
    _ip("link", "delete", name, check=False)


@dataclass(frozen=True)
class Footprint:
    """What a node leaves on the machine beyond its dir, recorded in `<node dir>/node.json` when it starts, so that
    `clean()` finds it again after the node's owner was killed (the next start, or `dra-sandbox down`)."""

    dir: Path
    run: Path  # the node's sockets and the kubelet's root dir (run_dir_for)
    bridge: str
    cgroup_root: str

    @property
    def record(self) -> Path:
        return self.dir / FOOTPRINT_FILE

    @property
    def containerd(self) -> NodeDirs:
        return NodeDirs(self.dir / "containerd", self.run)

    def save(self) -> None:
        self.record.write_text(json.dumps({"run": str(self.run), "bridge": self.bridge,
                                           "cgroupRoot": self.cgroup_root}) + "\n")

    @classmethod
    def load(cls, node_dir: Path) -> Footprint | None:
        try:
            raw = json.loads((node_dir / FOOTPRINT_FILE).read_text())
            run = Path(str(raw["run"]))
            if run.parent != RUN_ROOT:  # never clean a path that is not one of ours
                return None
            return cls(node_dir, run, str(raw["bridge"]), str(raw["cgroupRoot"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def kill_containers(self) -> list[str]:
        runc = find_runc()
        return kill_containers(runc, self.containerd.runc_root) if runc is not None else []

    def clean(self) -> None:
        """Every container, then the shims of the node's containerd (stopped first by the caller), every mount below
        the node's dirs, the run dir, the node's cgroups and its bridge."""
        self.kill_containers()
        for pid in _shims_of(self.containerd.socket):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for root in (self.dir, self.run):
            if root.is_dir():
                unmount_under(root)
        _remove_tree(self.run)
        _remove_cgroups(self.cgroup_root)
        _delete_link(self.bridge)


def clean_leftover_nodes(work_dir: Path) -> list[str]:
    """The real nodes a killed run left in `work_dir` (each `<node>/node.json`): cleaned; returns their names. Only
    while no process of theirs runs any more (the caller stopped them)."""
    cleaned = []
    for record in sorted(work_dir.glob(f"*/{FOOTPRINT_FILE}")):
        footprint = Footprint.load(record.parent)
        if footprint is not None:
            footprint.clean()
            record.unlink(missing_ok=True)
            cleaned.append(record.parent.name)
    return cleaned


# --- the node --------------------------------------------------------------------------------------------------


class RealNode(StartStop):
    def __init__(self, plane: ControlPlane, binaries: ReleaseBinaries, spec: RealNodeSpec, work_dir: Path,
                 driver_name: str = defaults.DRIVER_NAME, images_cache: Path | None = None) -> None:
        self.plane = plane
        self.binaries = binaries
        self.spec = spec
        self.driver_name = driver_name
        self.dir = work_dir / spec.name
        self.run_dir = run_dir_for(plane.address)
        self.containerd_dirs = NodeDirs(self.dir / "containerd", self.run_dir)
        self.kubelet_root = self.run_dir / "kubelet"
        self.cdi_dir = self.dir / "cdi"
        self.logs = self.dir / "logs"
        # Derived from the control plane's loopback address, which is ours alone among sandboxes. The node's address
        # is its bridge's: the kubelet refuses a loopback node IP ("nodeIP can't be loopback address") and wants
        # one a host interface has.
        self.network = network_for(plane.address)
        self.node_ip = self.network.host_address
        self.cgroup_root = cgroup_root_for(plane.address)
        self.footprint = Footprint(self.dir, self.run_dir, self.network.bridge, self.cgroup_root)
        self.images_cache = images_cache or binaries.link_dir.parent / "images"
        self.containerd: Containerd | None = None
        self.kubelet: subprocess.Popen[bytes] | None = None
        self.plugin: subprocess.Popen[bytes] | None = None
        self.timings: dict[str, float] = {}  # seconds from start() until each part was ready
        self._sysctls: dict[str, str] = {}
        self.machine_lock = MachineLock(MACHINE_LOCK, spec.name)

    # Paths ------------------------------------------------------------------------------------------------------
    kubelet_log = Below("kubelet.log", base="logs")
    plugin_log = Below("plugin.log", base="logs")
    ports_file = Below("nvml", "ports.json", base="dir")

    @property
    def registry_dir(self) -> Path:
        return registration_dir(self.kubelet_root)

    @property
    def plugin_dir(self) -> Path:
        return plugins_dir(self.kubelet_root, self.driver_name)

    @property
    def nvml_spec(self) -> str:
        """The plugin's fake NVML as a `--nvml` value (its state file: `dra-sandbox nvidia-driver` acts on it)."""
        return f"{self.spec.nvml},state={self.dir / 'nvml' / 'nvml-state.json'},seed={self.spec.name}"

    def child_pids(self) -> dict[str, int]:
        """children.json names: containerd and the kubelet are cached upstream binaries (`upstream/<node>/...`), the
        plugin is a kubelet-plugin process under the node's name, as the simulator's nodes' plugins are."""
        out = {}
        containerd = self.containerd.process if self.containerd else None
        for name, proc in ((f"upstream/{self.spec.name}/containerd", containerd),
                           (f"upstream/{self.spec.name}/kubelet", self.kubelet), (self.spec.name, self.plugin)):
            if proc is not None and proc.poll() is None:
                out[name] = proc.pid
        return out

    # Start ------------------------------------------------------------------------------------------------------
    def start(self, say: Callable[[str], None] = lambda _: None) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise RealNodeError(f"real node {self.spec.name}: {reason}")
        with self.starting(self.timings) as ready:
            self.machine_lock.acquire()
            ready("machine lock")
            previous = Footprint.load(self.dir)
            if previous is not None:
                previous.clean()
            self.footprint.clean()
            for path in (self.containerd_dirs.root, self.cdi_dir):
                _remove_tree(path)
            self.logs.mkdir(parents=True, exist_ok=True)
            self.footprint.save()
            self.cdi_dir.mkdir(mode=0o755, parents=True)
            say(f"upstream: real node {self.spec.name} on {self.node_ip}: containerd, kubelet, GPU kubelet plugin")
            _make_bridge(self.network)
            self._start_containerd()
            ready("containerd")
            self._start_kubelet()
            ready("kubelet")
            self._start_plugin()
            ready("plugin")

    def _start_containerd(self) -> None:
        runc = find_runc()
        assert runc is not None  # unavailable_reason() checked
        config = ContainerdConfig(self.containerd_dirs, PAUSE_IMAGE, (self.cdi_dir,), self.network, runc,
                                  restrict_oom_score_adj=not has_capability(CAP_SYS_RESOURCE))
        self.containerd = Containerd(self.binaries.path("containerd"), self.binaries.path("ctr"), config)
        self.containerd.start()
        import_node_images(self.containerd.ctr, self.containerd_dirs.socket, self.images_cache)

    def _settings(self) -> KubeletSettings:
        pki = self.plane.pki
        labels = {**GPU_NODE_LABELS, **self.spec.labels}
        minor = self.binaries.release.minor
        return KubeletSettings(
            node_name=self.spec.name,
            node_ip=self.node_ip,
            root_dir=self.kubelet_root,
            config_file=self.dir / "kubelet-config.yaml",
            kubeconfig=self.dir / "kubelet.kubeconfig",
            client_ca=pki.ca.cert,
            serving_cert=pki.pair(f"kubelet-serving-{self.spec.name}").cert,
            serving_key=pki.pair(f"kubelet-serving-{self.spec.name}").key,
            runtime_endpoint=self.containerd.endpoint if self.containerd else "",
            pod_logs_dir=self.dir / "pod-logs",
            volume_plugin_dir=self.dir / "volume-plugins",
            cgroup_root=self.cgroup_root,
            # The control plane's extra gates too (e.g. DRAWorkloadResourceClaims): a kubelet without them would
            # refuse what the control plane allows (a claim reserved for a PodGroup instead of the pod).
            feature_gates={**FEATURE_GATES.get(minor, {}), **self.plane.config.extra_feature_gates},
            labels=labels,
        )

    def _start_kubelet(self) -> None:
        pki = self.plane.pki
        name = self.spec.name
        client = pki.issue(f"kubelet-{name}", f"system:node:{name}", ("system:nodes",))
        pki.issue(f"kubelet-serving-{name}", f"system:node:{name}", ("system:nodes",), server=True, client=False,
                  hosts=(self.node_ip, name))
        settings = self._settings()
        write_private(settings.kubeconfig, kubeconfig(self.plane.server_url, pki.ca.cert, client,
                                                      f"system:node:{name}"))
        settings.config_file.write_text(yaml.safe_dump(kubelet_configuration(settings), sort_keys=False))
        for path in (settings.pod_logs_dir, settings.volume_plugin_dir, self.kubelet_root):
            path.mkdir(parents=True, exist_ok=True)
        _make_cgroups(self.cgroup_root)
        self._sysctls = {key: Path("/proc/sys", key).read_text().strip() for key in KUBELET_SYSCTLS}
        with open(self.kubelet_log, "ab") as out:
            self.kubelet = subprocess.Popen(kubelet_argv(self.binaries.path("kubelet"), settings),
                                            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        wait_for(self._node_ready, NODE_READY_TIMEOUT_S, f"the kubelet to register Node {name} and report it Ready",
                 interval=0.3)

    def _check(self, proc: subprocess.Popen[bytes] | None, what: str, log: Path) -> None:
        if proc is not None and proc.poll() is not None:
            try:
                tail = log.read_text(errors="replace")[-3000:]
            except OSError:
                tail = ""
            raise RealNodeError(f"{what} of node {self.spec.name} exited with {proc.returncode}; {log}:\n{tail}")

    def node(self) -> JsonObject | None:
        try:
            return self.plane.admin().get(f"/api/v1/nodes/{self.spec.name}")
        except ApiError:
            return None

    def _node_ready(self) -> bool:
        self._check(self.kubelet, "the kubelet", self.kubelet_log)
        obj = self.node()
        conditions = ((obj or {}).get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def _plugin_env(self, kubeconfig_path: Path) -> dict[str, str]:
        state = self.dir / "nvml"
        state.mkdir(exist_ok=True)
        boot_id = self.dir / "boot_id"
        if not boot_id.exists():
            boot_id.write_text(f"sandbox-{self.spec.name}\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")}
        env.update({
            "DRA_DRIVER_NODE_NAME": self.spec.name,
            "DRA_DRIVER_DRIVER_NAME": self.driver_name,
            "DRA_DRIVER_KUBECONFIG": str(kubeconfig_path),
            "DRA_DRIVER_PLUGIN_DIR": str(self.plugin_dir),
            "DRA_DRIVER_REGISTRY_DIR": str(self.registry_dir),
            "DRA_DRIVER_CDI_ROOT": str(self.cdi_dir),
            "DRA_DRIVER_NVML": self.nvml_spec,
            "DRA_DRIVER_MIG_MODE": self.spec.mig_mode,
            "DRA_DRIVER_HEALTHZ_PORT": "0",
            "DRA_DRIVER_METRICS_PORT": "0",
            "DRA_DRIVER_PORTS_FILE": str(self.ports_file),
            "DRA_DRIVER_BOOT_ID_PATH": str(boot_id),
            "DRA_DRIVER_LOG_FORMAT": "text",
            # Read only with --device-plugin on: the kubelet serves PodResources under its --root-dir.
            "DRA_DRIVER_POD_RESOURCES_SOCKET": str(self.kubelet_root / "pod-resources" / "kubelet.sock"),
            **self.spec.plugin_env,
        })
        return env

    def _start_plugin(self) -> None:
        kubeconfig_path = plugin_kubeconfig(self.plane, self.spec.name, self.dir / "plugin.kubeconfig")
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        with open(self.plugin_log, "ab") as out:
            self.plugin = subprocess.Popen([sys.executable, "-m", "dra_driver.cli", "kubelet-plugin"],
                                           env=self._plugin_env(kubeconfig_path), stdin=subprocess.DEVNULL,
                                           stdout=out, stderr=subprocess.STDOUT, process_group=0)
        wait_for(self._plugin_published, PLUGIN_TIMEOUT_S,
                 f"the GPU kubelet plugin of {self.spec.name} to register with the kubelet and publish", interval=0.3)

    def plugin_registered(self) -> bool:
        try:
            return PLUGIN_REGISTERED_LINE in self.plugin_log.read_text(errors="replace")
        except OSError:
            return False

    def resource_slices(self) -> list[JsonObject]:
        listed = self.plane.admin().get("/apis/resource.k8s.io/v1/resourceslices",
                                        query={"fieldSelector": f"spec.nodeName={self.spec.name}"}) or {}
        return [s for s in listed.get("items") or [] if (s.get("spec") or {}).get("driver") == self.driver_name]

    def _plugin_published(self) -> bool:
        self._check(self.plugin, "the kubelet plugin", self.plugin_log)
        self._check(self.kubelet, "the kubelet", self.kubelet_log)
        return self.plugin_registered() and bool(self.resource_slices())

    # Stop -------------------------------------------------------------------------------------------------------
    def stop(self) -> None:
        for proc in (self.plugin, self.kubelet):
            terminate(proc, STOP_TIMEOUT_S)
        self.plugin = self.kubelet = None
        self.footprint.kill_containers()  # while containerd runs: it sees its tasks exit
        if self.containerd is not None:
            self.containerd.stop()
        self.containerd = None
        self.footprint.clean()
        self.footprint.record.unlink(missing_ok=True)
        for key, value in self._sysctls.items():
            with contextlib.suppress(OSError):
                Path("/proc/sys", key).write_text(value)
        self._sysctls = {}
        self.machine_lock.release()

