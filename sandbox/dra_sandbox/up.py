"""`dra-sandbox up` / `dra-sandbox down`: a local GPU cluster for anyone's specs.

`up` starts the API server, N fake GPU nodes (each with its kubelet simulator and a real `dra-driver
kubelet-plugin` process), the scheduler stand-in, `dra-driver controller` and the chart's DeviceClasses, writes a
kubeconfig into the state dir and stays up until `down`, Ctrl-C, SIGTERM or SIGHUP. `--detach` runs the same
foreground program as a new session in the background and returns once it is up.

The state dir (default `~/.local/state/dra-sandbox`) holds everything: `kubeconfig`, `up.pid` (the process that
owns the cluster), `children.json` (the kubelet-plugin PIDs, so `down` can stop them even when that process died
without cleaning up), `ready`, `up.log` (a detached run's output) and the nodes' work dirs (plugin logs in
`<state dir>/<node>/plugin.log`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from dra_driver import defaults
from dra_driver.commands.flags import FlagParser, apply_env_defaults
from dra_driver.inventory.sharing import consumable_shares
from dra_sandbox.children import alive, cmdline
from dra_sandbox.polling import wait_for
from dra_sandbox.runtime.choose import add_runtime_argument
from dra_sandbox.signals import StopRequested, stop_on_signals
from dra_sandbox.statedir import StateDir, add_state_dir_argument, is_sandbox_process

if TYPE_CHECKING:
    from dra_sandbox.cluster import ClusterConfig

UPSTREAM_CHILD = "upstream/"  # children.json names of upstream processes (controlplane.ControlPlane.child_pids)
MAX_SOCKET_PATH = 107  # AF_UNIX paths must be shorter than 108 bytes
_SOCKET_TAIL = "/plugins_registry/" + defaults.DRIVER_NAME + "-reg.sock"
START_TIMEOUT = 180.0
DEFAULT_UPSTREAM_MINOR = "1.37"  # dra_sandbox.upstream.build.DEFAULT_MINOR (not imported: up stays light)
STOP_TIMEOUT = 60.0


def is_plugin_process(pid: int) -> bool:
    return alive(pid) and "kubelet-plugin" in cmdline(pid)


# --- node specs --------------------------------------------------------------------------------------------


class NodeSpecError(ValueError):
    pass


# A GB200 NVL72 rack: 18 compute trays, i.e. up to 18 nodes per NVLink clique (docs/sandbox.md "GB200 NVL72 nodes").
NODES_PER_CLIQUE = 18
RACK_PRESETS = frozenset({"gb200-nvl72"})


def parse_nodes(text: str) -> list[tuple[str, str]]:
    """`node-a=dgx-h100,node-b=l4x2,node-c=./my-node.yaml` -> [(name, fake NVML spec)]. A value is a fake NVML
    preset or a node YAML file (docs/fake-nvml.md). Nodes of a rack preset (gb200-nvl72) share its cluster UUID and
    fill racks in the order given: the i-th such node is in clique i // 18."""
    from dra_driver.k8s.names import is_dns_subdomain
    from dra_driver.nvml.fake.nodefile import preset_names

    presets = set(preset_names())
    out: list[tuple[str, str]] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise NodeSpecError(f"--nodes: {item!r} is not NAME=PRESET or NAME=FILE.yaml")
        if not is_dns_subdomain(name) or len(name) > 63:
            raise NodeSpecError(f"--nodes: {name!r} is not a valid node name (a DNS subdomain)")
        if any(existing == name for existing, _ in out):
            raise NodeSpecError(f"--nodes: node {name!r} is given twice")
        if value in RACK_PRESETS:
            rack = sum(1 for _, spec in out if spec.partition(",")[0].removeprefix("fake:") in RACK_PRESETS)
            out.append((name, f"fake:{value},clique={rack // NODES_PER_CLIQUE}"))
        elif value in presets:
            out.append((name, f"fake:{value}"))
        elif value.endswith((".yaml", ".yml")):
            path = Path(value).expanduser().resolve()
            if not path.is_file():
                raise NodeSpecError(f"--nodes: node file {value} does not exist")
            out.append((name, f"fake:{path}"))
        else:
            raise NodeSpecError(
                f"--nodes: {value!r} is neither a preset ({', '.join(sorted(presets))}) nor a node file (*.yaml)"
            )
    if not out:
        raise NodeSpecError("--nodes: no node given")
    return out


