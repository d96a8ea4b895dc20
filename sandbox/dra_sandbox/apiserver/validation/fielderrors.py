"""Field errors and field paths, worded and typed as the kube-apiserver's `field.Error`.

Paths use the apiserver's notation (`field.Path`): `spec.devices[3].attributes[productName]` (list
indexes and map keys in brackets), so messages read exactly like a real cluster's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

# Cause types exactly as metav1.CauseType spells them, so Status.details.causes[].reason matches.
REQUIRED: Final = "FieldValueRequired"
INVALID: Final = "FieldValueInvalid"
DUPLICATE: Final = "FieldValueDuplicate"
NOT_SUPPORTED: Final = "FieldValueNotSupported"
FORBIDDEN: Final = "FieldValueForbidden"
TOO_LONG: Final = "FieldValueTooLong"
TOO_MANY: Final = "FieldValueTooMany"
TYPE_INVALID: Final = "FieldValueTypeInvalid"

_PREFIX: Final[Mapping[str, str]] = {
    REQUIRED: "Required value",
    INVALID: "Invalid value",
    DUPLICATE: "Duplicate value",
    NOT_SUPPORTED: "Unsupported value",
    FORBIDDEN: "Forbidden",
    TOO_LONG: "Too long",
    TOO_MANY: "Too many",
    TYPE_INVALID: "Invalid value",
}

NO_VALUE: Final = object()


class Verbatim(str):
    """A value field.Error prints as is (a Go `fmt.Stringer`, e.g. structured.SharedDeviceID), not quoted."""

    __slots__ = ()


@dataclass(frozen=True)
class FieldError:
    """One rejected field: where (`field`), what kind of problem (`reason`) and how to fix it (`detail`)."""

    field: str
    reason: str
    detail: str = ""
    value: object = NO_VALUE

    @property
    def message(self) -> str:
        """The apiserver's wording, e.g. `Invalid value: "X": a lowercase RFC 1123 label must ...`."""
        parts = [_PREFIX.get(self.reason, self.reason)]
        if self.value is not NO_VALUE and self.reason in (INVALID, DUPLICATE, NOT_SUPPORTED, TOO_MANY, TYPE_INVALID):
            parts.append(_render_value(self.value))
        if self.detail:
            parts.append(self.detail)
        return ": ".join(parts)

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def _render_value(value: object) -> str:
    if isinstance(value, Verbatim):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def format_errors(errors: Sequence[FieldError]) -> str:
    """`[a: Required value, b: Invalid value: ...]` as in the apiserver's aggregate message."""
    if len(errors) == 1:
        return str(errors[0])
    return "[" + ", ".join(str(e) for e in errors) + "]"


def child(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def index(path: str, i: int) -> str:
    return f"{path}[{i}]"


def key(path: str, k: str) -> str:
    return f"{path}[{k}]"


class Errors:
    """Accumulator; keeps the checks below readable (`errs.required(path, ...)`)."""

    def __init__(self) -> None:
        self.items: list[FieldError] = []

    def add(self, path: str, reason: str, detail: str = "", value: object = NO_VALUE) -> None:
        self.items.append(FieldError(path, reason, detail, value))

    def required(self, path: str, detail: str = "") -> None:
        self.add(path, REQUIRED, detail)

    def invalid(self, path: str, value: object, detail: str) -> None:
        self.add(path, INVALID, detail, value)

    def forbidden(self, path: str, detail: str) -> None:
        self.add(path, FORBIDDEN, detail)

    def duplicate(self, path: str, value: object) -> None:
        self.add(path, DUPLICATE, "", value)

    def not_supported(self, path: str, value: object, supported: Iterable[str]) -> None:
        self.add(path, NOT_SUPPORTED, "supported values: " + ", ".join(json.dumps(s) for s in supported), value)

    def too_many(self, path: str, actual: int, limit: int, what: str = "items") -> None:
        self.add(path, TOO_MANY, f"must have at most {limit} {what}", actual)

    def too_long(self, path: str, limit: int) -> None:
        self.add(path, TOO_LONG, f"may not be more than {limit} bytes")

    def type_invalid(self, path: str, value: object, expected: str) -> None:
        self.add(path, TYPE_INVALID, f"must be {expected}", value)
