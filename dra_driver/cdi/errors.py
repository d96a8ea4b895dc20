"""The one error type the CDI package raises for bad specs and names."""

from __future__ import annotations

from dra_driver.errors import DecodeError


class CdiError(DecodeError):
    """A CDI spec, name or file is invalid.

    `field` is a JSON-path-like location (e.g. ``devices[2].containerEdits.mounts[0].hostPath``) so a
    user can find the offending entry; the message says what is wrong and how to fix it. A spec that
    fails to decode carries every problem in `problems`.
    """

    @property
    def field(self) -> str:
        return self.path
