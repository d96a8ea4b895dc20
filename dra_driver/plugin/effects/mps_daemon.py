"""MPS daemon: the `claim-<uid>` MPS control daemon of a claim whose devices' config says `sharing.strategy: MPS`
(the daemon lifecycle and the limit rules are plugin/mps.py; docs/sharing.md).

Records: `mps` of each such device (daemon id and limits), recorded in PrepareStarted before the daemon starts.
The records naming a daemon are its reference count: the last one to go stops it, resets the compute mode and
removes its directory; a daemon's limits are derived from its holders' records. The lifecycle is
mps_lifecycle.py's, shared with the capacity-share effect (capacity_share.py, the `gpu-<uuid>` daemon of a GPU's
shares). Without MPS (`daemons` None) such configs are refused as not enabled.
"""

from __future__ import annotations

from dra_driver.plugin.effects.mps_lifecycle import MpsLifecycle


class MpsDaemon(MpsLifecycle):
    kind = "mps-daemon"
    shares = False  # a claim's own daemon
    daemon_prefix = "claim-"
