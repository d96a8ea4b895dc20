"""The reasons (metav1.Condition `reason`) of the conditions the ComputeDomain controller writes: a domain's Ready
condition (status.py) and a channel claim's binding conditions (binding.py). One name per reason: a clique another
domain holds is `CliqueInUse` on both."""

from __future__ import annotations

from typing import Final

# A domain's Ready condition.
ALL_READY: Final = "AllNodesReady"
WAITING: Final = "WaitingForNodes"
NODES_NOT_READY: Final = "NodesNotReady"
TEMPLATE_CONFLICT: Final = "ClaimTemplateConflict"
# Both: the domain's NVLink clique belongs to another domain (NVIDIA #892).
CLIQUE_IN_USE: Final = "CliqueInUse"
# A channel claim's imex-ready / imex-failed.
DAEMON_READY: Final = "IMEXDaemonReady"
DAEMON_FAILED: Final = "IMEXDaemonFailed"
DAEMON_TIMEOUT: Final = "IMEXDaemonNotReady"
NODE_IN_USE: Final = "NodeInOtherDomain"
NO_DOMAIN: Final = "DomainNotFound"