def parse_driver(text: str, node_names: Sequence[str]) -> frozenset[str]:
    """`--driver`: `loaded` (every node has its NVIDIA driver), `absent` (none has: the plugins wait for it) or
    `absent:NODE,...` (those nodes have none) -> the names of the nodes that start without a driver."""
    value = text.strip()
    if value == "loaded":
        return frozenset()
    if value == "absent":
        return frozenset(node_names)
    head, sep, names = value.partition(":")
    if head != "absent" or not sep:
        raise NodeSpecError(f"--driver {text!r}: write loaded, absent (every node) or absent:NODE[,NODE...]")
    absent = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in absent if n not in node_names]
    if not absent or unknown:
        what = f"unknown node {', '.join(unknown)}" if unknown else "no node named"
        raise NodeSpecError(f"--driver {text!r}: {what}; the nodes are {', '.join(node_names)}")
    return frozenset(absent)


# --- the command -------------------------------------------------------------------------------------------


def add_arguments(parser: FlagParser) -> None:
    parser.add_argument(
        "--nodes",
        default=None,
        help="NAME=PRESET|FILE.yaml,... fake GPU nodes (default: the demo's node-h100=dgx-h100, node-a100=dgx-a100 "
        "and node-a100-whole=dgx-a100 with MIG off, labelled and configured as the e2e scenarios expect)",
    )
    add_state_dir_argument(parser)
    parser.add_argument("--detach", action="store_true", help="run in the background; stop it with `down`")
    add_runtime_argument(parser)
    parser.add_argument("--mig-mode", choices=("dynamic", "static", "none"), default="dynamic",
                        help="MIG mode of the nodes given with --nodes")
    parser.add_argument("--no-controller", action="store_true", help="do not run `dra-driver controller`")
    parser.add_argument(
        "--extended-resource-name",
        default="",
        help="extendedResourceName of the whole-GPU DeviceClass (KEP-5004), e.g. nvidia.com/gpu as the chart sets by "
        "default; empty (the default here): no class maps an extended resource",
    )
    parser.add_argument(
        "--consumable-shares",
        default="",
        help="every node's plugin runs with --consumable-shares MODE (memory|unlimited|<N>, NVIDIA's shapes: the main "
        "class's GPUs become shareable, docs/consumable-capacity.md); empty (the default): not set",
    )
    parser.add_argument(
        "--device-plugin",
        action="store_true",
        help="every node's kubelet also runs the device manager (the device-plugin API) and its GPU plugin serves "
        "nvidia.com/gpu through it beside DRA, a GPU in one world at a time (docs/device-plugin.md)",
    )
    parser.add_argument(
        "--passthrough",
        action="store_true",
        help="offer every fake node's GPUs for passthrough to VMs as well (gpu-<minor>-vfio, class vfio.gpu.dra.dev), "
        "through the node label <driver>/passthrough=true the chart documents (docs/passthrough.md)",
    )
    parser.add_argument(
        "--vgpu",
        choices=("none", "sriov", "mdev"),
        default="none",
        help="make every fake node a vGPU host whose plugin offers its GPUs as vGPUs (gpu-<minor>-vgpu-<type>-<slot>, "
        "class vgpu.gpu.dra.dev): sriov (vGPUs on SR-IOV VFs) or mdev (mediated devices); docs/vgpu.md",
    )
    parser.add_argument(
        "--fabric-partitions",
        action="store_true",
        help="make every fake node's Fabric Manager offer GPU partitions (the fake's fabric_partitions=true) and its "
        "plugin offer them (fm-partition-<id>, class fm-partition.gpu.dra.dev; --fabric-partitions on); "
        "docs/passthrough.md",
    )
    parser.add_argument(
        "--driver",
        default="loaded",
        help="the nodes' NVIDIA kernel driver at start: loaded, absent (every node: its plugin waits for it, as while "
        "the GPU Operator's driver container installs it) or absent:NODE[,NODE...]; bring it with `dra-sandbox "
        "nvidia-driver load --node NODE` (docs/sandbox.md)",
    )
    parser.add_argument(
        "--kubernetes",
        choices=("sandbox", "upstream"),
        default="sandbox",
        help="sandbox: the bench's own API server, scheduler and kubelet simulator (no dependencies); upstream: "
        "etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from their Go modules and run as "
        "local processes, with what the chart installs (docs/upstream.md)",
    )
    parser.add_argument(
        "--kubernetes-version",
        default=None,
        help="with --kubernetes upstream: the release, 1.34-1.37 (default 1.37; built on first use, then cached)",
    )
    apply_env_defaults(parser)


