"""The IMEX daemon's claim (`daemon-0`): its config directory on the node, `<state-dir>/domains/<uid>/`, mounted at
`/imexd` (rw,nosuid,nodev,bind), where the daemon runner writes its IMEX config, node map and hosts block; the
environment that tells the runner which domain and clique it serves (CLIQUE_ID, COMPUTE_DOMAIN_UUID,
COMPUTE_DOMAIN_NAME, COMPUTE_DOMAIN_NAMESPACE); and, on a node with a clique, the fabric-management capability
device the IMEX daemon opens.

A daemon claim is prepared only in the driver's namespace (`--driver-namespace`, the release namespace), where the
ComputeDomain controller makes the daemon's claim template `computedomain-daemon-<uid>` and its DaemonSet: the
device hands a container the domain's IMEX config directory read-write, its identity and the fabric-management
capability, so a claim made anywhere else (a user's namespace, the domain's own included) is refused before
anything is touched (a permanent error naming both namespaces and what to use instead).

The directory starts with `imexd.cfg.tmpl`: the fixed settings of NVIDIA's daemon template, for an operator to
read (the runner renders `imexd.cfg` itself, dra_driver/computedomain/daemon/). It is removed when the last daemon
claim of the domain on this node is unprepared; the runner's files go with it.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from dra_driver.cdi.model import ContainerEdits, DeviceNode, Mount
from dra_driver.computedomain.names import (
    DAEMON_CONFIG_MOUNT,
    ENV_CLIQUE_ID,
    ENV_DOMAIN_NAME,
    ENV_DOMAIN_NAMESPACE,
    ENV_DOMAIN_UUID,
    daemon_object_name,
)
from dra_driver.computedomain.plugin.checkpoint import (
    Checkpoint,
    ClaimRecord,
    DomainDevice,
    DomainDeviceKind,
    domain_of,
)
from dra_driver.computedomain.plugin.effects.base import Devices, DomainEffect, DomainPlan, PermanentError
from dra_driver.computedomain.plugin.hostdevices import CAPS_DEVICE_DIR, CAPS_MAJOR_NAME
from dra_driver.fsutil import atomic_write
from dra_driver.kubeletplugin.claims import AllocatedClaim
from dra_driver.kubeletplugin.effect import Created
from dra_driver.kubeletplugin.names import uid_problem

DOMAINS_DIR = "domains"
TEMPLATE_NAME = "imexd.cfg.tmpl"
MOUNT_OPTIONS = ("rw", "nosuid", "nodev", "bind")
DIR_MODE = 0o755  # the daemon's container reads and writes it; nothing secret is kept there
TEMPLATE = """\
# The IMEX daemon's settings (NVIDIA's compute-domain daemon template); dra-driver compute-domain-daemon renders
# imexd.cfg from these at every start, with the pod's IP for IMEX_CMD_BIND_INTERFACE_IP.
LOG_FILE_NAME=
BIND_INTERFACE_IP=
SERVER_PORT=50000
IMEX_ENABLE_AUTH_ENCRYPTION=0
IMEX_NODE_CONFIG_FILE=/imexd/nodes.cfg
IMEX_WAIT_FOR_QUORUM=RECOVERY
IMEX_NODE_DISCONNECTED_GRACE_TIME=-1
IMEX_CMD_ENABLED=1
IMEX_CMD_PORT=50005
IMEX_CMD_BIND_INTERFACE_IP={{POD_IP}}
DAEMONIZE=0
"""


class DaemonDir(DomainEffect):
    kind = "daemon-dir"
    device_kind = DomainDeviceKind.DAEMON

    def directory(self, domain_uid: str) -> Path:
        if uid_problem(domain_uid) is not None:  # the config decoder checked it; a record from disk is checked again
            raise ValueError(f"not a domain UID: {domain_uid!r}")
        return self.tools.state_dir / DOMAINS_DIR / domain_uid

    def refuse(self, claim: DomainPlan, checkpoint: Checkpoint, node: None) -> None:
        if not self.covers(claim.record):
            return
        ref, domain, home = claim.ref, claim.domain, self.tools.domains.driver_namespace
        if ref.namespace != home:
            raise PermanentError(
                f"ResourceClaim {ref.namespace}/{ref.name} asks for the IMEX daemon device of ComputeDomain "
                f"{domain.namespace}/{domain.name}, but a daemon claim must be in the driver's namespace {home}, "
                f"not {ref.namespace}: the device mounts the domain's IMEX config directory read-write and grants "
                "the fabric-management capability, so only the daemon pods the ComputeDomain controller runs in "
                f"{home} (claim template {home}/{daemon_object_name(domain.uid)}) get it. A workload uses a "
                f"channel claim in {domain.namespace} instead (the template the domain names in "
                "spec.channel.resourceClaimTemplate)"
            )

    def apply(
        self, claim: DomainPlan, records: Devices, checkpoint: Checkpoint, created: Created[DomainDevice]
    ) -> Devices:
        if self.covers(claim.record):
            self._make(domain_of(claim.record).domain_uid)
            self.tools.faults.reached("cd-prepare:after-daemon-dir")
        return records

    def _make(self, domain_uid: str) -> None:
        directory = self.directory(domain_uid)
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(DIR_MODE)
        atomic_write(directory / TEMPLATE_NAME, TEMPLATE.encode(), mode=0o644)

    def undo(self, record: ClaimRecord, devices: Devices, checkpoint: Checkpoint, *, rollback: bool) -> None:
        if self.last_holder(checkpoint, record):
            shutil.rmtree(self.directory(domain_of(record).domain_uid), ignore_errors=True)

    def edits(self, record: ClaimRecord, device: DomainDevice) -> ContainerEdits:
        domain = domain_of(record)
        env = (
            f"{ENV_CLIQUE_ID}={domain.clique_id}",
            f"{ENV_DOMAIN_UUID}={domain.domain_uid}",
            f"{ENV_DOMAIN_NAME}={domain.domain_name}",
            f"{ENV_DOMAIN_NAMESPACE}={domain.domain_namespace}",
        )
        mounts = (Mount(host_path=str(self.directory(domain.domain_uid)), container_path=DAEMON_CONFIG_MOUNT,
                        options=MOUNT_OPTIONS),)
        nodes: tuple[DeviceNode, ...] = ()
        if domain.clique_id:
            minor = self.tools.host.fabric_mgmt_minor()
            nodes = (DeviceNode(path=f"{CAPS_DEVICE_DIR}/nvidia-cap{minor}", type="c",
                                major=self.tools.host.char_major(CAPS_MAJOR_NAME), minor=minor),)
        return ContainerEdits(env=env, mounts=mounts, device_nodes=nodes)

    def verify(self, record: ClaimRecord, devices: Devices, checkpoint: Checkpoint, node: None) -> list[str]:
        if not self.holds(record):
            return []
        directory = self.directory(domain_of(record).domain_uid)
        if not (directory / TEMPLATE_NAME).is_file():
            return [f"the daemon's config directory {directory} is missing or incomplete"]
        return []

    def repair(
        self, record: ClaimRecord, devices: Devices, checkpoint: Checkpoint, node: None,
        created: Created[DomainDevice],
    ) -> Devices:
        if self.holds(record):
            self._make(domain_of(record).domain_uid)
        return devices

    def sweep(
        self, checkpoint: Checkpoint, allocated: Mapping[str, AllocatedClaim] | None, node: None
    ) -> tuple[str, ...]:
        root = self.tools.state_dir / DOMAINS_DIR
        if not root.is_dir():
            return ()
        held = {domain_of(r).domain_uid for r in checkpoint.claims.values() if self.holds(r)}
        removed = []
        for path in root.iterdir():
            if path.is_dir() and not path.is_symlink() and path.name not in held:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(str(path))
        return tuple(removed)
