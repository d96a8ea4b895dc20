"""The files the IMEX daemon runner renders: imexd.cfg, nodes.cfg, the hosts mapping and the /etc/hosts block."""

from __future__ import annotations

from dra_driver.computedomain.daemon.config import (
    HOSTS_BLOCK_BEGIN,
    HOSTS_BLOCK_END,
    ImexConfig,
    render_hosts,
    render_imex_config,
    render_node_config,
    slot_addresses,
    with_hosts_block,
)
from dra_driver.computedomain.model import DomainNode
from dra_driver.computedomain.names import daemon_host_name

UID = "0f6c2a1e-8b1d-4c59-9a7e-1234567890ab"
CLIQUE = "5e1a1b2c-0000-4000-8000-000000000001.7"


def test_imex_config_has_nvidias_keys_and_the_pod_ip() -> None:
    text = render_imex_config(ImexConfig("/imexd", "10.1.2.3"))
    keys = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert keys == {
        "LOG_FILE_NAME": "",
        "BIND_INTERFACE_IP": "",
        "SERVER_PORT": "50000",
        "IMEX_ENABLE_AUTH_ENCRYPTION": "0",
        "IMEX_NODE_CONFIG_FILE": "/imexd/nodes.cfg",
        "IMEX_WAIT_FOR_QUORUM": "RECOVERY",
        "IMEX_NODE_DISCONNECTED_GRACE_TIME": "-1",
        "IMEX_CMD_ENABLED": "1",
        "IMEX_CMD_PORT": "50005",
        "IMEX_CMD_BIND_INTERFACE_IP": "10.1.2.3",
        "DAEMONIZE": "0",
    }
    assert text.endswith("\n")


def test_config_paths_follow_the_config_dir() -> None:
    config = ImexConfig("/var/x/", "127.0.0.5")
    assert (config.config_path, config.node_config_path, config.hosts_path) == (
        "/var/x/imexd.cfg", "/var/x/nodes.cfg", "/var/x/hosts")


def test_node_map_is_the_static_list_of_slot_names() -> None:
    lines = render_node_config(UID, 18).splitlines()
    assert lines == [daemon_host_name(UID, i) for i in range(18)]
    assert lines[0] == "compute-domain-daemon-0f6c2a1e-0000" and lines[17].endswith("-0017")
    # Identical on every daemon of the domain, whatever its peers: IMEX needs identical node maps.
    assert render_node_config(UID, 18) == render_node_config(UID, 18)


def node(name: str, ip: str, index: int, clique: str = CLIQUE) -> DomainNode:
    return DomainNode(name=name, ip_address=ip, clique_id=clique, index=index)


def test_slots_map_held_indexes_and_leave_the_rest_unused() -> None:
    daemons = [node("b", "127.1.0.2", 2), node("a", "127.1.0.1", 0)]
    assert slot_addresses(daemons, CLIQUE, 4) == ("127.1.0.1", "127.0.0.2", "127.1.0.2", "127.0.0.2")


def test_slots_ignore_entries_without_ip_of_other_cliques_or_out_of_range() -> None:
    daemons = [node("a", "", 0), node("b", "127.1.0.2", 1, clique="other.1"), node("c", "127.1.0.3", 9),
               node("d", "127.1.0.4", -1)]
    assert slot_addresses(daemons, CLIQUE, 3) == ("127.0.0.2",) * 3


def test_a_doubled_slot_maps_the_same_on_every_peer() -> None:
    forward = [node("z", "127.1.0.26", 0), node("m", "127.1.0.13", 0)]
    assert slot_addresses(forward, CLIQUE, 1) == slot_addresses(list(reversed(forward)), CLIQUE, 1) == ("127.1.0.13",)


def test_hosts_lines_name_every_slot() -> None:
    text = render_hosts(UID, ("127.1.0.1", "127.0.0.2"))
    assert text == f"127.1.0.1\t{daemon_host_name(UID, 0)}\n127.0.0.2\t{daemon_host_name(UID, 1)}\n"


def test_hosts_block_keeps_the_kubelets_lines_and_replaces_its_own() -> None:
    kubelet = "127.0.0.1\tlocalhost\n10.0.0.7\tpod-a\n"
    once = with_hosts_block(kubelet, "1.1.1.1\tx\n")
    assert once == f"{kubelet}{HOSTS_BLOCK_BEGIN}\n1.1.1.1\tx\n{HOSTS_BLOCK_END}\n"
    twice = with_hosts_block(once + "10.0.0.8\tadded-later\n", "2.2.2.2\ty\n")
    assert twice == (f"{kubelet}10.0.0.8\tadded-later\n{HOSTS_BLOCK_BEGIN}\n2.2.2.2\ty\n{HOSTS_BLOCK_END}\n")
    assert with_hosts_block("", "a\n") == f"{HOSTS_BLOCK_BEGIN}\na\n{HOSTS_BLOCK_END}\n"
