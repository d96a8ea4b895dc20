"""`dra-driver compute-domain-daemon run|check`: the IMEX daemon of a ComputeDomain on one node (the container the
controller's DaemonSet runs), and its readiness probe. docs/compute-domains.md, "The IMEX daemon runner"."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType
from typing import Final

from dra_driver.commands.flags import Flag, FlagParser, add_flags
from dra_driver.commands.logging_flags import LOG_FLAGS, configure_logging_from_args
from dra_driver.computedomain import names

DAEMON_COMMAND = "dra-driver compute-domain-daemon"


FLAGS: Final = (
    Flag("action", choices=("run", "check"),
         help="run: the daemon (until SIGTERM); check: exit 0 iff the local IMEX reports READY"),
    Flag("--config-dir", default=names.DAEMON_CONFIG_MOUNT,
         help="where imexd.cfg, nodes.cfg and the hosts file are written (the daemon claim mounts it)"),
    Flag("--imex-bin-dir", default="",
         help="directory holding nvidia-imex and nvidia-imex-ctl (default: found on PATH)"),
    Flag("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG)"),
    Flag("--max-nodes", type=int, default=names.MAX_NODES_PER_IMEX_DOMAIN, fallback_env=names.ENV_MAX_NODES,
         help=f"slots in the clique's node map; all daemons of a domain must agree "
              f"(env {names.ENV_MAX_NODES}, default {names.MAX_NODES_PER_IMEX_DOMAIN})"),
    Flag("--driver-namespace", default="", fallback_env="POD_NAMESPACE",
         help="namespace of the ComputeDomainClique objects (default: POD_NAMESPACE)"),
    Flag("--system-hosts-file", default="/etc/hosts",
         help="hosts file the real nvidia-imex resolves peers through; the runner keeps its own block there (other "
              "lines untouched); '' writes only <config-dir>/hosts (the sandbox's stand-in)"),
    Flag("--readiness-interval", type=float, default=2.0,
         help="seconds between nvidia-imex-ctl -q runs mirrored into the clique entry's status"),
    Flag("--reload-interval", type=float, default=5.25,
         help="minimum seconds between SIGUSR1s to nvidia-imex (it honours one per 5 s; NVIDIA #1443)"),
    # Set by the DaemonSet's downward API (node, pod IP) and the daemon claim's CDI edits (clique, domain).
    Flag("--node-name", default="", fallback_env="NODE_NAME", help="this node's name"),
    Flag("--pod-ip", default="", fallback_env="POD_IP", help="this pod's IP, the peers' address of it"),
    Flag("--clique-id", default="", fallback_env=names.ENV_CLIQUE_ID,
         help="the NVLink clique this node's GPUs are in; '' serves nothing (a node without one)"),
    Flag("--domain-uid", default="", fallback_env=names.ENV_DOMAIN_UUID, help="the ComputeDomain's UID"),
    Flag("--domain-name", default="", fallback_env=names.ENV_DOMAIN_NAME, help="the ComputeDomain's name"),
    Flag("--domain-namespace", default="", fallback_env=names.ENV_DOMAIN_NAMESPACE,
         help="the ComputeDomain's namespace"),
    *LOG_FLAGS,
)


def add_arguments(parser: FlagParser) -> None:
    add_flags(parser, FLAGS)


def run(args: argparse.Namespace) -> int:
    configure_logging_from_args(args)
    if args.action == "check":
        return _check(args)
    from dra_driver.computedomain.daemon.runner import DaemonRunner, DaemonSettings
    from dra_driver.errors import DraDriverError
    from dra_driver.k8s.client import connect

    if args.max_nodes < 1:
        print(f"{DAEMON_COMMAND}: --max-nodes / {names.ENV_MAX_NODES} must be a whole number >= 1 "
              f"(got {args.max_nodes!r})", file=sys.stderr)
        return 2
    settings = DaemonSettings(
        config_dir=args.config_dir,
        node_name=args.node_name,
        pod_ip=args.pod_ip,
        clique_id=args.clique_id,
        domain_uid=args.domain_uid,
        domain_name=args.domain_name,
        domain_namespace=args.domain_namespace,
        namespace=args.driver_namespace,
        max_nodes=args.max_nodes,
        imex_bin_dir=args.imex_bin_dir,
        system_hosts_file=args.system_hosts_file,
        readiness_interval=max(0.1, args.readiness_interval),
        reload_interval=max(0.0, args.reload_interval),
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        settings.validate()
        rest = connect(args.kubeconfig, component="compute-domain-daemon") if settings.clique_id else None
        return DaemonRunner(settings, rest, stop).run()
    except DraDriverError as exc:
        print(f"{DAEMON_COMMAND}: {exc}", file=sys.stderr)
        return 1
    finally:
        # Python puts its own handlers back to the default while it exits: a second SIGTERM then would end the
        # process by the signal instead of with the status the runner returned.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)


def _check(args: argparse.Namespace) -> int:
    """NVIDIA's probe: `nvidia-imex-ctl -c <cfg> -q` must print exactly READY. Without a clique nothing is served,
    so there is nothing to wait for: ready (as NVIDIA's check)."""
    from dra_driver.computedomain.daemon.config import ImexConfig
    from dra_driver.computedomain.daemon.imex import IMEX_CTL_BINARY, ImexNotFound, find_binary, query_ready

    if not args.clique_id:
        return 0
    try:
        ctl = find_binary(IMEX_CTL_BINARY, args.imex_bin_dir)
    except ImexNotFound as exc:
        print(f"{DAEMON_COMMAND} check: {exc}", file=sys.stderr)
        return 1
    return 0 if query_ready(ctl, ImexConfig(args.config_dir, "").config_path) else 1
