"""`dra-driver controller`: the cluster-wide controller of GpuSharingPolicies and, with `--compute-domains`, of
ComputeDomains (one Deployment per cluster)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from typing import Final

from dra_driver import defaults
from dra_driver.commands.flags import Flag, FlagParser, add_flags
from dra_driver.commands.logging_flags import LOG_FLAGS, configure_logging_from_args

FLAGS: Final = (
    Flag("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG)"),
    Flag("--driver-name", default=defaults.DRIVER_NAME, help="DRA driver name the classes select"),
    Flag("--healthz-port", type=int, default=defaults.CONTROLLER_HEALTHZ_PORT, help="liveness /healthz; -1 disables"),
    Flag("--resync-interval", type=float, default=defaults.CONTROLLER_RESYNC_S,
         help="seconds between re-checks of every policy's DeviceClass"),
    Flag("--webhook", switch=True, help="serve the validating admission webhook (docs/webhook.md)"),
    Flag("--webhook-port", type=int, default=defaults.CONTROLLER_WEBHOOK_PORT, help="webhook HTTPS port"),
    Flag("--webhook-bind-address", default=defaults.CONTROLLER_WEBHOOK_BIND_ADDRESS,
         help="IP address the webhook listens on: 0.0.0.0 every IPv4 address, :: every IPv6 address, or one address "
              "(the chart passes the pod's IP)"),
    Flag("--webhook-max-request-bytes", type=int, default=defaults.CONTROLLER_WEBHOOK_MAX_REQUEST_BYTES,
         help="larger admission reviews are answered 413 unread; the default fits an UPDATE of two objects at the API "
              "server's 3 MiB request limit (docs/webhook.md)"),
    Flag("--webhook-cert", default="", help="webhook serving certificate (PEM); re-read when it changes"),
    Flag("--webhook-key", default="", help="private key of --webhook-cert (PEM)"),
    Flag("--webhook-managed-configuration", default="",
         help="let the controller create/patch a ValidatingWebhookConfiguration of this name (url clientConfig; needs "
              "RBAC on validatingwebhookconfigurations). Empty: the chart renders it"),
    Flag("--webhook-host", default="", help="hostname in a managed configuration's URL"),
    Flag("--webhook-ca", default="", help="CA advertised as caBundle in a managed configuration"),
    Flag("--webhook-failure-policy", choices=("Ignore", "Fail"), default="Ignore", help="of a managed configuration"),
    Flag("--status-interval", type=float, default=defaults.CONTROLLER_STATUS_INTERVAL_S,
         help="at most one recount of a policy's status.devices/nodes/claims per this many seconds (a change is "
              "counted once the cluster has been quiet for 0.2 s, or after this long)"),
    Flag("--stale-slice-grace", type=float, default=defaults.CONTROLLER_STALE_SLICE_GRACE_S,
         help="delete the driver's ResourceSlices of a Node missing this many seconds; 0 disables"),
    Flag("--leader-elect", switch=True,
         help="only the holder of a coordination.k8s.io Lease reconciles (several replicas); docs/policies.md"),
    Flag("--lease-name", default="dra-driver-controller", help="the leader Lease's name"),
    Flag("--lease-namespace", default="", fallback_env="POD_NAMESPACE",
         help="the leader Lease's namespace (default: $POD_NAMESPACE, else default)"),
    Flag("--lease-duration", type=float, default=defaults.CONTROLLER_LEASE_DURATION_S,
         help="seconds a follower waits on a Lease nobody renews before taking over; the leader renews every third of "
              "it and steps down after two thirds without a renewal"),
    Flag("--identity", default="", fallback_env="POD_NAME",
         help="this replica's name in the Lease (default: $POD_NAME, else the hostname)"),
    Flag("--metrics-port", type=int, default=defaults.CONTROLLER_METRICS_PORT, help="Prometheus /metrics; -1 disables"),
    # --- ComputeDomains (docs/compute-domains.md "The controller") ---
    Flag("--compute-domains", switch=True,
         help="reconcile ComputeDomains: claim templates, the IMEX daemon DaemonSet, status, binding conditions"),
    Flag("--compute-domain-namespace", default="", fallback_env="POD_NAMESPACE",
         help="the driver's namespace: IMEX daemon DaemonSets, their claim templates and the cliques (default: "
              "$POD_NAMESPACE, else default)"),
    Flag("--compute-domain-daemon-image", default="",
         help="image of the IMEX daemon pods (the driver's image; required with --compute-domains)"),
    Flag("--compute-domain-daemon-image-pull-policy", default="IfNotPresent",
         choices=("Always", "IfNotPresent", "Never"), help="pull policy of the daemon pods"),
    Flag("--compute-domain-daemon-service-account", default="",
         help="service account of the daemon pods (empty: the namespace's default)"),
    Flag("--compute-domain-status-interval", type=float, default=2.0,
         help="seconds between ComputeDomain passes (status.nodes, status.status, binding conditions)"),
    Flag("--compute-domain-binding-timeout", type=float, default=300.0,
         help="seconds a channel claim waits for its node's IMEX daemon before imex-failed sends the pod back to "
              "scheduling; keep it below the scheduler's bindingTimeout (600 s by default)"),
    Flag("--max-nodes-per-imex-domain", type=int, default=18,
         help="nodes of one clique in one IMEX domain (the daemons' node map size)"),
    *LOG_FLAGS,
    Flag("--print-crd", switch=True, help="print the GpuSharingPolicy CRD (YAML) and exit"),
)


def add_arguments(parser: FlagParser) -> None:
    add_flags(parser, FLAGS)


MIN_WEBHOOK_REQUEST_BYTES = 1024 * 1024


def webhook_flag_problem(args: argparse.Namespace) -> str:
    """What is wrong with the webhook's flags; empty when nothing is."""
    if bool(args.webhook_cert) != bool(args.webhook_key):
        return "--webhook-cert and --webhook-key go together"
    try:
        ipaddress.ip_address(args.webhook_bind_address)
    except ValueError:
        return (f"--webhook-bind-address {args.webhook_bind_address!r} is not an IP address; give 0.0.0.0 (every "
                "IPv4 address), :: (every IPv6 address) or one of this host's addresses")
    if args.webhook_max_request_bytes < MIN_WEBHOOK_REQUEST_BYTES:
        return (f"--webhook-max-request-bytes {args.webhook_max_request_bytes} is below {MIN_WEBHOOK_REQUEST_BYTES} "
                "(1 MiB); the API server sends reviews of several MiB (docs/webhook.md)")
    return ""


