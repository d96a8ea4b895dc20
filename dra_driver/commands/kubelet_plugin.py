"""`dra-driver kubelet-plugin`: the per-node agent."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Final

from dra_driver import defaults
from dra_driver.commands.deviceplugin_flags import DEVICE_PLUGIN_FLAGS, device_plugin_from_args
from dra_driver.commands.dispatch import pause_gc
from dra_driver.commands.fabricmanager_flags import FABRIC_MANAGER_FLAGS, fabric_manager_from_args
from dra_driver.commands.flags import Flag, FlagParser, add_flags
from dra_driver.commands.health_flags import HEALTH_FLAGS, ignored_xids_from_args
from dra_driver.commands.logging_flags import LOG_FLAGS, configure_logging_from_args
from dra_driver.commands.sharing_flags import SHARING_FLAGS, sharing_from_args
from dra_driver.inventory.catalog import MIG_MODE_HELP, MigOffering
from dra_driver.inventory.passthrough import (
    ALLOW_REBIND_HELP,
    COMPATIBILITY_GROUPS_HELP,
    PASSTHROUGH_HELP,
    passthrough_settings,
)
from dra_driver.inventory.vgpu import VGPU_HELP, vgpu_settings
from dra_driver.nvidiadriver.wait import DriverPaths
from dra_driver.pci.model import rebind_allowance
from dra_driver.slices.nodeallocatable import HELP as NODE_ALLOCATABLE_HELP
from dra_driver.slices.nodeallocatable import parse_overhead

if TYPE_CHECKING:
    # A type here: this module loads the layout check at run time in `_check_driver_layout` (a real node only).
    from dra_driver.plugin.driverlayout import CdiHookBinary

# A socket file name is built from it: nothing that could leave the directory.
POD_UID = re.compile(r"[A-Za-z0-9-]{1,64}")


def _feature_mode(name: str, help: str) -> Flag:
    """A flag read as a `k8s.serverfeatures.FeatureMode`: whether to send a field the API server keeps only behind
    a feature gate."""
    return Flag(name, choices=("auto", "on", "off"), default="auto", help=help)


FLAGS: Final = (
    Flag("--node-name", required=True, help="this node's name (the pool name)"),
    Flag("--driver-name", default=defaults.DRIVER_NAME, help="DRA driver name"),
    Flag("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG)"),
    Flag("--plugin-dir", help="default /var/lib/kubelet/plugins/<driver-name>"),
    Flag("--registry-dir", default=str(defaults.KUBELET_REGISTRY_DIR), help="kubelet plugin registry"),
    Flag("--cdi-root", default=str(defaults.CDI_ROOT), help="where per-claim CDI specs are written"),
    Flag("--driver-root", default="/", help="host NVIDIA driver root as seen by this process"),
    Flag("--host-driver-root", default="/", help="the same driver root as the host sees it"),
    # The NVIDIA container toolkit's CDI hook (docs/gpu-operator.md; checked at start by plugin/driverlayout.py).
    Flag("--cdi-hooks", choices=("auto", "on", "off"), default="off",
         help="the container toolkit's nvidia-cdi-hook in claim CDI specs: auto (where found under --toolkit-dir), on "
              "(refuse to start without it), off"),
    Flag("--toolkit-dir", default="", help="the toolkit's binary dir as seen by this process"),
    Flag("--host-toolkit-dir", default="/usr/bin",
         help="the same dir on the host (/usr/bin: packaged toolkit; /usr/local/nvidia/toolkit: GPU Operator)"),
    Flag("--nvml", default="real", help="real | fake:<preset>[,state=PATH] | fake:<node.yaml>"),
    Flag("--mig-mode", choices=[p.value for p in MigOffering], default=MigOffering.DYNAMIC.value, help=MIG_MODE_HELP),
    *SHARING_FLAGS,
    Flag("--passthrough", default="none", help=PASSTHROUGH_HELP),
    Flag("--compatibility-groups", choices=("on", "off"), default="off", help=COMPATIBILITY_GROUPS_HELP),
    Flag("--passthrough-allow-rebind", default="", help=ALLOW_REBIND_HELP),
    Flag("--vgpu", default="none", help=VGPU_HELP),
    Flag("--fabric-partitions", choices=("on", "off"), default="off",
         help="on: offer Fabric Manager's shared-NVSwitch GPU partitions to VMs (fm-partition-<id>; "
              "docs/passthrough.md); needs Fabric Manager in shared NVSwitch mode"),
    *FABRIC_MANAGER_FLAGS,
    Flag("--node-allocatable-overhead", default="none", help=NODE_ALLOCATABLE_HELP),
    Flag("--sysfs-root", default="/sys", help="the host's sysfs as seen by this process (passthrough)"),
    Flag("--dev-root", default="/dev", help="the host's /dev as seen by this process (passthrough, /dev/nvidiactl)"),
    Flag("--proc-root", default="/proc", help="the host's /proc as seen by this process (driver/nvidia/version)"),
    Flag("--driver-wait-max-interval", type=float, default=defaults.DRIVER_WAIT_MAX_INTERVAL_S,
         help="the NVIDIA driver is waited for at start (not registered, nothing published, readiness false with the "
              "reason): seconds between checks back off up to this (chart driverWait.intervalSeconds)"),
    Flag("--healthz-port", type=int, default=defaults.HEALTHZ_PORT, help="HTTP /healthz port; -1 disables it"),
    Flag("--metrics-port", type=int, default=defaults.METRICS_PORT, help="Prometheus /metrics port; -1 disables it"),
    Flag("--ports-file", default="",
         help="once listening, write the bound HTTP ports here as JSON ({\"healthz\": N, \"metrics\": M}); with port 0 "
              "the kernel picks free ones (a supervisor running several plugins on one host reads them here)"),
    Flag("--usage-interval", type=float, default=defaults.USAGE_INTERVAL_S,
         help="seconds between usage samples (utilization, memory, power …) of prepared devices; 0 disables"),
    Flag("--boot-id-path", default=str(defaults.BOOT_ID_PATH), help="node boot id file"),
    Flag("--cleanup-interval", type=float, default=defaults.CLEANUP_INTERVAL_S,
         help="seconds between stale-claim sweeps"),
    Flag("--rediscovery-interval", type=float, default=defaults.REDISCOVERY_INTERVAL_S,
         help="seconds between hardware re-discoveries (also SIGHUP)"),
    *HEALTH_FLAGS,
    Flag("--events", choices=("on", "off"), default="on",
         help="record Kubernetes Events: failed prepare/unprepare on the ResourceClaim, taint changes on the Node"),
    Flag("--shutdown-grace", type=float, default=defaults.SHUTDOWN_GRACE_S,
         help="seconds in-flight calls get to finish on SIGTERM (keep below the pod's termination grace period)"),
    Flag("--pod-uid", default="",
         help="this pod's UID (downward API metadata.uid): per-instance socket names, so that the old and the new pod "
              "of a rolling update serve side by side (kubelet >= 1.33); empty: one instance per node"),
    _feature_mode("--list-attributes",
                  help="publish list-type attributes (KEP-5491): resource.kubernetes.io/numaNode as [node, "
                       "same-socket nearest nodes]; auto: where the API server keeps them (Kubernetes 1.36+ with the "
                       "DRAListTypeAttributes feature gate, alpha, off by default; found by a dry-run create at "
                       "start), else the int form; on: the same, and an error in the log where the server does not "
                       "keep them; off: never (docs/reference/dra-in-flight.md)"),
    _feature_mode("--partition-types",
                  help="KEP-5677 partition types: each counter-consuming device carries the string attribute "
                       "partitionType and its slices name it in spec.partitionTypeAttribute, so a "
                       "ResourcePoolStatusRequest reports per type how many devices still fit; auto: where the API "
                       "server keeps the field (Kubernetes 1.37+ with the DRAPartitionableDevicesType feature gate, "
                       "alpha, off by default; found by a dry-run create at start) and the pool is one "
                       "kube-controller-manager can summarise (at most 32 types); on: the same, and an error in the "
                       "log where the server does not keep it; off: never (docs/reference/dra-in-flight.md)"),
    Flag("--device-metadata", choices=("auto", "on", "off"), default="auto",
         help="KEP-5304 device metadata: a JSON file per prepared claim request, bind-mounted into its containers "
              "under /var/run/kubernetes.io/dra-device-attributes/ (attributes such as "
              "resource.kubernetes.io/pciBusID); auto: on where the API server is 1.36 or newer "
              "(docs/kubelet-plugin.md)"),
    Flag("--mps", choices=("on", "off"), default="on",
         help="serve MPS sharing (mpsConfig, GPU shares) with nvidia-cuda-mps-control daemons; off: such claims fail"),
    Flag("--mps-root", default="",
         help="where each MPS daemon gets its pipe/log/shm directories (default <plugin-dir>/mps); every parent must "
              "be traversable by the UIDs of the clients, so not under the kubelet's 0700/0750 directories"),
    Flag("--mps-cgroup-root", default="",
         help="a host cgroup v2 hierarchy mounted here: MPS daemons are moved into <root>/dra-gpu-mps/<id> so they "
              "outlive the plugin's container; empty: they stop with it and are restarted by the next plugin"),
    *DEVICE_PLUGIN_FLAGS,
    *LOG_FLAGS,
)


def add_arguments(parser: FlagParser) -> None:
    add_flags(parser, FLAGS)


def run(args: argparse.Namespace) -> int:
    # No cyclic GC while the plugin's modules load, its NVML backend's included (dispatch.pause_gc says why).
    resume_gc = pause_gc()
    try:
        return _run(args, resume_gc=resume_gc)
    finally:
        resume_gc()  # a refusal before NVML was opened: the collector is as it was


def _run(args: argparse.Namespace, *, resume_gc: Callable[[], None]) -> int:
    configure_logging_from_args(args)
    from dra_driver.commands.nvml_flags import nvml_from_args
    from dra_driver.errors import DraDriverError
    from dra_driver.k8s.client import connect
    from dra_driver.k8s.serverfeatures import FeatureMode
    from dra_driver.nvidiadriver.wait import DriverWaitSettings
    from dra_driver.nvml.factory import open_mps_control
    from dra_driver.plugin.app import KubeletPlugin, PluginSettings
    from dra_driver.plugin.devicemetadata import DeviceMetadataMode
    from dra_driver.plugin.faults import FaultPoints

    if args.pod_uid and not POD_UID.fullmatch(args.pod_uid):
        print(
            f"dra-driver kubelet-plugin: --pod-uid {args.pod_uid!r} is not a pod UID (letters, digits and '-', "
            "at most 64; the chart sets it from metadata.uid)",
            file=sys.stderr,
        )
        return 2
    if not args.driver_wait_max_interval > 0:
        print(
            f"dra-driver kubelet-plugin: --driver-wait-max-interval {args.driver_wait_max_interval}: give a number of "
            "seconds above 0 (chart value driverWait.intervalSeconds)",
            file=sys.stderr,
        )
        return 2
    fake = args.nvml.startswith("fake:")
    try:
        ignored_xids = ignored_xids_from_args(args)
        sharing = sharing_from_args(args)
        passthrough = replace(
            passthrough_settings(args.passthrough, compatibility_groups=args.compatibility_groups == "on"),
            allow_rebind=rebind_allowance(args.passthrough_allow_rebind),
        )
        vgpu = vgpu_settings(args.vgpu)
        overhead = parse_overhead(args.node_allocatable_overhead)
        fabric_manager = fabric_manager_from_args(args)
    except ValueError as exc:
        print(f"dra-driver kubelet-plugin: {exc}", file=sys.stderr)
        return 2
    # Where the driver is, as the layout check and the driver wait read it (flags of the same names).
    paths = DriverPaths(
        driver_root=Path(args.driver_root), host_driver_root=Path(args.host_driver_root),
        dev_root=Path(args.dev_root), proc_root=Path(args.proc_root), sys_root=Path(args.sysfs_root),
    )  # fmt: skip
    cdi_hook = None
    if not fake:
        layout_ok, cdi_hook = _check_driver_layout(args, paths)
        if not layout_ok:
            return 1
    settings = PluginSettings(
        node_name=args.node_name,
        driver_name=args.driver_name,
        plugin_dir=Path(args.plugin_dir) if args.plugin_dir else defaults.plugin_dir(args.driver_name),
        registry_dir=Path(args.registry_dir),
        cdi_root=Path(args.cdi_root),
        driver_root=Path(args.driver_root),
        host_driver_root=Path(args.host_driver_root),
        mig_offering=MigOffering(args.mig_mode),
        sharing=sharing,
        passthrough=passthrough,
        vgpu=vgpu,
        fabric_partitions=args.fabric_partitions == "on",
        sysfs_root=Path(args.sysfs_root),
        dev_root=Path(args.dev_root),
        fake_cdi=fake,
        healthz_port=None if args.healthz_port < 0 else args.healthz_port,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        ports_file=Path(args.ports_file) if args.ports_file else None,
        usage_interval=max(0.0, args.usage_interval),
        boot_id_path=Path(args.boot_id_path),
        cleanup_interval=args.cleanup_interval,
        rediscovery_interval=args.rediscovery_interval,
        shutdown_grace=args.shutdown_grace,
        health_monitor=args.health_monitor == "on",
        ignored_xids=ignored_xids,
        health_heal_after=args.health_heal_after,
        health_heal_after_max=args.health_heal_after_max,
        health_check_interval=args.health_check_interval,
        events=args.events == "on",
        list_attributes=FeatureMode(args.list_attributes),
        partition_types=FeatureMode(args.partition_types),
        node_allocatable_overhead=overhead,
        device_metadata=DeviceMetadataMode(args.device_metadata),
        pod_uid=args.pod_uid or None,
        mps_root=Path(args.mps_root) if args.mps_root else None,
        cdi_hook=cdi_hook,
        device_plugin=device_plugin_from_args(args),
        # The fake backend has no driver files: only its init() says whether its driver is loaded.
        driver_wait=DriverWaitSettings(
            max_interval=args.driver_wait_max_interval,
            paths=None if fake else paths,
        ),
    )
    nvml = nvml_from_args(args, "dra-driver kubelet-plugin", fabric_manager=fabric_manager)
    # Loaded: from here the plugin makes garbage of its own (JSON, HTTP answers), which the collector may free.
    resume_gc()
    if nvml is None:
        return 1
    # NVML is initialised inside the plugin: it waits for the driver (nvidiadriver/wait.py) and shuts NVML down.
    try:
        plugin = KubeletPlugin(
            settings,
            nvml=nvml,
            rest=connect(args.kubeconfig, component="kubelet-plugin"),
            faults=FaultPoints.from_env(),
            mps_control=(
                open_mps_control(nvml, driver_root=str(settings.driver_root), cgroup_root=args.mps_cgroup_root or None)
                if args.mps == "on"
                else None
            ),
        )
        return plugin.run_until_signal()
    except DraDriverError as exc:
        # A refusal with a message for the admin (an unusable directory, a node state held too long): no traceback.
        print(f"dra-driver kubelet-plugin: cannot start: {exc}", file=sys.stderr)
        return 1


def _check_driver_layout(args: argparse.Namespace, paths: DriverPaths) -> tuple[bool, CdiHookBinary | None]:
    """The driver layout check at start (docs/gpu-operator.md): every problem is logged; an ERROR (a layout that
    is clearly wrong) refuses the start; WAIT problems are the reason the driver is not ready (the plugin goes on to
    wait for NVML). Returns (may start, the toolkit hook the CDI specs may use)."""
    import structlog

    from dra_driver.plugin.driverlayout import (
        CdiHooks,
        LayoutSettings,
        Severity,
        probe_layout,
        refusal,
        resolve_cdi_hook,
    )
    from dra_driver.plugin.driverlayout import check_driver_layout as check

    log = structlog.get_logger("dra_driver.plugin.driverlayout")
    layout = LayoutSettings(
        paths=paths,
        cdi_hooks=CdiHooks(args.cdi_hooks),
        toolkit_dir=Path(args.toolkit_dir) if args.toolkit_dir else None,
        host_toolkit_dir=args.host_toolkit_dir,
    )
    facts = probe_layout(layout)
    problems = check(layout, facts)
    for problem in problems:
        (log.error if problem.severity is Severity.ERROR else log.warning)(
            "NVIDIA driver layout", severity=problem.severity.value, problem=problem.message
        )
    refused = refusal(problems)
    if refused is not None:
        print(f"dra-driver kubelet-plugin: cannot start: {refused}", file=sys.stderr)
        return False, None
    hook = resolve_cdi_hook(layout, facts)
    log.info("container toolkit CDI hook", mode=args.cdi_hooks, hook=hook.host_path if hook else None)
    return True, hook
