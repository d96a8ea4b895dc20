"""A daemon's entry in its ComputeDomainClique: which slot (index) it takes, and the clique's `daemons[]` with its
entry put in, changed or taken out. Pure: the API round trip (GET, then PUT with the read resourceVersion, again
on 409) is clique.py's; because the PUT carries the version the choice was made on, two daemons racing for one
slot cannot both win: the second write is refused and chooses again on the newer list.

The slot rules (NVIDIA's #1418/#1440 were slots swapped or doubled on churn):
- a daemon whose entry is still there keeps its slot (a restart of the daemon changes nothing for its peers),
  unless another entry holds the same slot and sorts first by node name (then it moves; only a writer outside
  these rules can make such a pair);
- otherwise it takes the lowest slot no entry holds, so the gaps leavers leave are filled first;
- slots are < max_nodes (the node map's length); a clique with every slot held refuses another daemon.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from dra_driver.computedomain.model import DomainNode
from dra_driver.computedomain.names import STATUS_NOT_READY
from dra_driver.errors import DraDriverError


class CliqueFull(DraDriverError):
    """Every slot of the clique is held: this daemon cannot join."""


@dataclass(frozen=True)
class Member:
    """Who this daemon is in its clique."""

    node_name: str
    ip_address: str
    clique_id: str


def choose_index(daemons: Iterable[DomainNode], node_name: str, max_nodes: int) -> int:
    """The slot `node_name` holds after joining the clique whose entries are `daemons`; raises CliqueFull."""
    entries = tuple(daemons)
    others = [d for d in entries if d.name != node_name]
    own = next((d for d in entries if d.name == node_name), None)
    if own is not None and 0 <= own.index < max_nodes:
        rivals = [d.name for d in others if d.index == own.index]
        if not rivals or node_name < min(rivals):
            return own.index
    held = {d.index for d in others}
    for index in range(max_nodes):
        if index not in held:
            return index
    raise CliqueFull(
        f"all {max_nodes} slots of the clique are held ({', '.join(sorted(d.name for d in others))}); raise "
        "--max-nodes (MAX_NODES_PER_IMEX_DOMAIN) on every daemon of the domain, or let a node leave")


def joined(daemons: Iterable[DomainNode], member: Member, max_nodes: int) -> tuple[DomainNode, ...]:
    """`daemons` with `member`'s entry in (its slot chosen, NotReady: IMEX is (re)starting), others untouched."""
    entries = tuple(daemons)
    index = choose_index(entries, member.node_name, max_nodes)
    entry = DomainNode(name=member.node_name, ip_address=member.ip_address, clique_id=member.clique_id,
                       index=index, status=STATUS_NOT_READY)
    if not any(d.name == member.node_name for d in entries):
        return (*entries, entry)
    return tuple(entry if d.name == member.node_name else d for d in entries)


def with_status(daemons: Iterable[DomainNode], node_name: str, status: str) -> tuple[DomainNode, ...] | None:
    """`daemons` with `node_name`'s status set, or None when it has no entry (it must join again)."""
    entries = tuple(daemons)
    if not any(d.name == node_name for d in entries):
        return None
    return tuple(replace(d, status=status) if d.name == node_name else d for d in entries)


def without(daemons: Iterable[DomainNode], node_name: str) -> tuple[DomainNode, ...]:
    return tuple(d for d in daemons if d.name != node_name)
