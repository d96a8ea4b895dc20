"""Who owns what on this node when the checkpoint cannot say: the ResourceClaims the API server has allocated
to this node's pool.

Used only to rebuild ownership after the checkpoint was lost or found corrupt. The API objects are untrusted
input: a claim is considered only if its identity is one Kubernetes could have produced and its allocation
names our driver and pool.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dra_driver.kubeletplugin.claims import AllocatedClaim, claims_allocated_here

__all__ = ["AllocatedClaim", "RecoveryReport", "claims_allocated_here"]


@dataclass(frozen=True)
class RecoveryReport:
    """What startup (or a later retry) recovery did; every item is also logged."""

    rebuild_reason: str | None = None  # why ownership had to be rebuilt; None: the checkpoint was intact
    ownership_known: bool = True  # False: the API could not be read, so nothing was deleted or destroyed
    adopted: tuple[str, ...] = ()  # claim UIDs whose records were rebuilt from what exists
    finished: tuple[str, ...] = ()  # claim UIDs whose interrupted prepare was rolled back or unprepare finished
    repaired: tuple[str, ...] = ()  # completed claims whose CDI spec or MIG instance had to be made again
    # What each effect kind's sweep removed because no record owned it, by kind (plugin/effects/registry.py).
    swept: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    removed_temp_files: tuple[str, ...] = ()  # paths

    @property
    def destroyed_instances(self) -> int:
        return len(self.swept.get("mig-partition", ()))

    @property
    def removed_specs(self) -> tuple[str, ...]:
        """Claim UIDs."""
        return self.swept.get("cdi-spec", ())
