"""What every effect on the node shares: the per-claim error, and the callback that records hardware state the
moment it exists.

The effects themselves (what a claim does to a node, kind by kind) are in plugin/effects/; the hardware code
they drive stays with its kind: MIG in plugin/mig.py, time-slices in plugin/sharing.py, MPS daemons and GPU
shares in plugin/mps.py, CDI specs in plugin/cdi.py.
"""

from __future__ import annotations

from collections.abc import Callable

from dra_driver.errors import DraDriverError
from dra_driver.plugin.checkpoint import MigRecord


class PrepareError(DraDriverError):
    """A per-claim failure with a message for the user (it ends up in the claim's error)."""


# Called by the hardware code the moment it has created something on the hardware, so that the checkpoint names
# it before anything else can go wrong (a crash then rolls back exactly that, never a look-alike).
RecordCreated = Callable[[MigRecord], None]


def ignore_created(record: MigRecord) -> None:
    return None
