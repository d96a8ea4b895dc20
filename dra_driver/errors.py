"""The product's one base exception.

Every error the product raises on purpose derives from `DraDriverError`, so a caller (a subcommand, a
gRPC servicer, the controller) can tell "we refused this, with a message for the user" from a bug.
Subclasses that are also a `ValueError` or `RuntimeError` keep that base for callers that expect it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self


class DraDriverError(Exception):
    """Base of every deliberate dra-driver error; its message is meant for the user."""


# The decoding errors live here rather than beside their decoder (`strictdecode`, which re-exports them): code that
# only raises or catches them (the claim config types, the CDI rules, the kubelet plugin) then does not import
# pydantic and yaml at start-up; the decoders load them when a document is first decoded.
@dataclass(frozen=True)
class Problem:
    path: str  # e.g. "gpus[2].model"; empty for the document itself
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class DecodeError(DraDriverError, ValueError):
    """A document does not fit its schema: `path` and `message` tell the first problem, `problems` all of
    them in document order (a user fixes a file in one pass). Formats subclass it for their own name."""

    def __init__(self, path: str, message: str, *more: Problem) -> None:
        self.path = path
        self.message = message
        self.problems = (Problem(path, message), *more)
        super().__init__("; ".join(map(str, self.problems)))

    @classmethod
    def of(cls, problems: Sequence[Problem]) -> Self:
        first, *more = problems
        return cls(first.path, first.message, *more)