def usage_text(state: StateDir, nodes: Sequence[str], runtime: str, cdi_root: Path | None = None) -> str:
    kc = state.kubeconfig
    cdi = f"; CDI specs in {cdi_root}" if cdi_root is not None else ""
    return "\n".join(
        [
            f"dra-sandbox: up with nodes {', '.join(nodes)}; containers run with {runtime}{cdi}",
            f"  state dir {state.root} (plugin logs: {state.root}/<node>/plugin.log)",
            "Use it:",
            f"  export KUBECONFIG={kc}",
            "  kubectl get nodes",
            "  kubectl get resourceslices,deviceclasses",
            "  kubectl apply -f my-claim-and-pod.yaml",
            "  dra-driver explain <namespace>/<claim>",
            f"Stop it: {state.down_command}"
            " (or Ctrl-C when it runs in the foreground)",
        ]
    )


def _cluster_config(args: argparse.Namespace, state: StateDir) -> ClusterConfig:
    from dra_sandbox.cluster import DEFAULT_KUBE_VERSION, ClusterConfig, NodeSpec
    from dra_sandbox.deviceclasses import compute_domain_device_classes, device_classes
    from dra_sandbox.e2e.sandbox import FM_PLUGIN_ENV, VGPU_PLUGIN_ENV, e2e_cluster_config, passthrough_labels

    webhook = shutil.which("openssl") is not None and not args.no_controller
    classes = device_classes(defaults.DRIVER_NAME, extended_resource_name=args.extended_resource_name)
    classes += compute_domain_device_classes()  # as the chart with computeDomains.enabled (its default)
    mode = args.consumable_shares or None
    if args.nodes is None:
        config = e2e_cluster_config(state.root, args.runtime, webhook=webhook, consumable_shares=mode,
                                    passthrough=args.passthrough, vgpu=None if args.vgpu == "none" else args.vgpu,
                                    fabric_partitions=args.fabric_partitions)
        absent = parse_driver(args.driver, [n.name for n in config.nodes])
        # The e2e scenarios' nodes, but the newest release: the e2e runner's 1.36 is the kind recipe's default.
        config = replace(config, device_classes=classes, kube_version=DEFAULT_KUBE_VERSION,
                         nodes=[replace(n, driver_absent=n.name in absent) for n in config.nodes])
        if args.no_controller:
            config = replace(config, controller=False, webhook=False)
        return config
    env = {} if mode is None else {"DRA_DRIVER_CONSUMABLE_SHARES": mode}
    labels = passthrough_labels(defaults.DRIVER_NAME) if args.passthrough else {}
    host = ""
    if args.vgpu != "none":
        env |= VGPU_PLUGIN_ENV
        host = ",vgpu=true" + (",vgpu_mdev=true" if args.vgpu == "mdev" else "")
    if args.fabric_partitions:
        env |= FM_PLUGIN_ENV
        host += ",fabric_partitions=true"
    given = [(name, nvml + host if nvml.startswith("fake:") else nvml) for name, nvml in parse_nodes(args.nodes)]
    absent = parse_driver(args.driver, [name for name, _ in given])
    nodes = [NodeSpec(name, nvml, mig_mode=args.mig_mode, plugin_env=env, labels=labels, driver_absent=name in absent)
             for name, nvml in given]
    return ClusterConfig(
        work_dir=state.root,
        nodes=nodes,
        driver_name=defaults.DRIVER_NAME,
        runtime=args.runtime,
        device_classes=classes,
        controller=not args.no_controller,
        webhook=webhook,
    )


def _check_paths(state: StateDir, node_names: Sequence[str]) -> str | None:
    longest = max((len(f"{state.root}/{name}{_SOCKET_TAIL}") for name in node_names), default=0)
    if longest > MAX_SOCKET_PATH:
        return (f"the state dir {state.root} is too deep for the kubelet's unix sockets ({longest} > "
                f"{MAX_SOCKET_PATH} bytes): pass a shorter --state-dir")
    return None


def _check_extended_resource_name(name: str) -> str | None:
    """The name as the API server would judge it on the class (refused before anything starts)."""
    if not name:
        return None
    from dra_sandbox.apiserver.validation import validate_device_class
    from dra_sandbox.deviceclasses import device_classes

    main = device_classes(defaults.DRIVER_NAME, extended_resource_name=name)[0]
    problems = [str(e).removeprefix("spec.extendedResourceName: ") for e in validate_device_class(main)]
    if not problems:
        return None
    return f"--extended-resource-name {name}: {'; '.join(problems)} (e.g. --extended-resource-name nvidia.com/gpu)"


