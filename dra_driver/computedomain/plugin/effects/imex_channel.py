"""The IMEX channel of a workload claim (`channel-0`): the node joins the claim's ComputeDomain, and the container
gets `/dev/nvidia-caps-imex-channels/channel<N>` (Single: channel 0; All: every channel, 0..2047).

Rules, checked at prepare (docs/compute-domains.md, "The compute-domain kubelet plugin"):
- the claim is in the ComputeDomain's namespace (else a permanent error: a user cannot hand a channel of someone
  else's domain to their pods);
- one domain per node: the node label `gpu.dra.dev/computeDomain=<uid>` is set (it schedules the domain's IMEX
  daemon here) and a label naming another domain that a prepared channel claim on this node still holds refuses
  the claim. A label no record holds (left by a lost checkpoint) is taken over;
- one domain per clique (NVIDIA #892: two IMEX ensembles on one NVLink clique make concurrent fabric-memory calls
  fail intermittently, with no fix): a ComputeDomainClique of ANOTHER domain for this node's clique that lists
  daemons refuses the claim until that domain leaves the clique;
- readiness: where the allocation carries our binding conditions (Kubernetes 1.36+), the scheduler bound the pod
  only once the controller saw this node's daemon Ready, so there is nothing to wait for. Otherwise this node's
  entry in the clique `<uid>.<clique>` (fallback: the domain's status.nodes) must be Ready, else a retryable
  error; the node label and the PrepareStarted record stay, so the daemon keeps starting meanwhile.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from dra_driver.cdi.model import ContainerEdits, DeviceNode
from dra_driver.computedomain.config import ChannelConfig
from dra_driver.computedomain.model import AllocationMode
from dra_driver.computedomain.names import CHANNEL_COUNT, CHANNEL_DEVICE_DIR, DOMAIN_LABEL, clique_object_name
from dra_driver.computedomain.plugin.cdi import device_env_key
from dra_driver.computedomain.plugin.checkpoint import (
    Checkpoint,
    ClaimRecord,
    DomainDevice,
    DomainDeviceKind,
    domain_of,
)
from dra_driver.computedomain.plugin.effects.base import Devices, DomainEffect, DomainPlan, PermanentError
from dra_driver.errors import DraDriverError
from dra_driver.kubeletplugin.claims import AllocatedClaim
from dra_driver.kubeletplugin.effect import Created

CHANNEL_FILE_MODE = 0o666


class ChannelRefused(DraDriverError):
    """Another domain holds this node or its clique: retryable (the other may leave), rolled back meanwhile."""


def channel_path(channel: int) -> str:
    return f"{CHANNEL_DEVICE_DIR}/channel{channel}"


class ImexChannel(DomainEffect):
    kind = "imex-channel"
    device_kind = DomainDeviceKind.CHANNEL

    def plan(self, claim: DomainPlan) -> DomainPlan:
        config = claim.config
        if not isinstance(config, ChannelConfig):
            return claim
        # Without a clique the node is not on an NVLink fabric: no channel to inject (as NVIDIA's driver does).
        channels: tuple[int, ...] = ()
        if claim.clique_id:
            channels = tuple(range(CHANNEL_COUNT)) if config.allocation_mode is AllocationMode.ALL else (0,)
        devices = tuple(dataclasses.replace(d, channels=channels) if d.kind is self.device_kind else d
                        for d in claim.record.devices)
        return dataclasses.replace(claim, record=dataclasses.replace(claim.record, devices=devices))

    def refuse(self, claim: DomainPlan, checkpoint: Checkpoint, node: None) -> None:
        if not self.covers(claim.record):
            return
        domain, ref = claim.domain, claim.ref
        if ref.namespace != domain.namespace:
            raise PermanentError(
                f"ResourceClaim {ref.namespace}/{ref.name} asks for a channel of ComputeDomain "
                f"{domain.namespace}/{domain.name}, which is in another namespace; a channel claim must be in its "
                "ComputeDomain's namespace (use the claim template the domain names in "
                "spec.channel.resourceClaimTemplate)"
            )
        for other in checkpoint.others(ref.uid):
            if self.covers(other):
                held = domain_of(other)
                raise ChannelRefused(
                    f"the IMEX channel of this node is held by ResourceClaim {other.namespace}/{other.name} "
                    f"(ComputeDomain {held.domain_namespace}/{held.domain_name}); it is released when that claim "
                    "is unprepared"
                )

    def apply(
        self, claim: DomainPlan, records: Devices, checkpoint: Checkpoint, created: Created[DomainDevice]
    ) -> Devices:
        if not self.covers(claim.record):
            return records
        self._one_domain_per_clique(claim)
        uid = claim.domain.uid

        def decide(current: str | None) -> str:
            if current in (None, "", uid):
                return uid
            holders = [r for r in checkpoint.others(claim.ref.uid)
                       if domain_of(r).domain_uid == current and self.covers(r)]
            if holders:
                held, domain = holders[0], domain_of(holders[0])
                raise ChannelRefused(
                    f"node {self.tools.node_name} is in ComputeDomain {domain.domain_namespace}/{domain.domain_name} "
                    f"(label {DOMAIN_LABEL}={current}, held by ResourceClaim {held.namespace}/{held.name}); a node "
                    "serves one ComputeDomain at a time"
                )
            return uid  # a label no prepared claim holds (a lost checkpoint left it): ours now

        self.tools.labels.update(DOMAIN_LABEL, decide)
        self.tools.faults.reached("cd-prepare:after-node-label")
        return records

    def _one_domain_per_clique(self, claim: DomainPlan) -> None:
        if not claim.clique_id:
            return
        for clique in self.tools.domains.cliques():
            if clique.clique_id != claim.clique_id or clique.domain_uid == claim.domain.uid or not clique.daemons:
                continue
            nodes = ", ".join(sorted(d.name for d in clique.daemons))
            raise ChannelRefused(
                f"NVLink clique {claim.clique_id} of node {self.tools.node_name} already serves another ComputeDomain "
                f"(UID {clique.domain_uid}; IMEX daemons on {nodes}); this driver runs one ComputeDomain per clique "
                "(two IMEX domains on one clique make fabric memory calls fail, NVIDIA #892): wait for that domain "
                "to end, or schedule this one onto another clique"
            )

    def ready(self, claim: DomainPlan) -> str:
        if not self.covers(claim.record) or claim.binding_conditions:
            return ""
        node, domain = self.tools.node_name, claim.domain
        where = "its domain's status.nodes"
        if claim.clique_id:
            name = clique_object_name(domain.uid, claim.clique_id)
            clique = self.tools.domains.clique(name)
            entry = clique.daemon(node) if clique is not None else None
            if entry is not None and entry.ready:
                return ""
            where = f"ComputeDomainClique {self.tools.domains.driver_namespace}/{name} nor in {where}"
        fresh = self.tools.domains.domain(domain.uid) or domain
        if any(n.name == node and n.ready for n in fresh.nodes):
            return ""
        return (
            f"node {node} not ready in ComputeDomain {domain.namespace}/{domain.name} (IMEX daemon on this node is "
            f"not Ready in {where}); the kubelet retries"
        )

    def undo(self, record: ClaimRecord, devices: Devices, checkpoint: Checkpoint, *, rollback: bool) -> None:
        if not self.last_holder(checkpoint, record):
            return
        self.tools.labels.update(DOMAIN_LABEL, lambda cur: None if cur == domain_of(record).domain_uid else cur)

    def edits(self, record: ClaimRecord, device: DomainDevice) -> ContainerEdits:
        key = device_env_key(device.device)
        shown = (f"{device.channels[0]}-{device.channels[-1]}" if len(device.channels) > 1
                 else ",".join(map(str, device.channels)))
        env = (f"{key}_COMPUTE_DOMAIN={domain_of(record).domain_uid}", f"{key}_IMEX_CHANNELS={shown}")
        if not device.channels:
            return ContainerEdits(env=env)
        major = self.tools.host.channel_major()
        nodes = tuple(DeviceNode(path=channel_path(n), type="c", major=major, minor=n, file_mode=CHANNEL_FILE_MODE)
                      for n in device.channels)
        return ContainerEdits(env=env, device_nodes=nodes)

    def sweep(
        self, checkpoint: Checkpoint, allocated: Mapping[str, AllocatedClaim] | None, node: None
    ) -> tuple[str, ...]:
        held = {domain_of(r).domain_uid for r in checkpoint.claims.values() if self.holds(r)}
        current = self.tools.labels.value(DOMAIN_LABEL)
        if current is None or current in held:
            return ()
        self.tools.labels.update(DOMAIN_LABEL, lambda cur: None if cur == current else cur)
        return (f"node label {DOMAIN_LABEL}={current}",)
