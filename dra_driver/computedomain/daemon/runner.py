"""`dra-driver compute-domain-daemon run`: one IMEX daemon of a ComputeDomain on one node.

    join the clique (a slot, NotReady) -> write imexd.cfg, nodes.cfg, hosts -> start nvidia-imex once
    loop: clique changed (watch)  -> rewrite hosts, SIGUSR1 (at most one per 5 s, a trailing one)
          IMEX died (watchdog)     -> start it again
          every readiness interval -> nvidia-imex-ctl -q, mirror Ready/NotReady into the own entry
          own entry gone           -> join again (the controller prunes entries of pods it does not see)
    SIGTERM -> stop IMEX, remove the own entry, exit 0

A pod on a node without a clique (CLIQUE_ID empty: no NVLink fabric) runs no IMEX and idles until SIGTERM, as
NVIDIA's does. docs/compute-domains.md, "The IMEX daemon runner".
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import structlog

from dra_driver.computedomain.daemon.clique import CliqueClient, CliqueRef, clique_events
from dra_driver.computedomain.daemon.config import (
    ImexConfig,
    render_hosts,
    render_imex_config,
    render_node_config,
    slot_addresses,
    with_hosts_block,
)
from dra_driver.computedomain.daemon.imex import (
    IMEX_BINARY,
    IMEX_CTL_BINARY,
    RELOAD_INTERVAL_S,
    ImexProcess,
    ReloadLimiter,
    find_binary,
    query_ready,
)
from dra_driver.computedomain.daemon.membership import CliqueFull, Member, joined, with_status, without
from dra_driver.computedomain.model import ComputeDomainClique, DomainNode, parse_clique
from dra_driver.computedomain.names import (
    STATUS_NOT_READY,
    STATUS_READY,
    clique_object_name,
)
from dra_driver.errors import DraDriverError
from dra_driver.fsutil import atomic_write
from dra_driver.k8s.client import ApiError, KubeRest, WatchStream

log = structlog.get_logger(__name__)

WATCHDOG_INTERVAL_S: Final = 1.0  # NVIDIA's watchdog period
LEAVE_DEADLINE_S: Final = 10.0


class SettingsError(DraDriverError):
    """The runner's flags or environment are unusable."""


@dataclass(frozen=True)
class DaemonSettings:
    config_dir: str
    node_name: str
    pod_ip: str
    clique_id: str  # empty: the node has no NVLink clique; the runner idles
    domain_uid: str
    namespace: str  # the driver's namespace, where the clique object lives
    max_nodes: int
    imex_bin_dir: str = ""
    domain_name: str = ""
    domain_namespace: str = ""
    system_hosts_file: str = "/etc/hosts"  # where the real IMEX resolves names; "" writes none
    readiness_interval: float = 2.0
    reload_interval: float = RELOAD_INTERVAL_S
    retry_interval: float = 2.0
    watch_timeout_seconds: int = 300

    def validate(self) -> None:
        if not self.clique_id:
            return
        missing = [env for env, value in (("NODE_NAME", self.node_name), ("POD_IP", self.pod_ip),
                                          ("COMPUTE_DOMAIN_UUID", self.domain_uid),
                                          ("--driver-namespace (POD_NAMESPACE)", self.namespace)) if not value]
        if missing:
            raise SettingsError(f"{', '.join(missing)} must be set for a daemon with CLIQUE_ID {self.clique_id!r} "
                                "(the DaemonSet's downward API and the daemon claim's CDI edits set them)")
        try:
            ipaddress.ip_address(self.pod_ip)
        except ValueError:
            raise SettingsError(f"POD_IP {self.pod_ip!r} is not an IP address (downward API status.podIP)") from None
        if not 1 <= self.max_nodes <= 10_000:
            raise SettingsError(f"--max-nodes (MAX_NODES_PER_IMEX_DOMAIN) must be 1..10000, got {self.max_nodes}")


