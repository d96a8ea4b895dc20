"""The node's ResourceSlice of the compute-domain driver (pure): one pool named after the node, two devices.

    channel-0   type=channel, id=0 (+ cliqueID)   the workload's IMEX channel
    daemon-0    type=daemon,  id=0 (+ cliqueID)   the IMEX daemon's claim

Where the cluster has KEP-5007 binding conditions on by default (Kubernetes 1.36+: DRADeviceBindingConditions
beta), `channel-0` carries `bindsToNode: true`, `bindingConditions: [compute-domain.gpu.dra.dev/imex-ready]` and
`bindingFailureConditions: [compute-domain.gpu.dra.dev/imex-failed]`: the scheduler binds a pod only once the
controller reports this node's IMEX daemon Ready. Not below 1.36: there the gate is alpha and off, the API server
drops the fields and a scheduler with the gate on would never allocate such a device (docs/compute-domains.md).
`daemon-0` never carries them: the daemon's own pod must not wait for itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dra_driver.computedomain.names import (
    CHANNEL_DEVICE,
    CLIQUE_ATTRIBUTE,
    DAEMON_DEVICE,
    FAILED_CONDITION,
    ID_ATTRIBUTE,
    READY_CONDITION,
    TYPE_ATTRIBUTE,
    TYPE_CHANNEL,
    TYPE_DAEMON,
)

BINDING_CONDITIONS_SINCE = (1, 36)


@dataclass(frozen=True)
class CdSliceSettings:
    driver_name: str
    node_name: str
    clique_id: str = ""
    kube_version: tuple[int, int] = (1, 35)
    binding_conditions: bool = True  # --binding-conditions: off keeps them out even on 1.36+

    @property
    def publishes_binding_conditions(self) -> bool:
        return self.binding_conditions and self.kube_version >= BINDING_CONDITIONS_SINCE


def _device(name: str, kind: str, settings: CdSliceSettings) -> dict[str, Any]:
    attributes: dict[str, Any] = {TYPE_ATTRIBUTE: {"string": kind}, ID_ATTRIBUTE: {"int": 0}}
    if settings.clique_id:
        attributes[CLIQUE_ATTRIBUTE] = {"string": settings.clique_id}
    device: dict[str, Any] = {"name": name, "attributes": attributes}
    if kind == TYPE_CHANNEL and settings.publishes_binding_conditions:
        device.update(bindsToNode=True, bindingConditions=[READY_CONDITION],
                      bindingFailureConditions=[FAILED_CONDITION])
    return device


def build_slices(settings: CdSliceSettings, generation: int) -> list[dict[str, Any]]:
    prefix = f"{settings.node_name}-{settings.driver_name.replace('.', '-')}"
    return [{
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{prefix[:60]}-0"},
        "spec": {
            "driver": settings.driver_name,
            "nodeName": settings.node_name,
            "pool": {"name": settings.node_name, "generation": generation, "resourceSliceCount": 1},
            "devices": [_device(CHANNEL_DEVICE, TYPE_CHANNEL, settings), _device(DAEMON_DEVICE, TYPE_DAEMON, settings)],
        },
    }]
