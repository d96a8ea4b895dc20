"""What the IMEX daemon runner writes into its config directory, as text: the IMEX config (`imexd.cfg`), the node
map (`nodes.cfg`) and the hosts file that maps the node map's names to the clique's daemons (`hosts`). Pure.

DNS-name mode, as NVIDIA's driver runs IMEX by default (docs/reference/compute-domains.md, "The IMEX daemon"): the
node map is a static list of `max_nodes` names, one per clique slot, the same on every daemon of a clique (IMEX
needs identical node maps on all peers and reads the map only at start). Who is in a slot changes only the hosts
file; IMEX re-resolves the names on SIGUSR1, so membership changes need no restart. A slot nobody holds maps to
`UNUSED_SLOT_ADDRESS` (NVIDIA's later fix, #1447/#1465: a name that resolves nowhere real, so a dying domain's
daemon cannot reach an address another domain reuses).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from dra_driver.computedomain.model import DomainNode
from dra_driver.computedomain.names import daemon_host_name

IMEX_CONFIG_FILE: Final = "imexd.cfg"
NODE_CONFIG_FILE: Final = "nodes.cfg"
HOSTS_FILE: Final = "hosts"
UNUSED_SLOT_ADDRESS: Final = "127.0.0.2"
SERVER_PORT: Final = 50000
COMMAND_PORT: Final = 50005
# The block the runner keeps in the container's /etc/hosts (the rest of that file is the kubelet's).
HOSTS_BLOCK_BEGIN: Final = "# BEGIN dra-driver compute-domain daemons"
HOSTS_BLOCK_END: Final = "# END dra-driver compute-domain daemons"


@dataclass(frozen=True)
class ImexConfig:
    """The settings one daemon's IMEX runs with."""

    config_dir: str  # as this process sees it (the container's /imexd)
    bind_ip: str  # the pod's IP: the command port binds there, peers reach the server port there

    @property
    def config_path(self) -> str:
        return f"{self.config_dir.rstrip('/')}/{IMEX_CONFIG_FILE}"

    @property
    def node_config_path(self) -> str:
        return f"{self.config_dir.rstrip('/')}/{NODE_CONFIG_FILE}"

    @property
    def hosts_path(self) -> str:
        return f"{self.config_dir.rstrip('/')}/{HOSTS_FILE}"


def render_imex_config(config: ImexConfig) -> str:
    """`imexd.cfg`. The keys and values of NVIDIA's daemon template (docs/reference/compute-domains.md): the server
    and command ports fixed, no daemonizing (the runner supervises the process), logs to stderr (empty file name),
    quorum in RECOVERY mode, no auth encryption, a disconnected peer waited for without limit (-1), the command
    interface on the pod's IP, BIND_INTERFACE_IP empty (IMEX derives it from the node map)."""
    lines = (
        "# Written by dra-driver compute-domain-daemon; rewritten at every start.",
        "LOG_FILE_NAME=",
        "BIND_INTERFACE_IP=",
        f"SERVER_PORT={SERVER_PORT}",
        "IMEX_ENABLE_AUTH_ENCRYPTION=0",
        f"IMEX_NODE_CONFIG_FILE={config.node_config_path}",
        "IMEX_WAIT_FOR_QUORUM=RECOVERY",
        "IMEX_NODE_DISCONNECTED_GRACE_TIME=-1",
        "IMEX_CMD_ENABLED=1",
        f"IMEX_CMD_PORT={COMMAND_PORT}",
        f"IMEX_CMD_BIND_INTERFACE_IP={config.bind_ip}",
        "DAEMONIZE=0",
    )
    return "\n".join(lines) + "\n"


def render_node_config(domain_uid: str, max_nodes: int) -> str:
    """`nodes.cfg`: one name per slot, slot 0 first; the same text on every daemon of the domain."""
    return "".join(f"{daemon_host_name(domain_uid, i)}\n" for i in range(max_nodes))


def slot_addresses(daemons: Iterable[DomainNode], clique_id: str, max_nodes: int) -> tuple[str, ...]:
    """The address of each slot: the IP of the daemon of this clique holding it, else UNUSED_SLOT_ADDRESS. An entry
    without an IP, of another clique, or outside the slots maps nothing; of two entries claiming one slot (which
    the allocation never writes) the first by node name wins, so every peer renders the same map."""
    slots = [UNUSED_SLOT_ADDRESS] * max_nodes
    taken: set[int] = set()
    for daemon in sorted(daemons, key=lambda d: d.name):
        if not daemon.ip_address or (daemon.clique_id and daemon.clique_id != clique_id):
            continue
        if 0 <= daemon.index < max_nodes and daemon.index not in taken:
            taken.add(daemon.index)
            slots[daemon.index] = daemon.ip_address
    return tuple(slots)


def render_hosts(domain_uid: str, addresses: tuple[str, ...]) -> str:
    """The hosts lines of the node map's names, in /etc/hosts syntax (`<address>\\t<name>`), slot 0 first."""
    return "".join(f"{address}\t{daemon_host_name(domain_uid, i)}\n" for i, address in enumerate(addresses))


def with_hosts_block(existing: str, block: str) -> str:
    """`existing` (an /etc/hosts) with the runner's block replaced by `block`, or appended; other lines kept."""
    kept: list[str] = []
    inside = False
    for line in existing.splitlines():
        if line == HOSTS_BLOCK_BEGIN:
            inside = True
        elif line == HOSTS_BLOCK_END:
            inside = False
        elif not inside:
            kept.append(line)
    head = "\n".join(kept)
    return (head + "\n" if head else "") + f"{HOSTS_BLOCK_BEGIN}\n{block}{HOSTS_BLOCK_END}\n"