class DaemonRunner:
    """Runs until `stop` is set; `run()` returns the exit status."""

    def __init__(self, settings: DaemonSettings, rest: KubeRest | None, stop: threading.Event, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.rest = rest
        self.stop = stop
        self.clock = clock
        self.imex_config = ImexConfig(settings.config_dir, settings.pod_ip)
        self.member = Member(settings.node_name, settings.pod_ip, settings.clique_id)
        self._updates: queue.Queue[ComputeDomainClique | None] = queue.Queue()
        self._addresses: tuple[str, ...] | None = None
        self._status_written: str | None = None
        self._mapping_confirmed = True  # IMEX was READY since the mapping last changed (or reads it at start)
        self._stream: WatchStream | None = None
        self._lock = threading.Lock()

    def run(self) -> int:
        s = self.settings
        if not s.clique_id:
            log.info("no CLIQUE_ID: this node has no NVLink clique, so no IMEX daemon runs; idling until stopped",
                     node=s.node_name)
            self.stop.wait()
            return 0
        s.validate()
        assert self.rest is not None
        imex = ImexProcess(find_binary(IMEX_BINARY, s.imex_bin_dir), self.imex_config.config_path,
                           clock=self.clock, limiter=ReloadLimiter(s.reload_interval))
        ctl = find_binary(IMEX_CTL_BINARY, s.imex_bin_dir)
        client = CliqueClient(self.rest, CliqueRef(s.namespace, clique_object_name(s.domain_uid, s.clique_id)))
        self._write_static_files()
        clique = self._join(client)
        if clique is None:
            return 0  # stopped before it could join
        self._apply_mapping(clique, imex=None)
        imex.start()
        watcher = threading.Thread(target=self._watch, args=(client,), name="clique-watch", daemon=True)
        watcher.start()
        try:
            self._loop(client, imex, ctl)
        finally:
            self._close_stream()
            code = imex.stop()
            log.info("nvidia-imex stopped", status=code)
        watcher.join(5.0)
        return self._leave(client)

    # -- the main loop (one thread: every write to the config dir, the clique and the child is made here) -----

    def _loop(self, client: CliqueClient, imex: ImexProcess, ctl: str) -> None:
        s = self.settings
        next_check = self.clock()
        while not self.stop.is_set():
            now = self.clock()
            deadlines = [next_check, now + WATCHDOG_INTERVAL_S]
            if (due := imex.limiter.next_due()) is not None:
                deadlines.append(due)
            with contextlib.suppress(queue.Empty):
                update = self._updates.get(timeout=max(0.0, min(deadlines) - now))
                if self.stop.is_set():
                    return
                self._on_clique(client, update, imex)
            imex.tick()
            if imex.watchdog():
                self._status_written = None  # a fresh IMEX is not ready until it says so
                self._mapping_confirmed = True  # and it read the current mapping at its start
            if self.clock() >= next_check:
                ready = query_ready(ctl, self.imex_config.config_path)
                if ready:
                    self._mapping_confirmed = True
                elif not self._mapping_confirmed:
                    # IMEX drops a SIGUSR1 that comes too soon after the last (NVIDIA #1443); one lost that way
                    # would strand the newest mapping, so while IMEX has not been READY since the mapping changed
                    # the signal is sent again (rate-limited as every reload).
                    imex.reload()
                self._mirror_readiness(client, ready)
                next_check = self.clock() + s.readiness_interval

    def _on_clique(self, client: CliqueClient, clique: ComputeDomainClique | None, imex: ImexProcess) -> None:
        if clique is None or clique.daemon(self.member.node_name) is None:
            log.warning("own clique entry is gone (pruned, or the clique deleted): joining again")
            clique = self._join(client)
            if clique is None:
                return
        self._apply_mapping(clique, imex)

    def _apply_mapping(self, clique: ComputeDomainClique, imex: ImexProcess | None) -> None:
        s = self.settings
        addresses = slot_addresses(clique.daemons, s.clique_id, s.max_nodes)
        if addresses == self._addresses:
            return
        hosts = render_hosts(s.domain_uid, addresses)
        atomic_write(Path(self.imex_config.hosts_path), hosts.encode(), mode=0o644)
        self._write_system_hosts(hosts)
        self._addresses = addresses
        log.info("peer mapping changed", peers={i: a for i, a in enumerate(addresses) if a != "127.0.0.2"})
        if imex is not None:
            self._mapping_confirmed = False
            imex.reload()

    def _mirror_readiness(self, client: CliqueClient, ready: bool) -> None:
        status = STATUS_READY if ready else STATUS_NOT_READY
        if status == self._status_written:
            return
        missing = False

        def change(daemons: tuple[DomainNode, ...]) -> tuple[DomainNode, ...] | None:
            nonlocal missing
            current = next((d for d in daemons if d.name == self.member.node_name), None)
            missing = current is None
            if current is None or current.status == status:
                return None
            return with_status(daemons, self.member.node_name, status)

        try:
            client.change(change)
        except ApiError as exc:
            log.warning("could not write the clique entry's status; retrying", status=status, error=str(exc))
            return
        if missing:
            self._updates.put(None)  # the loop joins again
            return
        self._status_written = status
        log.info("clique entry status", status=status)

    # -- joining and leaving --------------------------------------------------------------------------------

    def _join(self, client: CliqueClient) -> ComputeDomainClique | None:
        while not self.stop.is_set():
            try:
                clique = client.change(lambda daemons: joined(daemons, self.member, self.settings.max_nodes))
            except CliqueFull as exc:
                log.error("cannot join the clique", error=str(exc))
            except ApiError as exc:
                log.warning("cannot join the clique yet; retrying", error=str(exc))
            else:
                if clique is not None:
                    own = clique.daemon(self.member.node_name)
                    log.info("joined the clique", clique=client.ref.name, index=own.index if own else None)
                    self._status_written = STATUS_NOT_READY
                    return clique
            self.stop.wait(self.settings.retry_interval)
        return None

    def _leave(self, client: CliqueClient) -> int:
        deadline = self.clock() + LEAVE_DEADLINE_S
        while True:
            try:
                client.change(lambda daemons: without(daemons, self.member.node_name)
                              if any(d.name == self.member.node_name for d in daemons) else None)
            except ApiError as exc:
                if self.clock() < deadline:
                    time.sleep(0.5)
                    continue
                log.error("could not remove the own clique entry (the controller prunes it)", error=str(exc))
                return 1
            log.info("left the clique", clique=client.ref.name)
            return 0

    # -- the clique watch (its own thread; hands parsed cliques to the loop) ---------------------------------

    def _watch(self, client: CliqueClient) -> None:
        version = ""
        while not self.stop.is_set():
            try:
                if not version:
                    listed = self.rest.request(  # type: ignore[union-attr]
                        "GET", f"/apis/gpu.dra.dev/v1beta1/namespaces/{client.ref.namespace}/computedomaincliques",
                        query={"fieldSelector": f"metadata.name={client.ref.name}"})
                    items = listed.get("items") or []
                    self._updates.put(parse_clique(items[0]) if items else None)
                    version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
                stream = client.watch(version, self.settings.watch_timeout_seconds)
                with self._lock:
                    self._stream = stream
                if self.stop.is_set():
                    stream.close()
                for kind, obj in clique_events(stream):
                    if kind == "ERROR":  # 410 Gone: the version is too old; list again
                        version = ""
                        break
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if kind in ("ADDED", "MODIFIED"):
                        self._updates.put(parse_clique(obj))
                    elif kind == "DELETED":
                        self._updates.put(None)
            except (ApiError, DraDriverError) as exc:
                if self.stop.is_set():
                    return
                log.warning("clique watch failed; watching again", error=str(exc))
                version = ""
                self.stop.wait(self.settings.retry_interval)

    def _close_stream(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.close()

    # -- files ----------------------------------------------------------------------------------------------

    def _write_static_files(self) -> None:
        s = self.settings
        Path(s.config_dir).mkdir(parents=True, exist_ok=True)
        atomic_write(Path(self.imex_config.config_path), render_imex_config(self.imex_config).encode(), mode=0o644)
        atomic_write(Path(self.imex_config.node_config_path),
                     render_node_config(s.domain_uid, s.max_nodes).encode(), mode=0o644)

    def _write_system_hosts(self, hosts: str) -> None:
        """The real nvidia-imex resolves the node map's names through the container's /etc/hosts (a file the
        kubelet mounts, so it is rewritten in place, not replaced: a rename over a mount point fails)."""
        path = self.settings.system_hosts_file
        if not path:
            return
        try:
            with open(path, "r+") as f:
                text = with_hosts_block(f.read(), hosts)
                f.seek(0)
                f.write(text)
                f.truncate()
        except OSError as exc:
            log.warning("cannot write the peers into the system hosts file; a real nvidia-imex will not resolve "
                        "them (pass --system-hosts-file '' where only the config dir's hosts file is read)",
                        path=path, error=os.strerror(exc.errno) if exc.errno else str(exc))