def run(args: argparse.Namespace) -> int:
    if args.print_crd:
        from dra_driver.policy.crd import crd_yaml

        sys.stdout.write(crd_yaml())
        return 0
    if args.resync_interval <= 0 or args.status_interval <= 0:
        print("dra-driver controller: --resync-interval and --status-interval must be > 0", file=sys.stderr)
        return 2
    from dra_driver.controller.leader import LeaseSettings
    from dra_driver.controller.operator import ControllerSettings
    from dra_driver.controller.operator import run as run_operator
    from dra_driver.controller.webhook import WebhookSettings

    if args.webhook:
        problem = webhook_flag_problem(args)
        if problem:
            print(f"dra-driver controller: {problem}", file=sys.stderr)
            return 2
    webhook = (
        WebhookSettings(
            port=args.webhook_port,
            addr=args.webhook_bind_address,
            max_request_bytes=args.webhook_max_request_bytes,
            certfile=args.webhook_cert,
            keyfile=args.webhook_key,
            cafile=args.webhook_ca,
            host=args.webhook_host,
            managed_configuration=args.webhook_managed_configuration,
            failure_policy=args.webhook_failure_policy,
        )
        if args.webhook
        else None
    )

    lease = None
    if args.leader_elect:
        if args.lease_duration < 3:
            print("dra-driver controller: --lease-duration must be >= 3 seconds", file=sys.stderr)
            return 2
        lease = LeaseSettings(
            name=args.lease_name,
            namespace=args.lease_namespace or "default",
            identity=args.identity or f"{socket.gethostname()}-{os.getpid()}",
            duration_seconds=args.lease_duration,
            renew_deadline_seconds=args.lease_duration * 2 / 3,
            retry_seconds=args.lease_duration / 3,
        )

    domains = None
    if args.compute_domains:
        from dra_driver.controller.computedomains.loop import ComputeDomainSettings
        from dra_driver.controller.computedomains.objects import DaemonSetSettings

        problem = ""
        if not args.compute_domain_daemon_image:
            problem = "--compute-domains needs --compute-domain-daemon-image (the driver's image)"
        elif args.compute_domain_status_interval <= 0 or args.compute_domain_binding_timeout < 1:
            problem = "--compute-domain-status-interval must be > 0 and --compute-domain-binding-timeout >= 1"
        elif not 1 <= args.max_nodes_per_imex_domain <= 1000:
            problem = "--max-nodes-per-imex-domain must be between 1 and 1000"
        if problem:
            print(f"dra-driver controller: {problem}", file=sys.stderr)
            return 2
        domains = ComputeDomainSettings(
            daemon=DaemonSetSettings(
                namespace=args.compute_domain_namespace or "default",
                image=args.compute_domain_daemon_image,
                image_pull_policy=args.compute_domain_daemon_image_pull_policy,
                service_account=args.compute_domain_daemon_service_account,
                max_nodes_per_imex_domain=args.max_nodes_per_imex_domain,
            ),
            status_interval_seconds=args.compute_domain_status_interval,
            binding_timeout_seconds=args.compute_domain_binding_timeout,
        )

    from dra_driver.errors import DraDriverError
    from dra_driver.ports import PortError, check_free

    try:
        # kopf binds these inside its event loop, where a taken port would be a traceback: check them first.
        if args.healthz_port >= 0:
            check_free("--healthz-port", "0.0.0.0", args.healthz_port)  # noqa: S104 - as the liveness endpoint
        if webhook is not None:
            check_free("--webhook-port", args.webhook_bind_address, args.webhook_port, disable=None)
    except DraDriverError as exc:
        print(f"dra-driver controller: cannot start: {exc}", file=sys.stderr)
        return 1
    configure_logging_from_args(args)
    options = ControllerSettings(
        driver_name=args.driver_name,
        kubeconfig=args.kubeconfig,
        healthz_port=args.healthz_port,
        resync_seconds=args.resync_interval,
        webhook=webhook,
        status_interval_seconds=args.status_interval,
        stale_slice_grace_seconds=args.stale_slice_grace,
        leader_election=lease,
        metrics_port=args.metrics_port,
        compute_domains=domains,
    )
    try:
        return run_operator(options)
    except PortError as exc:  # --metrics-port, bound before kopf starts
        print(f"dra-driver controller: cannot start: {exc}", file=sys.stderr)
        return 1
