"""Reports the node's NVLink clique and fabric problems (inventory/fabric.py) where an admin looks: the plugin's log
and a Kubernetes Event on the Node (`kubectl describe node`). The plugin never stops over it: GPUs are offered as
always; only multi-node NVLink (ComputeDomains) needs the clique. There is no Node condition: conditions belong to
the kubelet and node-problem-detector, and nothing of this driver writes Node status.

Each change is reported once (a rediscovery every few seconds finds the same problem again and says nothing).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import structlog

from dra_driver.inventory.fabric import NO_CLIQUE, NodeClique
from dra_driver.k8s.events import NORMAL, WARNING, EventRecorder, InvolvedObject

log = structlog.get_logger(__name__)

EVENT_FABRIC_PROBLEM = "NVLinkFabricProblem"
EVENT_FABRIC_READY = "NVLinkFabricReady"


class FabricReporter:
    def __init__(self, *, node_name: str, events: EventRecorder | None) -> None:
        self._node = node_name
        self._events = events
        self._node_uid = ""
        self._lock = threading.Lock()
        self._last: NodeClique | None = None  # None: nothing reported yet

    def note_node(self, node: Mapping[str, object] | None) -> None:
        """The Node as read at start: its uid goes into the Events (`kubectl describe node` matches by uid)."""
        metadata = (node or {}).get("metadata")
        if isinstance(metadata, Mapping) and metadata.get("uid"):
            self._node_uid = str(metadata["uid"])

    def note(self, clique: NodeClique) -> None:
        with self._lock:
            last, self._last = self._last, clique
        if clique == last:
            return
        if clique.problem is not None:
            log.warning("NVLink fabric problem", node=self._node, clique=clique.id, problem=clique.problem)
            self._record(WARNING, EVENT_FABRIC_PROBLEM, clique.problem)
            return
        if clique.id is not None:
            log.info("node is in an NVLink clique", node=self._node, clique=clique.id)
            if last is not None and last.problem is not None:
                self._record(NORMAL, EVENT_FABRIC_READY, f"NVLink fabric ready: the node is in clique {clique.id}")
            return
        if last is not None and last != NO_CLIQUE:
            log.info("node is in no NVLink clique any more", node=self._node, before=last.id)
            if last.problem is not None:
                self._record(NORMAL, EVENT_FABRIC_READY, "NVLink fabric problem gone: the GPUs report no multi-node "
                                                         "fabric now, so the node is in no clique")

    def _record(self, type: str, reason: str, message: str) -> None:
        if self._events is None:
            return
        involved = InvolvedObject("v1", "Node", self._node, uid=self._node_uid)
        self._events.record(involved, type=type, reason=reason, message=message, namespace="default")
