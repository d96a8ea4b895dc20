"""The stand-in `nvidia-imex` and `nvidia-imex-ctl` (installed by `dra_sandbox.imex.install_standins`). Standard
library only: each run of the control tool is a fresh interpreter.

`nvidia-imex -c <cfg>`: reads the config (`KEY=VALUE` lines), then
- listens for peers on IMEX_CMD_BIND_INTERFACE_IP:SERVER_PORT (TCP) and for its control tool on
  IMEX_CMD_BIND_INTERFACE_IP:IMEX_CMD_PORT;
- reads the node map IMEX_NODE_CONFIG_FILE once (as the real daemon, which reads it only at start) and resolves
  its names through the `hosts` file beside it (the real one resolves through the system's resolver, i.e. the
  container's /etc/hosts); a name that does not resolve, or resolves to 127.0.0.2 (an unused slot), is no peer;
  the name resolving to its own bind address is itself;
- connects to every peer's server port and keeps the connection (hello line, then open until either side
  closes); a lost connection is retried every RETRY_S (IMEX_NODE_DISCONNECTED_GRACE_TIME=-1: waited for forever);
- is READY once it finds itself in the node map and every peer is connected (quorum), NOT_READY otherwise;
- re-resolves the names on SIGUSR1 without exiting (new address: reconnect; no address: the peer is dropped);
  a SIGUSR1 sooner than 5 s (DRA_SANDBOX_IMEX_RELOAD_INTERVAL) after the last one honoured is dropped, as
  NVIDIA's #1443 reports of the real daemon;
- exits 0 on SIGTERM/SIGINT, and by itself when its parent dies (a container's processes die with it; here the
  runner is a host process, so nothing else would end an orphan holding its ports).
It writes `imex-standin.json` (pid, reloads, state per peer) beside the config after every change, for tests.

`nvidia-imex-ctl -c <cfg> -q` prints READY or NOT_READY; `-N` prints the node table, one letter per node as the
real tool's legend: C connected, N never connected, D disconnected, I invalid (no address), * this node.
Both exit 1 with a message on stderr when no daemon answers on the command port.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Final

UNUSED_SLOT: Final = "127.0.0.2"
HOSTS_FILE: Final = "hosts"
STATE_FILE: Final = "imex-standin.json"
HELLO: Final = b"IMEX-HELLO\n"
WELCOME: Final = b"IMEX-OK\n"
RETRY_S: Final = 0.2
# NVIDIA #1443: IMEX honours SIGUSR1 at most once per 5 s; the stand-in drops the ones that come sooner (tests that
# run the runner with a shorter --reload-interval set the same here).
RELOAD_INTERVAL_ENV: Final = "DRA_SANDBOX_IMEX_RELOAD_INTERVAL"
RELOAD_INTERVAL_S: Final = 5.0
CONNECT_TIMEOUT_S: Final = 1.0
REQUIRED: Final = ("SERVER_PORT", "IMEX_CMD_PORT", "IMEX_CMD_BIND_INTERFACE_IP", "IMEX_NODE_CONFIG_FILE")
LEGEND: Final = ("Connectivity Table Legend:\n"
                 "I - Invalid (not resolvable), N - Never Connected, D - Disconnected, C - Connected, * - This node")


class ConfigError(Exception):
    pass


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def read_config(path: str) -> dict[str, str]:
    try:
        text = _read(path)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    missing = [k for k in REQUIRED if not values.get(k)]
    if missing:
        raise ConfigError(f"{path}: missing {', '.join(missing)}")
    if values.get("DAEMONIZE", "0") != "0":
        raise ConfigError(f"{path}: DAEMONIZE={values['DAEMONIZE']}: the stand-in runs in the foreground only")
    return values


def read_hosts(path: str) -> dict[str, str]:
    """name -> address, first line wins (as glibc's files backend)."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in _read(path).splitlines():
            words = line.split("#", 1)[0].split()
            for name in words[1:]:
                out.setdefault(name, words[0])
    return out


@dataclass
class Peer:
    name: str
    address: str
    state: str = "N"  # N never connected, C connected, D disconnected
    stopped: threading.Event = field(default_factory=threading.Event)
    sock: socket.socket | None = None


class Daemon:
    def __init__(self, config: dict[str, str], config_path: str) -> None:
        self.bind_ip = config["IMEX_CMD_BIND_INTERFACE_IP"]
        self.server_port = int(config["SERVER_PORT"])
        self.command_port = int(config["IMEX_CMD_PORT"])
        self.node_file = config["IMEX_NODE_CONFIG_FILE"]
        self.directory = os.path.dirname(self.node_file)
        self.state_path = os.path.join(os.path.dirname(os.path.abspath(config_path)), STATE_FILE)
        self.nodes = [n.strip() for n in _read(self.node_file).splitlines()
                      if n.strip() and not n.startswith("#")]
        self.lock = threading.Lock()
        self.save_lock = threading.Lock()
        self.peers: dict[str, Peer] = {}
        self.addresses: dict[str, str] = {}
        self.reloads = 0
        self.dropped_reloads = 0
        self.reload_interval = float(os.environ.get(RELOAD_INTERVAL_ENV) or RELOAD_INTERVAL_S)
        self.last_reload: float | None = None
        self.stop = threading.Event()
        self.reload_asked = threading.Event()
        self.inbound: list[socket.socket] = []

    # -- membership --------------------------------------------------------------------------------------

    def resolve(self) -> None:
        hosts = read_hosts(os.path.join(self.directory, HOSTS_FILE))
        with self.lock:
            self.addresses = {n: hosts[n] for n in self.nodes if n in hosts}
            wanted = {n: a for n, a in self.addresses.items() if a not in (UNUSED_SLOT, self.bind_ip)}
            for name, peer in list(self.peers.items()):
                if wanted.get(name) != peer.address:
                    self._drop(peer)
                    del self.peers[name]
            for name, address in wanted.items():
                if name not in self.peers:
                    peer = Peer(name, address)
                    self.peers[name] = peer
                    threading.Thread(target=self._connect, args=(peer,), daemon=True).start()
        self.save()

    def _drop(self, peer: Peer) -> None:
        peer.stopped.set()
        if peer.sock is not None:
            with contextlib.suppress(OSError):
                peer.sock.shutdown(socket.SHUT_RDWR)

    def _connect(self, peer: Peer) -> None:
        while not peer.stopped.is_set() and not self.stop.is_set():
            try:
                sock = socket.create_connection((peer.address, self.server_port), timeout=CONNECT_TIMEOUT_S,
                                                source_address=(self.bind_ip, 0))
                sock.sendall(HELLO)
                if sock.makefile("rb").readline() != WELCOME:
                    raise OSError("no welcome")
                sock.settimeout(None)
            except OSError:
                peer.stopped.wait(RETRY_S)
                continue
            peer.sock = sock
            self._set(peer, "C")
            with contextlib.suppress(OSError):
                while sock.recv(4096):
                    pass
            with contextlib.suppress(OSError):
                sock.close()
            peer.sock = None
            if not peer.stopped.is_set():
                self._set(peer, "D")
                peer.stopped.wait(RETRY_S)

    def _set(self, peer: Peer, state: str) -> None:
        with self.lock:
            if self.peers.get(peer.name) is not peer:
                return
            peer.state = state
        self.save()

    def ready(self) -> bool:
        with self.lock:
            return self._ready_locked()

    def _ready_locked(self) -> bool:
        found_self = self.bind_ip in self.addresses.values()
        return found_self and all(p.state == "C" for p in self.peers.values())

    def table(self) -> str:
        with self.lock:
            rows = []
            for i, name in enumerate(self.nodes):
                address = self.addresses.get(name, "")
                if address == self.bind_ip:
                    letter = "*"
                elif not address or address == UNUSED_SLOT:
                    letter = "I"
                else:
                    peer = self.peers.get(name)
                    letter = peer.state if peer is not None else "I"
                rows.append(f"{i:>4}  {letter}  {address or '-':<15}  {name}")
        status = "READY" if self.ready() else "NOT_READY"
        return f"{LEGEND}\nDomain State: {status}\nNode  St  Address          Name\n" + "\n".join(rows) + "\n"

    def save(self) -> None:
        # One writer at a time from reading the state to the rename: two threads' saves interleaved could leave
        # the older state on disk last.
        with self.save_lock, self.lock:
            peers = {n: {"address": p.address, "state": p.state} for n, p in self.peers.items()}
            reloads, dropped = self.reloads, self.dropped_reloads
            state = {"pid": os.getpid(), "reloads": reloads, "dropped_reloads": dropped, "bind_ip": self.bind_ip,
                     "peers": peers, "ready": self._ready_locked()}
            tmp = f"{self.state_path}.{os.getpid()}.tmp"
            with contextlib.suppress(OSError):
                with open(tmp, "w") as f:
                    json.dump(state, f)
                os.replace(tmp, self.state_path)

    # -- sockets -----------------------------------------------------------------------------------------

    def listen(self, port: int) -> socket.socket:
        server = socket.socket(socket.AF_INET6 if ":" in self.bind_ip else socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((self.bind_ip, port))
        server.listen(64)
        server.settimeout(0.2)
        return server

    def _accepted(self, server: socket.socket) -> Iterator[socket.socket]:
        """Each connection `server` accepts, until the stand-in stops or the socket is closed."""
        while not self.stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            yield conn

    def serve_peers(self, server: socket.socket) -> None:
        for conn in self._accepted(server):
            conn.settimeout(None)
            self.inbound.append(conn)
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            if conn.makefile("rb").readline() == HELLO:
                conn.sendall(WELCOME)
                while conn.recv(4096):
                    pass
        with contextlib.suppress(OSError):
            conn.close()

    def serve_commands(self, server: socket.socket) -> None:
        for conn in self._accepted(server):
            with conn, contextlib.suppress(OSError):
                conn.settimeout(2.0)
                command = conn.makefile("rb").readline().strip()
                if command == b"QUERY":
                    conn.sendall(b"READY\n" if self.ready() else b"NOT_READY\n")
                elif command == b"NODES":
                    conn.sendall(self.table().encode())
                else:
                    conn.sendall(b"ERROR unknown command\n")

    # -- lifetime ----------------------------------------------------------------------------------------

    def run(self) -> int:
        try:
            peer_server = self.listen(self.server_port)
            command_server = self.listen(self.command_port)
        except OSError as exc:
            print(f"nvidia-imex (stand-in): cannot listen on {self.bind_ip}: {exc.strerror}", file=sys.stderr)
            return 1
        parent = os.getppid()

        def on_reload(signum: int, frame: FrameType | None) -> None:
            now = time.monotonic()
            if self.last_reload is not None and now - self.last_reload < self.reload_interval:
                self.dropped_reloads += 1
                return
            self.last_reload = now
            self.reload_asked.set()

        def on_stop(signum: int, frame: FrameType | None) -> None:
            self.stop.set()

        signal.signal(signal.SIGUSR1, on_reload)
        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        threading.Thread(target=self.serve_peers, args=(peer_server,), daemon=True).start()
        threading.Thread(target=self.serve_commands, args=(command_server,), daemon=True).start()
        self.resolve()
        print(f"nvidia-imex (stand-in): pid {os.getpid()} serving on {self.bind_ip}:{self.server_port}",
              file=sys.stderr, flush=True)
        while not self.stop.wait(0.1):
            if self.reload_asked.is_set():
                self.reload_asked.clear()
                with self.lock:
                    self.reloads += 1
                self.resolve()
            if os.getppid() != parent:
                break
        for server in (peer_server, command_server):
            server.close()
        with self.lock:
            for peer in self.peers.values():
                self._drop(peer)
        for conn in self.inbound:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        return 0


def _config_argument(argv: list[str], tool: str) -> str:
    if "-c" not in argv or argv.index("-c") + 1 >= len(argv):
        raise ConfigError(f"usage: {tool} -c <config file> ...")
    return argv[argv.index("-c") + 1]


def imex_main(argv: list[str]) -> int:
    try:
        path = _config_argument(argv, "nvidia-imex")
        daemon = Daemon(read_config(path), path)
    except (ConfigError, OSError) as exc:
        print(f"nvidia-imex (stand-in): {exc}", file=sys.stderr)
        return 1
    return daemon.run()


def ctl_main(argv: list[str]) -> int:
    try:
        config = read_config(_config_argument(argv, "nvidia-imex-ctl"))
    except ConfigError as exc:
        print(f"nvidia-imex-ctl (stand-in): {exc}", file=sys.stderr)
        return 1
    if "-q" in argv:
        command = b"QUERY\n"
    elif "-N" in argv:
        command = b"NODES\n"
    else:
        print("nvidia-imex-ctl (stand-in): usage: nvidia-imex-ctl -c <config> -q | -N", file=sys.stderr)
        return 2
    address = (config["IMEX_CMD_BIND_INTERFACE_IP"], int(config["IMEX_CMD_PORT"]))
    try:
        with socket.create_connection(address, timeout=5.0) as conn:
            conn.sendall(command)
            reply = b""
            while chunk := conn.recv(65536):
                reply += chunk
    except OSError as exc:
        print(f"nvidia-imex-ctl (stand-in): cannot reach the IMEX daemon at {address[0]}:{address[1]}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 1
    sys.stdout.write(reply.decode())
    return 0