def _check_consumable_shares(mode: str) -> str | None:
    """A mode the plugins would refuse at start stops `up` at once, naming this flag (the product's parser decides)."""
    if not mode:
        return None
    try:
        consumable_shares(mode)
    except ValueError as exc:
        return str(exc)
    return None


def _check_kubernetes(args: argparse.Namespace) -> str | None:
    from dra_sandbox.upstream.build import RELEASES

    if args.kubernetes_version is None:
        return None
    if args.kubernetes != "upstream":
        return "--kubernetes-version needs --kubernetes upstream (the sandbox's version is --kube-version of e2e)"
    if args.kubernetes_version not in RELEASES:
        return f"--kubernetes-version {args.kubernetes_version}: pinned releases are {', '.join(RELEASES)}"
    return None


def _default_nodes() -> list[tuple[str, str]]:
    from dra_sandbox.e2e.sandbox import E2E_NODES

    return list(E2E_NODES.values())


def run_up(args: argparse.Namespace) -> int:
    state = StateDir.chosen(args.state_dir)
    try:
        names = [n for n, _ in parse_nodes(args.nodes)] if args.nodes else [n for n, _ in _default_nodes()]
        parse_driver(args.driver, names)
    except NodeSpecError as exc:
        print(f"dra-sandbox up: {exc}", file=sys.stderr)
        return 2
    problem = (_check_paths(state, names) or _check_extended_resource_name(args.extended_resource_name)
               or _check_consumable_shares(args.consumable_shares) or _check_kubernetes(args))
    if problem:
        print(f"dra-sandbox up: {problem}", file=sys.stderr)
        return 2
    owner = state.owner()
    if owner is not None and owner != os.getpid():
        print(f"dra-sandbox up: already up in {state.root} (pid {owner}); run `dra-sandbox down` first",
              file=sys.stderr)
        return 1
    state.root.mkdir(parents=True, exist_ok=True)
    if args.detach:
        return _detach(args, state)
    return _foreground(args, state, names)


def _foreground(args: argparse.Namespace, state: StateDir, names: Sequence[str]) -> int:
    from dra_driver.observability.logging import configure_logging
    from dra_sandbox.cluster import SandboxCluster

    def say(line: str) -> None:
        print(line, flush=True)

    configure_logging("warning", "text", stream=sys.stderr)
    _stop_leftovers(state, say)  # a previous run killed with SIGKILL may have left plugins behind
    state.clear()
    state.pid_file.write_text(f"{os.getpid()}\n")
    code = 0
    try:
        with stop_on_signals():
            if args.kubernetes == "upstream":
                return _foreground_upstream(args, state, say)
            config = replace(_cluster_config(args, state), device_plugin=args.device_plugin)
            say(f"dra-sandbox: starting {len(config.nodes)} node(s) in {state.root} ...")
            cluster = SandboxCluster(config)
            try:
                with cluster:
                    state.children_file.write_text(json.dumps(cluster.child_pids()))
                    state.cdi_file.write_text(f"{cluster.cdi_root}\n")
                    runtime = cluster.runtime.name if cluster.runtime else "?"
                    say(usage_text(state, names, runtime, cluster.cdi_root))
                    state.ready_file.write_text("up\n")
                    while True:
                        signal.pause()  # until a stop signal raises StopRequested
            finally:
                # Recorded again: plugins that exited (or were restarted) are not ours to stop any more.
                state.children_file.write_text(json.dumps(cluster.child_pids()))
    except StopRequested as stop:
        say(f"dra-sandbox: {stop}; everything it started is stopped")
        code = 0
    except Exception as exc:
        print(f"dra-sandbox up: {exc}", file=sys.stderr)
        code = 1
    finally:
        _remove_sockets(state.root)
        state.clear()
    return code


