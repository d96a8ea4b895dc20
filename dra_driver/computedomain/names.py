"""The names the compute-domain parts agree on: the controller, the compute-domain kubelet plugin, the IMEX daemon
runner, the chart and the sandbox. NVIDIA's driver uses the same shapes under `nvidia.com` names
(docs/reference/compute-domains.md); only the prefixes differ, so their specs run after renames only.
"""

from __future__ import annotations

from typing import Final

DRIVER_NAME: Final = "compute-domain.gpu.dra.dev"

# The CRDs (namespaced). ComputeDomainClique objects live in the driver's namespace, named `<cdUID>.<cliqueID>`.
API_GROUP: Final = "gpu.dra.dev"
API_VERSION: Final = "v1beta1"
GROUP_VERSION: Final = f"{API_GROUP}/{API_VERSION}"
COMPUTE_DOMAIN_KIND: Final = "ComputeDomain"
COMPUTE_DOMAIN_PLURAL: Final = "computedomains"
CLIQUE_KIND: Final = "ComputeDomainClique"
CLIQUE_PLURAL: Final = "computedomaincliques"

# Node label naming the one domain whose channel a node's pods hold (value: the domain's UID); the daemon
# DaemonSet's node selector. Also the finalizer on the domain and everything the controller makes for it.
DOMAIN_LABEL: Final = "gpu.dra.dev/computeDomain"
DOMAIN_FINALIZER: Final = "gpu.dra.dev/computeDomain"
# Daemon pod label: the clique the pod's node is in.
CLIQUE_POD_LABEL: Final = "gpu.dra.dev/computeDomain.cliqueID"
# ResourceClaimTemplate label: whom the template is for (Daemon | Workload).
TARGET_LABEL: Final = "gpu.dra.dev/computeDomainTarget"
TARGET_DAEMON: Final = "Daemon"
TARGET_WORKLOAD: Final = "Workload"
# What GPU Feature Discovery sets on NVLink-fabric nodes: `<clusterUUID>.<cliqueID>` (existing selectors keep working).
GPU_CLIQUE_LABEL: Final = "nvidia.com/gpu.clique"

DAEMON_CLASS: Final = "compute-domain-daemon.gpu.dra.dev"
DEFAULT_CHANNEL_CLASS: Final = "compute-domain-default-channel.gpu.dra.dev"

# Opaque configs (in API_GROUP/API_VERSION), as the controller puts them in the claim templates it makes.
CHANNEL_CONFIG_KIND: Final = "ComputeDomainChannelConfig"
DAEMON_CONFIG_KIND: Final = "ComputeDomainDaemonConfig"

# Published devices (one pool per node, named after the node) and their attributes (unqualified, so CEL reads
# `device.attributes['compute-domain.gpu.dra.dev'].type`).
CHANNEL_DEVICE: Final = "channel-0"
DAEMON_DEVICE: Final = "daemon-0"
TYPE_ATTRIBUTE: Final = "type"
ID_ATTRIBUTE: Final = "id"
CLIQUE_ATTRIBUTE: Final = "cliqueID"
TYPE_CHANNEL: Final = "channel"
TYPE_DAEMON: Final = "daemon"
# Channels the kernel offers (/dev/nvidia-caps-imex-channels/channel<N>, N < 2048); only channel 0 is published.
CHANNEL_COUNT: Final = 2048
CHANNEL_DEVICE_DIR: Final = "/dev/nvidia-caps-imex-channels"
CHANNEL_MAJOR_NAME: Final = "nvidia-caps-imex-channels"  # its /proc/devices entry

# KEP-5007 binding conditions on the channel device (clusters >= 1.36): set True in the claim's status.devices
# by the controller once the node's daemon is Ready; the failure condition sends the pod back to scheduling.
READY_CONDITION: Final = f"{DRIVER_NAME}/imex-ready"
FAILED_CONDITION: Final = f"{DRIVER_NAME}/imex-failed"

# The daemon's environment (the daemon device's CDI edits; the pod adds NODE_NAME, POD_IP, ...).
ENV_CLIQUE_ID: Final = "CLIQUE_ID"
ENV_DOMAIN_UUID: Final = "COMPUTE_DOMAIN_UUID"
ENV_DOMAIN_NAME: Final = "COMPUTE_DOMAIN_NAME"
ENV_DOMAIN_NAMESPACE: Final = "COMPUTE_DOMAIN_NAMESPACE"
ENV_MAX_NODES: Final = "MAX_NODES_PER_IMEX_DOMAIN"
DAEMON_CONFIG_MOUNT: Final = "/imexd"  # the daemon's config directory inside its container
# The fabric-management capability the daemon needs (its nvcap minor is read from this file).
FABRIC_MGMT_CAPABILITY: Final = "/proc/driver/nvidia/capabilities/fabric-imex-mgmt"

MAX_NODES_PER_IMEX_DOMAIN: Final = 18  # an NVL72 rack: 18 trays of 4 GPUs

# Node / clique entry status values.
STATUS_READY: Final = "Ready"
STATUS_NOT_READY: Final = "NotReady"


def clique_object_name(domain_uid: str, clique_id: str) -> str:
    """The ComputeDomainClique of one domain on one clique (in the driver's namespace)."""
    return f"{domain_uid}.{clique_id}"


def daemon_object_name(domain_uid: str) -> str:
    """The IMEX daemon DaemonSet and its ResourceClaimTemplate (driver's namespace)."""
    return f"computedomain-daemon-{domain_uid}"


def daemon_host_name(domain_uid: str, index: int) -> str:
    """The name the daemon in clique slot `index` has in every peer's IMEX node map (and hosts file). Scoped to
    the domain (NVIDIA's #1447: identical names across domains let a dying domain's daemon reach a reused IP)."""
    return f"compute-domain-daemon-{domain_uid[:8]}-{index:04d}"
