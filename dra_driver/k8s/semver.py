"""Semantic versions (semver 2.0.0) as the Kubernetes CEL `semver` library sees them.

Strict parsing follows semver 2.0.0 (MAJOR.MINOR.PATCH, no leading zeros, optional pre-release and
build metadata). `normalize=True` mirrors `semver(s, true)`: a leading "v" is dropped, missing minor/
patch components become 0 and leading zeros in the numeric core are removed. Comparison follows
semver precedence, which ignores build metadata (so 1.0.0+a == 1.0.0+b, as blang/semver's EQ does).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from dra_driver.errors import DraDriverError

__all__ = ["Semver", "SemverError", "is_semver", "parse_semver"]

_IDENT: Final = r"[0-9A-Za-z-]+"
_SEMVER_RE: Final = re.compile(
    rf"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    rf"(?:-({_IDENT}(?:\.{_IDENT})*))?"
    rf"(?:\+({_IDENT}(?:\.{_IDENT})*))?"
)
_NUMERIC: Final = re.compile(r"[0-9]+")


class SemverError(DraDriverError, ValueError):
    """A string is not a semantic version."""


@dataclass(frozen=True, eq=False)
class Semver:
    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()
    build: tuple[str, ...] = ()

    def compare(self, other: Semver) -> int:
        mine = (self.major, self.minor, self.patch)
        theirs = (other.major, other.minor, other.patch)
        if mine != theirs:
            return -1 if mine < theirs else 1
        return _compare_prerelease(self.prerelease, other.prerelease)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Semver):
            return NotImplemented
        return self.compare(other) == 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.prerelease))

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        if self.build:
            text += "+" + ".".join(self.build)
        return text

    def __repr__(self) -> str:
        return f"Semver({str(self)!r})"


def _compare_prerelease(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    # A version without pre-release has higher precedence than one with it.
    if not a or not b:
        return (not a) - (not b)
    for x, y in zip(a, b, strict=False):
        if x == y:
            continue
        x_num, y_num = _NUMERIC.fullmatch(x) is not None, _NUMERIC.fullmatch(y) is not None
        if x_num and y_num:
            return -1 if int(x) < int(y) else 1
        if x_num != y_num:  # numeric identifiers sort before alphanumeric ones
            return -1 if x_num else 1
        return -1 if x < y else 1
    return (len(a) > len(b)) - (len(a) < len(b))


def _normalize(text: str) -> str:
    text = text.removeprefix("v")
    cut = min((i for i in (text.find("-"), text.find("+")) if i >= 0), default=len(text))
    core, rest = text[:cut], text[cut:]
    parts = core.split(".")
    if not 1 <= len(parts) <= 3 or not all(_NUMERIC.fullmatch(p) for p in parts):
        return text  # leave it to the strict parser to produce the error
    parts = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
    return ".".join(parts) + rest


def parse_semver(text: str, normalize: bool = False) -> Semver:
    """Parse a semantic version; raise SemverError naming the string and the expected form."""
    if not isinstance(text, str):
        raise SemverError(f"semver must be a string, got {type(text).__name__} {text!r}")
    candidate = _normalize(text) if normalize else text
    match = _SEMVER_RE.fullmatch(candidate)
    if match is None:
        hint = "" if normalize else " (use semver(s, true) to accept forms like 'v1.2' or '1.02.3')"
        raise SemverError(f"invalid semver {text!r}: expected MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]{hint}")
    prerelease = tuple(match.group(4).split(".")) if match.group(4) else ()
    for ident in prerelease:
        if _NUMERIC.fullmatch(ident) and len(ident) > 1 and ident.startswith("0"):
            raise SemverError(f"invalid semver {text!r}: numeric pre-release identifier {ident!r} has a leading zero")
    build = tuple(match.group(5).split(".")) if match.group(5) else ()
    return Semver(int(match.group(1)), int(match.group(2)), int(match.group(3)), prerelease, build)


def is_semver(text: str, normalize: bool = False) -> bool:
    try:
        parse_semver(text, normalize)
    except SemverError:
        return False
    return True