def _foreground_upstream(args: argparse.Namespace, state: StateDir, say: Callable[[str], None]) -> int:
    """`--kubernetes upstream`: upstream's control plane and what the chart installs (docs/upstream.md), until a
    stop signal (StopRequested, handled by the caller)."""
    from dra_sandbox.upstream.node import RealNodeSpec
    from dra_sandbox.upstream.session import UpstreamCluster

    minor = args.kubernetes_version or DEFAULT_UPSTREAM_MINOR
    say(f"dra-sandbox: starting upstream Kubernetes {minor} in {state.root} ...")
    # The first node is the real one (docs/upstream.md "Real node"), the others the kubelet simulator's ("Simulated
    # nodes"), all joined to the same kube-apiserver.
    first, *others = _cluster_config(args, state).nodes
    # With --device-plugin the real kubelet's own device manager serves it (the simulated nodes do not run one).
    env = {**first.plugin_env, **({"DRA_DRIVER_DEVICE_PLUGIN": "on"} if args.device_plugin else {})}
    real = RealNodeSpec(first.name, first.nvml, first.mig_mode, dict(first.labels), env)
    cluster = UpstreamCluster(state.root, minor, say, real_node=real, simulated=others)
    try:
        with cluster:
            state.children_file.write_text(json.dumps(cluster.child_pids()))
            plane = cluster.plane
            assert plane is not None  # set by __enter__
            timings = ", ".join(f"{k} {v:.1f} s" for k, v in cluster.timings.items())
            say("\n".join([
                f"dra-sandbox: up with upstream Kubernetes {plane.config.binaries.release.kubernetes}: etcd, "
                "kube-apiserver, kube-controller-manager, kube-scheduler and the chart's objects and controller",
                f"  kube-apiserver {plane.server_url}; logs in {plane.dir}/logs; ready after {timings}",
                (f"  real node {cluster.node.spec.name} (kubelet, containerd, the GPU kubelet plugin) on "
                 f"{cluster.node.node_ip}; logs in {cluster.node.logs}" if cluster.node is not None
                 else "  no real node (see above)"),
                (f"  simulated node(s) {', '.join(cluster.simulated.plugins)} (kubelet simulator, GPU kubelet plugin)"
                 if cluster.simulated is not None else "  no simulated node"),
                "Use it:",
                f"  export KUBECONFIG={state.kubeconfig}",
                "  kubectl version; kubectl get deviceclasses,validatingadmissionpolicies",
                f"Stop it: {state.down_command} (or Ctrl-C when it runs in the foreground)",
            ]))
            state.ready_file.write_text("up\n")
            while True:
                signal.pause()  # until a stop signal raises StopRequested
    finally:
        state.children_file.write_text(json.dumps(cluster.child_pids()))


def _detach(args: argparse.Namespace, state: StateDir) -> int:
    """The same program in the foreground of a new session, output to up.log; returns once it is up."""
    argv = [sys.executable, "-m", "dra_sandbox.cli", "up", "--state-dir", str(state.root), "--runtime", args.runtime,
            "--mig-mode", args.mig_mode]
    if args.nodes:
        argv += ["--nodes", args.nodes]
    if args.no_controller:
        argv.append("--no-controller")
    if args.extended_resource_name:
        argv += ["--extended-resource-name", args.extended_resource_name]
    if args.consumable_shares:
        argv += ["--consumable-shares", args.consumable_shares]
    if args.device_plugin:
        argv.append("--device-plugin")
    if args.passthrough:
        argv.append("--passthrough")
    if args.vgpu != "none":
        argv += ["--vgpu", args.vgpu]
    if args.fabric_partitions:
        argv.append("--fabric-partitions")
    if args.driver != "loaded":
        argv += ["--driver", args.driver]
    if args.kubernetes != "sandbox":
        argv += ["--kubernetes", args.kubernetes]
    if args.kubernetes_version:
        argv += ["--kubernetes-version", args.kubernetes_version]
    state.clear()
    env = {k: v for k, v in os.environ.items() if k != "DRA_DRIVER_DETACH"}  # the child runs in the foreground
    with open(state.log_file, "wb") as log:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)

    def ready() -> bool:
        if child.poll() is not None:
            raise RuntimeError(f"exited {child.returncode}")
        return state.ready_file.exists()

    try:
        wait_for(ready, START_TIMEOUT, "the detached sandbox to come up", interval=0.1)
    except (RuntimeError, TimeoutError) as exc:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            child.wait(STOP_TIMEOUT)
        tail = state.log_file.read_text(errors="replace")[-3000:]
        print(f"dra-sandbox up --detach: the sandbox did not come up ({exc}); {state.log_file}:\n{tail}",
              file=sys.stderr)
        return 1
    output = state.log_file.read_text(errors="replace")
    print(output[output.find("dra-sandbox: up with"):].rstrip())
    print(f"dra-sandbox: running in the background as pid {child.pid}; output in {state.log_file}")
    return 0


