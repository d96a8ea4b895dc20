"""Strict, path-aware readers for the fake NVML's YAML node files and JSON state files.

Every error names the offending field as a path (`gpus[2].model`) and says what would be accepted,
so a typo in a hand-written node file is fixed from the message alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from dra_driver.errors import DraDriverError

_MISSING: Final = object()


class SpecError(DraDriverError, ValueError):
    """A node description or state document is invalid. The message starts with the field path."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}" if path else problem)


def join(path: str, key: str | int) -> str:
    """`join("gpus", 2)` -> `gpus[2]`; `join("gpus[2]", "model")` -> `gpus[2].model`."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def as_mapping(value: object, path: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise SpecError(path, f"expected a mapping, got {type_name(value)}")
    for key in value:
        if not isinstance(key, str):
            raise SpecError(path, f"keys must be strings, got {key!r}")
    return value


def check_keys(mapping: Mapping[str, object], path: str, allowed: Iterable[str], required: Iterable[str] = ()) -> None:
    allowed_set = set(allowed)
    for key in mapping:
        if key not in allowed_set:
            where = join(path, key)
            raise SpecError(where, f"unknown field; allowed here: {', '.join(sorted(allowed_set))}")
    for key in required:
        if key not in mapping:
            raise SpecError(join(path, key), "required field is missing")


def as_int(value: object, path: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    # bool is an int subclass; `count: true` is a typo, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(path, f"expected an integer, got {type_name(value)}")
    if minimum is not None and value < minimum:
        raise SpecError(path, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise SpecError(path, f"must be <= {maximum}, got {value}")
    return value


def as_str(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise SpecError(path, f"expected a string, got {type_name(value)}")
    if not value:
        raise SpecError(path, "must not be empty")
    return value


def as_bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError(path, f"expected true or false, got {type_name(value)}")
    return value


def as_list(value: object, path: str, *, min_len: int = 0) -> Sequence[object]:
    if not isinstance(value, list | tuple):
        raise SpecError(path, f"expected a list, got {type_name(value)}")
    if len(value) < min_len:
        raise SpecError(path, f"needs at least {min_len} entr{'y' if min_len == 1 else 'ies'}")
    return value


def as_choice(value: object, path: str, choices: Iterable[str]) -> str:
    options = list(choices)
    text = as_str(value, path)
    if text not in options:
        raise SpecError(path, f"unknown value {text!r}; choose one of: {', '.join(options)}")
    return text


def get(mapping: Mapping[str, object], key: str, default: object = _MISSING) -> object:
    """The raw value, or `default` when absent (a missing required key is reported by check_keys)."""
    if key in mapping:
        return mapping[key]
    if default is _MISSING:  # pragma: no cover - check_keys runs first
        raise KeyError(key)
    return default


def parse_cpu_list(value: object, path: str) -> tuple[int, ...]:
    """Linux cpulist text ("0-55,112-167") or a list of ints -> sorted unique CPU ids."""
    cpus: set[int] = set()
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            cpus.add(as_int(item, join(path, i), minimum=0))
        return tuple(sorted(cpus))
    if isinstance(value, int) and not isinstance(value, bool):
        return (as_int(value, path, minimum=0),)
    text = as_str(value, path)
    for part in text.split(","):
        part = part.strip()
        lo_text, sep, hi_text = part.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if sep else lo
        except ValueError:
            raise SpecError(path, f'bad CPU list item {part!r}; write e.g. "0-55,112-167"') from None
        if lo < 0 or hi < lo:
            raise SpecError(path, f"bad CPU range {part!r}; write low-high with low <= high")
        cpus.update(range(lo, hi + 1))
    return tuple(sorted(cpus))
