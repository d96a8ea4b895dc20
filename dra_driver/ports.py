"""Listening on a TCP port a flag names: a port that is taken is a one-line error naming the flag and the fix, never
a traceback (`--metrics-port 9464: address already in use; choose another port, or -1 to disable it`)."""

from __future__ import annotations

import errno
import json
import os
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from dra_driver.errors import DraDriverError

T = TypeVar("T")


class PortError(DraDriverError):
    """A port a flag names cannot be listened on; the message names the flag, the port and the fix."""


def port_error(flag: str, port: int, exc: OSError, disable: str | None = "-1") -> PortError:
    fix = "choose another port" + (f", or {disable} to disable it" if disable is not None else "")
    if exc.errno == errno.EADDRINUSE:
        return PortError(f"{flag} {port}: address already in use; {fix}")
    if exc.errno == errno.EACCES:
        return PortError(f"{flag} {port}: permission denied (ports below 1024 need privileges); {fix}")
    return PortError(f"{flag} {port}: cannot listen: {exc.strerror or exc}; {fix}")


def listening(flag: str, port: int, create: Callable[[], T], *, disable: str | None = "-1") -> T:
    """`create()` (which binds the port), with an OSError turned into a PortError naming `flag`."""
    try:
        return create()
    except OSError as exc:
        raise port_error(flag, port, exc, disable) from None


def check_free(flag: str, host: str, port: int, *, disable: str | None = "-1") -> None:
    """Raise PortError when `host:port` cannot be listened on now. For servers bound later inside a framework
    (kopf's liveness endpoint and webhook server) whose own failure would be a traceback in its event loop; a
    port taken between this check and that bind still fails there, only less readably. SO_REUSEADDR as aiohttp
    sets it, so a port in TIME_WAIT after a restart does not count as taken."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
            probe.listen(1)
        except OSError as exc:
            raise port_error(flag, port, exc, disable) from None


def write_ports_file(path: Path, ports: Mapping[str, int]) -> None:
    """Write the ports a process bound (`{"healthz": 40123, "metrics": 40124}`) to `path`, whole or not at all
    (a temp file renamed over it). With `--healthz-port 0` and `--metrics-port 0` the kernel picks free ports
    and the process listens on them from the start, so a supervisor that starts several processes on one host
    (dra-sandbox) learns them from here instead of picking ports that another process may take before the bind."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(dict(ports), out)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_ports_file(path: Path) -> dict[str, int] | None:
    """The ports `write_ports_file` wrote, or None while there is no such file. A file that is there but is not
    a JSON object of port numbers is an error (it was not written by `write_ports_file`)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        raw = json.loads(text)
    except ValueError:
        raw = None
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and 0 < v < 65536 for k, v in raw.items()
    ):
        raise ValueError(f"{path}: not a ports file (a JSON object of name -> port)")
    return {str(k): int(v) for k, v in raw.items()}