def _remove_sockets(root: Path) -> None:
    """Socket files of plugins that died without removing them (a plugin stopped by SIGTERM removes its own)."""
    import stat as stat_mod

    for path in root.rglob("*.sock"):
        try:
            if stat_mod.S_ISSOCK(path.lstat().st_mode):
                path.unlink()
        except OSError:
            continue


def _stop_pids(pids: Sequence[int], is_ours: Callable[[int], bool], timeout: float) -> list[int]:
    """SIGTERM, wait, then SIGKILL; returns the PIDs that were still running."""
    running = [pid for pid in pids if is_ours(pid)]
    for pid in running:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    try:
        wait_for(lambda: not any(is_ours(p) for p in running), timeout, "processes to exit", interval=0.1)
    except TimeoutError:
        for pid in running:
            if is_ours(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
        wait_for(lambda: not any(alive(p) for p in running), 10.0, "killed processes to go", interval=0.1)
    return running


def _stop_leftovers(state: StateDir, say: Callable[[str], None]) -> None:
    children = state.children()
    plugins = [pid for name, pid in children.items() if not name.startswith(UPSTREAM_CHILD)]
    left = _stop_pids(plugins, is_plugin_process, 20.0)
    if left:
        say(f"dra-sandbox: stopped {len(left)} kubelet-plugin process(es) a previous run left behind")
    upstream = [pid for name, pid in children.items() if name.startswith(UPSTREAM_CHILD)]
    if upstream:
        from dra_sandbox.upstream.build import cache_root
        from dra_sandbox.upstream.controlplane import is_upstream_process

        cache = cache_root()
        left = _stop_pids(upstream, lambda pid: is_upstream_process(pid, cache), 20.0)
        if left:
            say(f"dra-sandbox: stopped {len(left)} upstream process(es) (etcd, kube-*) a previous run left behind")
    if state.root.is_dir() and any(state.root.glob("*/node.json")):
        from dra_sandbox.upstream.node import clean_leftover_nodes

        for node in clean_leftover_nodes(state.root):
            say(f"dra-sandbox: removed the containers, mounts, cgroups and bridge real node {node} left behind")
    _remove_leftover_specs(state, say)


def _remove_leftover_specs(state: StateDir, say: Callable[[str], None]) -> None:
    """The CDI specs of a run that could not clean up (killed with SIGKILL): its nodes' files, and in the system
    CDI dir only while no other sandbox holds it (another sandbox's nodes may have the same names)."""
    from dra_sandbox.cdilock import SystemCdiLock
    from dra_sandbox.cluster import SYSTEM_CDI_DIR, remove_node_specs

    try:
        cdi_root = Path(state.cdi_file.read_text().strip())
    except OSError:
        return
    nodes = list(state.children())
    if not nodes or not cdi_root.is_dir():
        return
    lock = SystemCdiLock.acquire(cdi_root) if cdi_root == SYSTEM_CDI_DIR else None
    if isinstance(lock, str):
        say(f"dra-sandbox: left the CDI specs in {cdi_root} alone: {lock}")
        return
    try:
        removed = remove_node_specs(cdi_root, defaults.DRIVER_NAME, nodes)
    finally:
        if lock is not None:
            lock.release()
    if removed:
        say(f"dra-sandbox: removed {len(removed)} CDI spec(s) a previous run left in {cdi_root}")


def run_down(args: argparse.Namespace) -> int:
    state = StateDir.chosen(args.state_dir)
    owner = state.owner()
    children = state.children()
    if owner is None and not any(is_plugin_process(p) for p in children.values()):
        state.clear()
        if state.root.is_dir():
            _remove_sockets(state.root)
        print(f"dra-sandbox down: nothing is up in {state.root}")
        return 0
    if owner is not None:
        print(f"dra-sandbox down: stopping pid {owner} ...", flush=True)
        _stop_pids([owner], is_sandbox_process, STOP_TIMEOUT)
    _stop_leftovers(state, print)
    if state.root.is_dir():
        _remove_sockets(state.root)
    state.clear()
    print(f"dra-sandbox down: stopped; state dir {state.root} (logs kept)")
    return 0


def add_down_arguments(parser: FlagParser) -> None:
    add_state_dir_argument(parser)
    apply_env_defaults(parser)


class UpCommand:
    add_arguments = staticmethod(add_arguments)
    run = staticmethod(run_up)


class DownCommand:
    add_arguments = staticmethod(add_down_arguments)
    run = staticmethod(run_down)
