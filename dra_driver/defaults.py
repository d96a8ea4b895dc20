"""The one source of the product's defaults.

The kubelet plugin's flags, its settings dataclass and the bench read these; the Helm chart's
`values.yaml` cannot import Python, so `tests/chart/test_defaults.py` holds it equal to this module.
"""

from __future__ import annotations

from pathlib import Path

# The DRA driver name (ResourceSlice.spec.driver, DeviceClass selectors, CDI vendor). Configurable
# everywhere; this is only what is used when nothing is set.
DRIVER_NAME = "gpu.dra.dev"
# The chart's whole-GPU class maps this extended resource by default (as NVIDIA's chart does; KEP-5004), so unchanged
# device-plugin pods (`resources.limits: {nvidia.com/gpu: 1}`) are served on nodes without the device plugin.
# `dra-sandbox up` installs the class without it unless `--extended-resource-name` is given.
EXTENDED_RESOURCE_NAME = "nvidia.com/gpu"

KUBELET_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
KUBELET_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
CDI_ROOT = Path("/var/run/cdi")
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")

HEALTHZ_PORT = 51515
METRICS_PORT = 9464  # Prometheus exporters' conventional range; /metrics of the kubelet plugin
USAGE_INTERVAL_S = 15.0  # seconds between usage samples of prepared devices; 0 disables
CLEANUP_INTERVAL_S = 600.0
REDISCOVERY_INTERVAL_S = 60.0
SHUTDOWN_GRACE_S = 30.0
DRIVER_WAIT_MAX_INTERVAL_S = 5.0  # cap of the backoff between checks while waiting for the NVIDIA driver
HEALTH_HEAL_AFTER_S = 600.0  # a device problem heals after this long without a new event (0: never)
HEALTH_HEAL_AFTER_MAX_S = 6 * 3600.0  # flapping doubles the window up to this
HEALTH_CHECK_INTERVAL_S = 10.0  # healing is checked this often (no API request: admin taints are DeviceTaintRules)

# `dra-driver compute-domain-kubelet-plugin`: beside the GPU plugin in one pod (one network namespace), so its own
# ports, the GPU plugin's plus one.
CD_HEALTHZ_PORT = HEALTHZ_PORT + 1
CD_METRICS_PORT = METRICS_PORT + 1

# `dra-driver controller` (GpuSharingPolicies → DeviceClasses).
CONTROLLER_HEALTHZ_PORT = 8080
CONTROLLER_RESYNC_S = 60.0
CONTROLLER_WEBHOOK_PORT = 9443
# Every IPv4 address of the host or pod; the chart passes the pod's IP (docs/webhook.md "Where it listens").
CONTROLLER_WEBHOOK_BIND_ADDRESS = "0.0.0.0"  # noqa: S104 - the API server calls in from outside the pod
# An UPDATE review carries object and oldObject, each up to the API server's 3 MiB request body limit, plus the
# envelope: 7 MiB (docs/webhook.md "Body limit").
CONTROLLER_WEBHOOK_MAX_REQUEST_BYTES = 7 * 1024 * 1024
CONTROLLER_STATUS_INTERVAL_S = 1.0  # at most one recount (and status patch) per policy per interval
CONTROLLER_STALE_SLICE_GRACE_S = 300.0
CONTROLLER_METRICS_PORT = 8081
CONTROLLER_LEASE_DURATION_S = 15.0


def plugin_dir(driver_name: str) -> Path:
    """The plugin's own directory under the kubelet's (sockets, checkpoint): plugins/<driver-name>."""
    return KUBELET_PLUGINS_DIR / driver_name
