"""Listening on a TCP port a flag names: a port that is taken is a one-line error naming the flag and the fix, never
a traceback (`--metrics-port 9464: address already in use; choose another port, or -1 to disable it`)."""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable
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
