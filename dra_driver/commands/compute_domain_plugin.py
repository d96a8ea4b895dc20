"""`dra-driver compute-domain-kubelet-plugin`: the compute-domain driver's per-node agent (IMEX channels and
daemons), beside `dra-driver kubelet-plugin` on every node. Flags as the GPU plugin's, each also from
`DRA_DRIVER_<FLAG>`; docs/compute-domains.md, "The compute-domain kubelet plugin"."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Final

from dra_driver import defaults
from dra_driver.commands.flags import Flag, FlagParser, add_flags
from dra_driver.commands.logging_flags import LOG_FLAGS, configure_logging_from_args
from dra_driver.computedomain.names import DRIVER_NAME

POD_UID = re.compile(r"[A-Za-z0-9-]{1,64}")


FLAGS: Final = (
    Flag("--node-name", required=True, help="this node's name (the pool name)"),
    Flag("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG)"),
    Flag("--plugin-dir", default=str(defaults.plugin_dir(DRIVER_NAME)),
         help="dra.sock, checkpoint.json, plugin.lock, publisher.lock"),
    Flag("--registry-dir", default=str(defaults.KUBELET_REGISTRY_DIR), help="kubelet plugin registry"),
    Flag("--cdi-root", default=str(defaults.CDI_ROOT), help="where per-claim CDI specs are written"),
    Flag("--state-dir", default="",
         help="where the IMEX daemons' config dirs are (domains/<uid>/; the same path on the host, it is what the "
              "daemon's CDI mount names); default: the plugin dir"),
    Flag("--driver-root", default="/", help="host NVIDIA driver root as seen by this process"),
    Flag("--proc-root", default="",
         help="the host's /proc as this process sees it (/proc/devices, the fabric-management capability); default "
              "/proc, on the fake NVML a fake tree under the state dir"),
    Flag("--nvml", default="real", help="real | fake:<preset>[,state=PATH] | fake:<node.yaml>"),
    Flag("--driver-wait-max-interval", type=float, default=defaults.DRIVER_WAIT_MAX_INTERVAL_S,
         help="the NVIDIA driver is waited for at start (not registered, readiness false with the reason), as by the "
              "GPU plugin: seconds between checks back off up to this (chart driverWait.intervalSeconds)"),
    Flag("--driver-namespace", default="", fallback_env="POD_NAMESPACE",
         help="the namespace of the ComputeDomainCliques (default: $POD_NAMESPACE, else default)"),
    Flag("--gpu-clique-label", choices=("on", "off"), default="off",
         help="set nvidia.com/gpu.clique=<clusterUUID>.<cliqueID> on this Node, as GPU Feature Discovery does (off: "
              "leave it to GFD)"),
    Flag("--binding-conditions", choices=("auto", "off"), default="auto",
         help="auto: on Kubernetes 1.36+ channel devices carry KEP-5007 binding conditions (the scheduler waits for "
              "IMEX readiness); off: never, prepare checks readiness"),
    Flag("--readiness-wait", type=float, default=10.0,
         help="seconds one prepare of a channel waits for this node's IMEX daemon to be Ready before it answers with "
              "a retryable error (the kubelet asks again)"),
    Flag("--healthz-port", type=int, default=defaults.CD_HEALTHZ_PORT,
         help="HTTP /healthz (and /metrics) port; -1 disables it"),
    Flag("--metrics-port", type=int, default=defaults.CD_METRICS_PORT, help="Prometheus /metrics port; -1 disables it"),
    Flag("--boot-id-path", default=str(defaults.BOOT_ID_PATH), help="node boot id file"),
    Flag("--cleanup-interval", type=float, default=defaults.CLEANUP_INTERVAL_S,
         help="seconds between sweeps (claims deleted while prepared, expired aborted prepares)"),
    Flag("--shutdown-grace", type=float, default=defaults.SHUTDOWN_GRACE_S,
         help="seconds in-flight calls get to finish on SIGTERM"),
    Flag("--pod-uid", default="", help="this pod's UID: per-instance socket names (rolling updates)"),
    *LOG_FLAGS,
)


def add_arguments(parser: FlagParser) -> None:
    add_flags(parser, FLAGS)


def run(args: argparse.Namespace) -> int:
    configure_logging_from_args(args)
    from dra_driver.commands.nvml_flags import nvml_from_args
    from dra_driver.computedomain.plugin.app import CdPluginSettings, ComputeDomainPlugin
    from dra_driver.computedomain.plugin.faults import CdFaultPoints
    from dra_driver.errors import DraDriverError
    from dra_driver.k8s.client import connect
    from dra_driver.nvidiadriver.wait import DriverPaths, DriverWaitSettings

    prog = "dra-driver compute-domain-kubelet-plugin"
    if args.pod_uid and not POD_UID.fullmatch(args.pod_uid):
        print(f"{prog}: --pod-uid {args.pod_uid!r} is not a pod UID (letters, digits and '-')", file=sys.stderr)
        return 2
    if not args.driver_wait_max_interval > 0:
        print(f"{prog}: --driver-wait-max-interval {args.driver_wait_max_interval}: give a number of seconds above 0 "
              "(chart value driverWait.intervalSeconds)", file=sys.stderr)
        return 2
    fake = args.nvml.startswith("fake:")
    plugin_dir = Path(args.plugin_dir)
    state_dir = Path(args.state_dir) if args.state_dir else plugin_dir
    proc_root = Path(args.proc_root) if args.proc_root else (state_dir / "fake-proc" if fake else Path("/proc"))
    try:
        faults = CdFaultPoints.from_env()
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    settings = CdPluginSettings(
        node_name=args.node_name, plugin_dir=plugin_dir, registry_dir=Path(args.registry_dir),
        cdi_root=Path(args.cdi_root), state_dir=state_dir, proc_root=proc_root,
        driver_namespace=args.driver_namespace or "default",
        fake=fake and not args.proc_root, boot_id_path=Path(args.boot_id_path),
        cleanup_interval=args.cleanup_interval, readiness_wait=max(0.0, args.readiness_wait),
        shutdown_grace=args.shutdown_grace, pod_uid=args.pod_uid or None,
        gpu_clique_label=args.gpu_clique_label == "on", binding_conditions=args.binding_conditions == "auto",
        healthz_port=None if args.healthz_port < 0 else args.healthz_port,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        # The fake backend has no driver files: only its init() says whether its driver is loaded. The real one's
        # checks only explain a failing init: this container mounts the driver root, not the host's /dev or /sys.
        driver_wait=DriverWaitSettings(
            max_interval=args.driver_wait_max_interval,
            paths=None if fake else DriverPaths(
                driver_root=Path(args.driver_root), host_driver_root=Path(args.driver_root),
                proc_root=Path(args.proc_root or "/proc"),
            ),
        ),
    )
    nvml = nvml_from_args(args, prog)
    if nvml is None:
        return 1
    # NVML is initialised inside the plugin: it waits for the driver (nvidiadriver/wait.py) and shuts NVML down.
    try:
        # Its own component in the User-Agent: the chart grants it its own roles (templates/computedomains.yaml),
        # bound to the plugin pod's service account.
        rest = connect(args.kubeconfig, component="compute-domain-kubelet-plugin")
        plugin = ComputeDomainPlugin(settings, nvml=nvml, rest=rest, faults=faults)
        return plugin.run_until_signal()
    except DraDriverError as exc:
        print(f"{prog}: cannot start: {exc}", file=sys.stderr)
        return 1
