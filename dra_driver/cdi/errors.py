"""The one error type the CDI package raises for bad specs and names."""

from __future__ import annotations

from dra_driver.errors import DraDriverError


class CdiError(DraDriverError, ValueError):
    """A CDI spec, name or file is invalid.

    `field` is a JSON-path-like location (e.g. ``devices[2].containerEdits.mounts[0].hostPath``) so a
    user can find the offending entry; the message says what is wrong and how to fix it.
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)
