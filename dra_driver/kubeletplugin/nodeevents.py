"""Events about the node a kubelet plugin runs on, for any driver on the layer.

`CheckpointQuarantined` (Warning) names the file a corrupt checkpoint was moved to: the plugin starts anyway (it
rebuilds what it owns from what exists on the node), and an admin who never reads the plugin's log still learns that
its records were lost (NVIDIA/k8s-dra-driver-gpu#1100 crash-looped with no Event at all).
"""

from __future__ import annotations

from pathlib import Path

from dra_driver.k8s.client import JsonObject
from dra_driver.k8s.events import WARNING, EventRecorder, InvolvedObject

CHECKPOINT_QUARANTINED = "CheckpointQuarantined"


class NodeEvents:
    """Records Events on this plugin's Node (nothing without a recorder: `--events off`, or no API)."""

    def __init__(self, recorder: EventRecorder | None, node_name: str) -> None:
        self.recorder = recorder
        self.node_name = node_name
        self._node_uid = ""

    def note_node(self, node: JsonObject | None) -> None:
        """The Node as read at start: its UID goes into the Events' involvedObject (kubectl describe node)."""
        self._node_uid = str(((node or {}).get("metadata") or {}).get("uid") or "")

    def record(self, *, type: str, reason: str, message: str) -> None:
        if self.recorder is not None:
            involved = InvolvedObject("v1", "Node", self.node_name, uid=self._node_uid)
            self.recorder.record(involved, type=type, reason=reason, message=message)

    def checkpoint_quarantined(self, driver_name: str, quarantined: Path, reason: str) -> None:
        """A CheckpointStore's `on_quarantine` hook (bind the driver name)."""
        self.record(
            type=WARNING,
            reason=CHECKPOINT_QUARANTINED,
            message=f"{driver_name}: the checkpoint could not be used ({reason}); moved aside to {quarantined}; "
            "the plugin started anyway and rebuilt what it owns from what exists on the node",
        )
