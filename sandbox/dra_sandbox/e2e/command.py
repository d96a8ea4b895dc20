"""`dra-sandbox e2e`: run the scenarios on a fresh sandbox, or with --kubeconfig on a real cluster."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from dra_driver.commands.flags import FlagParser, apply_env_defaults
from dra_sandbox.e2e.backend import Backend
from dra_sandbox.e2e.kubectl import KubectlBackend, KubectlConfig
from dra_sandbox.e2e.loader import ScenarioError, load_scenarios
from dra_sandbox.e2e.runner import SKIP, Runner, RunnerConfig, ScenarioResult, format_result, summary
from dra_sandbox.e2e.sandbox import (
    E2E_NODES,
    SandboxBackend,
    compute_domain_cluster_config,
    compute_domain_support,
    e2e_cluster_config,
)
from dra_sandbox.e2e.scenario import COMPUTE_DOMAIN_CLUSTER, DRIVER_ABSENT_AT_START, VGPU_MDEV, Scenario
from dra_sandbox.runtime.choose import add_runtime_argument
from dra_sandbox.signals import StopRequested, stop_on_signals

SANDBOX_STEP_TIMEOUT = 60.0
CLUSTER_STEP_TIMEOUT = 180.0  # image pulls and real schedulers take longer than the sandbox
UPSTREAM_STEP_TIMEOUT = 90.0  # no pulls (local images), but a real kubelet and kube-scheduler's backoff
DEFAULT_UPSTREAM_MINOR = "1.37"  # dra_sandbox.upstream.build.DEFAULT_MINOR (not imported: a kubectl run needs none)


def default_scenarios_dir() -> Path:
    """`e2e/scenarios` of the working directory, else of the checkout this package lives in."""
    candidates = [Path.cwd() / "e2e" / "scenarios", Path(__file__).resolve().parents[2] / "e2e" / "scenarios"]
    return next((c for c in candidates if c.is_dir()), candidates[0])


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError("must be > 0")
    return value


def _names(values: Sequence[str] | str | None) -> list[str]:
    """--only values; from the environment they arrive as one string (comma or space separated)."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [name for value in values for name in value.replace(",", " ").split()]


def add_arguments(parser: FlagParser) -> None:
    parser.add_argument("--scenarios", type=Path, default=None, help="scenario directory (default: e2e/scenarios)")
    parser.add_argument("--only", nargs="+", metavar="NAME", default=None,
                        help="run only these scenarios (a word that is no scenario's name: those whose names contain "
                        "it, e.g. --only driver)")
    parser.add_argument(
        "--kubeconfig", default=None, help="drive this real cluster with kubectl instead of starting a sandbox"
    )
    parser.add_argument("--context", default=None, help="kubeconfig context (with --kubeconfig)")
    parser.add_argument("--kubectl", default="kubectl", help="kubectl executable (with --kubeconfig)")
    parser.add_argument(
        "--timeout",
        type=_positive,
        default=None,
        help=f"seconds each step may take (default {SANDBOX_STEP_TIMEOUT:.0f} on the sandbox, "
        f"{CLUSTER_STEP_TIMEOUT:.0f} on a cluster; a scenario may set its own)",
    )
    add_runtime_argument(parser)
    parser.add_argument("--work-dir", type=Path, default=None, help="sandbox work dir (default: a new dir in /tmp)")
    parser.add_argument(
        "--kubernetes",
        choices=("sandbox", "upstream"),
        default="sandbox",
        help="sandbox: the bench's own Kubernetes; upstream: upstream's control plane with the same nodes joined "
        "(node-h100 a real kubelet with containerd, the others the kubelet simulator's), as `dra-sandbox up "
        "--kubernetes upstream` starts it (docs/upstream.md)",
    )
    parser.add_argument("--kubernetes-version", default=None,
                        help="with --kubernetes upstream: the release, 1.34-1.37 (default 1.37)")
    apply_env_defaults(parser)


