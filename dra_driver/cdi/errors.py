"""The CDI package's errors: bad specs and names (`CdiError`), and a claim's spec file that cannot be written, read
or removed (`CdiSpecError`, both drivers')."""

from __future__ import annotations

from dra_driver.errors import DecodeError, DraDriverError


class CdiError(DecodeError):
    """A CDI spec, name or file is invalid.

    `field` is a JSON-path-like location (e.g. ``devices[2].containerEdits.mounts[0].hostPath``) so a
    user can find the offending entry; the message says what is wrong and how to fix it. A spec that
    fails to decode carries every problem in `problems`.
    """

    @property
    def field(self) -> str:
        return self.path


class CdiSpecError(DraDriverError):
    """A claim's CDI spec could not be written, read or removed; names the file and what to do."""
