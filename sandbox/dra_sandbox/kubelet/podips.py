"""Pod IPs from a node's range of loopback addresses, as a CNI plugin's host-local IPAM hands them out.

Every running pod (not `hostNetwork`) gets `status.podIP` / `status.podIPs` from its node's range `127.<a>.<b>.0/24`
(Linux routes all of 127.0.0.0/8 to `lo`, so a process bound to one of them is reachable from the whole host
and distinct pods can listen on the same port, as the IMEX daemons do on 50000). The address is the pod's for as
long as its sandbox exists (stable across container restarts) and is never handed to another pod meanwhile; as
host-local IPAM does (containernetworking/plugins `plugins/ipam/host-local/backend/allocator`), allocation goes
on from the last address given, so a released address is reused only after the range wrapped around.
A `hostNetwork` pod gets the node's InternalIP instead (`pkg/kubelet/kubelet_pods.go` generateAPIPodStatus).
"""

from __future__ import annotations

import ipaddress
import threading


class PodIpRangeFull(RuntimeError):
    """Every address of the node's range is in use (the CNI's "no IP addresses available in range set")."""


class PodIpAllocator:
    """Addresses of one node's range by pod uid. Thread-safe (the pod sync and its status writes share it)."""

    def __init__(self, cidr: str, reserved: tuple[str, ...] = ()) -> None:
        network = ipaddress.ip_network(cidr)
        if not isinstance(network, ipaddress.IPv4Network) or not network.subnet_of(
                ipaddress.IPv4Network("127.0.0.0/8")):
            raise ValueError(f"pod IP range {cidr!r} must be an IPv4 range inside 127.0.0.0/8 (loopback)")
        # The network and broadcast addresses are left out, as host-local's default range does.
        self._hosts = [str(h) for h in network.hosts()]
        if not self._hosts:
            raise ValueError(f"pod IP range {cidr!r} holds no host address")
        self.cidr = str(network)
        self._by_pod: dict[str, str] = {}
        # Addresses never handed to a pod (the node's own InternalIP lives in its range in the sandbox).
        self._in_use: set[str] = set(reserved)
        self._last = -1
        self._lock = threading.Lock()

    def assign(self, pod_uid: str) -> str:
        """The pod's address, allocating the next free one on first use."""
        with self._lock:
            known = self._by_pod.get(pod_uid)
            if known is not None:
                return known
            for step in range(1, len(self._hosts) + 1):
                index = (self._last + step) % len(self._hosts)
                address = self._hosts[index]
                if address not in self._in_use:
                    self._last = index
                    self._in_use.add(address)
                    self._by_pod[pod_uid] = address
                    return address
            raise PodIpRangeFull(f"no IP addresses available in range set: {self.cidr}")

    def get(self, pod_uid: str) -> str | None:
        with self._lock:
            return self._by_pod.get(pod_uid)

    def release(self, pod_uid: str) -> None:
        with self._lock:
            address = self._by_pod.pop(pod_uid, None)
            if address is not None:
                self._in_use.discard(address)

    def in_use(self) -> dict[str, str]:
        with self._lock:
            return dict(self._by_pod)


def node_ip(cluster_octet: int, node_index: int) -> str:
    """The node's InternalIP: the first address of its pod range (kept out of the pods' allocation), so nodes have
    distinct addresses and a hostNetwork pod of one node is reachable apart from another node's."""
    return f"127.{cluster_octet}.{node_index + 1}.1"


def node_pod_cidr(cluster_octet: int, node_index: int) -> str:
    """The range of the `node_index`-th node (0-based) of a sandbox whose pods live in 127.<cluster_octet>.0.0/16."""
    if not 1 <= cluster_octet <= 254:
        raise ValueError(f"cluster octet {cluster_octet} must be 1..254")
    if not 0 <= node_index <= 253:
        raise ValueError(f"node index {node_index}: a sandbox has at most 254 nodes with pod IPs")
    return f"127.{cluster_octet}.{node_index + 1}.0/24"
