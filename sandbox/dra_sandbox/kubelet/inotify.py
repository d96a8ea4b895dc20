"""Linux inotify through ctypes (no third-party dependency), used by the plugin watcher.

Only what the watcher needs: create/delete/move events on directories, read with a timeout so the
watcher thread can notice a stop request.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
from dataclasses import dataclass

IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000

WATCH_MASK = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
EVENT_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len


class InotifyUnavailable(OSError):
    """inotify cannot be used here (not Linux, no libc symbol, limits reached)."""


@dataclass(frozen=True)
class InotifyEvent:
    wd: int
    mask: int
    name: str

    @property
    def is_dir(self) -> bool:
        return bool(self.mask & IN_ISDIR)


def parse_events(buffer: bytes) -> list[InotifyEvent]:
    """Pure: split a read() buffer into events."""
    events: list[InotifyEvent] = []
    offset = 0
    while offset + EVENT_HEADER.size <= len(buffer):
        wd, mask, _cookie, length = EVENT_HEADER.unpack_from(buffer, offset)
        offset += EVENT_HEADER.size
        raw = buffer[offset : offset + length]
        offset += length
        events.append(InotifyEvent(wd, mask, raw.split(b"\0", 1)[0].decode(errors="surrogateescape")))
    return events


class Inotify:
    def __init__(self) -> None:
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name or "libc.so.6", use_errno=True)
            self._init1 = libc.inotify_init1
            self._add_watch = libc.inotify_add_watch
            self._rm_watch = libc.inotify_rm_watch
        except (OSError, AttributeError) as exc:
            raise InotifyUnavailable(f"inotify not available: {exc}") from None
        self._add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        fd = self._init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise InotifyUnavailable(err, f"inotify_init1 failed: {os.strerror(err)}")
        self.fd: int = fd

    def add_watch(self, path: str, mask: int = WATCH_MASK) -> int:
        wd = self._add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_add_watch({path}) failed: {os.strerror(err)}")
        return int(wd)

    def remove_watch(self, wd: int) -> None:
        self._rm_watch(self.fd, wd)  # errors ignored: the directory may already be gone

    def read(self, timeout_s: float) -> list[InotifyEvent]:
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        if not ready:
            return []
        try:
            return parse_events(os.read(self.fd, 64 * 1024))
        except BlockingIOError:
            return []

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