@contextmanager
def sandbox_backend(
    work_dir: Path,
    runtime: str,
    write: Callable[[str], None],
    consumable_shares: str | None = None,
    aliases: Collection[str] | None = None,
    kind: str | None = None,
    passthrough: bool = False,
    driver_absent: bool = False,
    vgpu: str | None = None,
    device_plugin: bool = False,
    fabric_partitions: bool = False,
) -> Iterator[SandboxBackend]:
    # Imported here: the sandbox pulls in grpc and the API server, which a kubectl run never needs.
    from dra_driver.observability.logging import configure_logging
    from dra_sandbox.cluster import SandboxCluster

    configure_logging("warning", "text", stream=sys.stderr)
    nodes = ", ".join(f"{name} ({nvml})" for alias, (name, nvml) in E2E_NODES.items()
                      if aliases is None or alias in aliases)
    mode = f" with --consumable-shares {consumable_shares}" if consumable_shares else ""
    mode += " with passthrough" if passthrough else ""
    mode += " without their NVIDIA driver" if driver_absent else ""
    mode += f" as vGPU hosts ({'mediated devices' if vgpu == VGPU_MDEV else 'SR-IOV'})" if vgpu else ""
    mode += " with the device-plugin API" if device_plugin else ""
    mode += " with Fabric Manager partitions" if fabric_partitions else ""
    config = e2e_cluster_config(work_dir, runtime, consumable_shares=consumable_shares, aliases=aliases,
                                passthrough=passthrough, driver_absent=driver_absent, vgpu=vgpu,
                                device_plugin=device_plugin, fabric_partitions=fabric_partitions)
    if kind == COMPUTE_DOMAIN_CLUSTER:
        config = compute_domain_cluster_config(work_dir, runtime, aliases)
        nodes = ", ".join(f"{n.name} ({n.nvml})" for n in config.nodes)
    write(f"sandbox: starting nodes {nodes}{mode}; work dir {work_dir} (plugin logs: {work_dir}/<node>/plugin.log)")
    # SIGINT (even when a shell started us in the background with it ignored), SIGTERM and SIGHUP raise
    # StopRequested, so the cluster is stopped and no kubelet-plugin process stays behind.
    with stop_on_signals(), SandboxCluster(config) as cluster:
        assert cluster.runtime is not None
        write(f"sandbox: up; containers run with {cluster.runtime.name}; CDI specs in {cluster.cdi_root}")
        yield SandboxBackend(cluster)


def run_scenarios(
    scenarios: Sequence[Scenario], backend: Backend, step_timeout: float, write: Callable[[str], None]
) -> int:
    return report(Runner(backend, RunnerConfig(step_timeout=step_timeout), write=write).run(scenarios), write)


def report(results: Sequence[ScenarioResult], write: Callable[[str], None]) -> int:
    line, code = summary(results)
    write("")
    for result in results:
        write(format_result(result))
    write(line)
    return code


def _nodes_needed(dedicated: bool, group: Sequence[Scenario]) -> frozenset[str] | None:
    """The default sandbox has every node (a scenario may rely on another node being there to be passed over);
    one started for a --consumable-shares mode, for passthrough or for another `cluster` (`dedicated`) has only the
    nodes its scenarios name (None: all, when one names none)."""
    if not dedicated or any(not s.node_aliases for s in group):
        return None
    return frozenset().union(*(s.node_aliases for s in group))


