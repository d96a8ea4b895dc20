"""The ComputeDomain driver's effect kinds, in the order the engine applies them (and undoes them in reverse): the
IMEX channel (node label, one domain per node and clique) before the daemon's config directory.

Adding a kind is a module beside these with a `DomainEffect` subclass and its place in `DOMAIN_EFFECTS`; the
engine iterates over whatever is here.
"""

from __future__ import annotations

from dra_driver.computedomain.plugin.effects.base import DomainEffect
from dra_driver.computedomain.plugin.effects.daemon_dir import DaemonDir
from dra_driver.computedomain.plugin.effects.imex_channel import ImexChannel

DOMAIN_EFFECTS: tuple[type[DomainEffect], ...] = (ImexChannel, DaemonDir)
