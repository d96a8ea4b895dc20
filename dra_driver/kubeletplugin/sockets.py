"""Unix sockets for the kubelet: safe replacement of stale sockets, tight permissions."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from pathlib import Path

from dra_driver.errors import DraDriverError

UNIX_PATH_MAX = 107  # sun_path is 108 bytes including the terminating NUL


class SocketInUseError(DraDriverError, RuntimeError):
    pass


class SocketPathError(DraDriverError, ValueError):
    """A socket path over the kernel's limit; the message names the flag whose directory makes it so."""


def socket_path_problem(path: Path) -> str | None:
    size = len(os.fsencode(str(path)))
    if size <= UNIX_PATH_MAX:
        return None
    return f"socket {path.name} would make a {size}-byte path, over the unix socket limit of {UNIX_PATH_MAX} bytes"


def check_socket_path(flag: str, directory: Path, path: Path) -> Path:
    """`path` (a socket in `directory`, which `flag` names), or a SocketPathError naming the flag and the fix."""
    problem = socket_path_problem(path)
    if problem is not None:
        raise SocketPathError(f"{flag} {directory}: {problem}; choose a shorter directory")
    return path


def ensure_private_dir(path: Path, mode: int = 0o750) -> None:
    """Create the directory (and parents) and make sure it is not group/world-writable."""
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    current = stat.S_IMODE(path.stat().st_mode)
    if current & 0o022:
        os.chmod(path, current & ~0o022)


def claim_socket_path(path: Path) -> None:
    """Make `path` free for a new listening socket.

    A socket left by a previous (dead) instance is removed. A socket somebody still answers on is NOT
    taken over: two plugin instances on one socket would fight over claims. Anything that is not a
    socket is left alone and reported, since deleting arbitrary files is never safe.
    """
    problem = socket_path_problem(path)
    if problem is not None:
        raise SocketPathError(f"{path.parent}: {problem}; choose a shorter directory")
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketInUseError(f"{path} exists and is not a socket; remove it by hand if it is not needed")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    finally:
        probe.close()
    raise SocketInUseError(f"another process is serving {path}; is a second plugin instance running on this node?")


def restrict_socket(path: Path, mode: int = 0o660) -> None:
    os.chmod(path, mode)


def remove_socket(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
