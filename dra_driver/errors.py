"""The product's one base exception.

Every error the product raises on purpose derives from `DraDriverError`, so a caller (a subcommand, a
gRPC servicer, the controller) can tell "we refused this, with a message for the user" from a bug.
Subclasses that are also a `ValueError` or `RuntimeError` keep that base for callers that expect it.
"""

from __future__ import annotations


class DraDriverError(Exception):
    """Base of every deliberate dra-driver error; its message is meant for the user."""