def run(args: argparse.Namespace) -> int:
    def write(line: str) -> None:
        print(line, flush=True)

    root = args.scenarios or default_scenarios_dir()
    try:
        scenarios = load_scenarios(root, _names(args.only))
    except ScenarioError as exc:
        print(f"dra-sandbox e2e: invalid scenarios:\n{exc}", file=sys.stderr)
        return 2
    write(f"e2e: {len(scenarios)} scenario(s) from {root}: {', '.join(s.name for s in scenarios)}")
    upstream = getattr(args, "kubernetes", "sandbox") == "upstream"
    minor = getattr(args, "kubernetes_version", None) or DEFAULT_UPSTREAM_MINOR
    if upstream and args.kubeconfig:
        print("dra-sandbox e2e: --kubernetes upstream starts its own cluster; it does not take --kubeconfig",
              file=sys.stderr)
        return 2
    if args.kubeconfig:
        backend = KubectlBackend(KubectlConfig(kubectl=args.kubectl, kubeconfig=args.kubeconfig, context=args.context))
        write(f"e2e: driving the cluster of {args.kubeconfig} with {args.kubectl}")
        return run_scenarios(scenarios, backend, args.timeout or CLUSTER_STEP_TIMEOUT, write)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(dir="/tmp", prefix="dra-e2e-"))
    # One sandbox for the scenarios that need no particular node setting, and one per --consumable-shares mode
    # that a selected scenario needs (a node runs one mode), each started only when needed, one after the other.
    # Scenarios of another `cluster` (compute-domains) and passthrough scenarios (every node's GPUs offered for
    # passthrough) get a sandbox of their own too, and so do those that change a node's NVIDIA driver (a reload
    # leaves the node with another version, so no later scenario depends on it) and those that start without it.
    # vGPU scenarios get one of vGPU hosts, Fabric Manager partition scenarios one whose FM offers partitions.
    groups: dict[tuple[str | None, str | None, bool, str | None, str | None, bool, bool], list[Scenario]] = {}
    for scenario in scenarios:
        driver = scenario.driver or ("changed" if scenario.acts_on_driver else None)
        key = (scenario.consumable_shares, scenario.cluster, scenario.passthrough, driver, scenario.vgpu,
               scenario.device_plugin, scenario.fabric_partitions)
        groups.setdefault(key, []).append(scenario)
    results: list[ScenarioResult] = []
    try:
        for (mode, kind, passthrough, driver, vgpu, device_plugin, fabric), group in groups.items():
            if kind == COMPUTE_DOMAIN_CLUSTER and (why := compute_domain_support()):
                results += [ScenarioResult(s.name, SKIP, 0.0, why, 0, len(s.steps)) for s in group]
                for skipped in results[-len(group):]:
                    write(format_result(skipped))
                continue
            directory = work_dir if mode is None else work_dir / f"cs-{mode}"  # short: AF_UNIX paths
            directory = directory / "vfio" if passthrough else directory
            directory = directory / f"vgpu-{vgpu}" if vgpu else directory
            directory = directory / "dp" if device_plugin else directory
            directory = directory / "fm" if fabric else directory
            directory = directory / ("drv0" if driver == DRIVER_ABSENT_AT_START else "drv") if driver else directory
            if kind is not None:
                directory = work_dir / "cd"
            aliases = _nodes_needed(mode is not None or passthrough or vgpu is not None or device_plugin or fabric
                                    or kind is not None or driver is not None, group)
            starting: AbstractContextManager[Backend]
            if upstream:
                from dra_sandbox.e2e.upstream import upstream_backend  # the upstream build and session modules

                starting = upstream_backend(directory, minor, write, mode, aliases, kind, passthrough,
                                           driver_absent=driver == DRIVER_ABSENT_AT_START)
            else:
                starting = sandbox_backend(directory, args.runtime, write, mode, aliases, kind, passthrough,
                                          driver_absent=driver == DRIVER_ABSENT_AT_START, vgpu=vgpu,
                                          device_plugin=device_plugin, fabric_partitions=fabric)
            timeout = args.timeout or (UPSTREAM_STEP_TIMEOUT if upstream else SANDBOX_STEP_TIMEOUT)
            with starting as cluster:
                results += Runner(cluster, RunnerConfig(step_timeout=timeout), write=write).run(group)
        return report(results, write)
    except StopRequested as stop:
        write(f"e2e: {stop}; the sandbox is stopped")
        return stop.exit_code
