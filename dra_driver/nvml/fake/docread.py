"""A hand-written strict reader for the fake NVML's node and state files (plain data decoded from JSON or YAML).

Why not pydantic (`dra_driver.strictdecode`, the product's one way for user documents): the fake is the NVML of
every test, bench and sandbox node, and opening it decoded the preset through ≈ 30 pydantic models — ≈ 9-11 MiB of
the plugin's RSS at rest and ≈ 0.25 s of its CPU to registered (docs/benchmarks.md "Issue 37, item 2"). The rules
and the words are strictdecode's, so a node file reads the same either way: unknown fields, wrong types and
coercions (`true` for 1, `"1"` for 1) are errors; a field left out takes its default while an explicit null is a
typo; every problem of a document is reported at once, in document order, each at its field path
(`gpus[2].model`) saying what would be accepted.

A reader is a function `(value, path) -> decoded value` that raises `Rejected` with every problem it found; `fields`
reads an object's fields in their declared order and keeps going after a bad field, so problems add up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, NoReturn, TypeVar

from dra_driver.errors import Problem

T = TypeVar("T")
K = TypeVar("K")
E = TypeVar("E", bound=Enum)
Read = Callable[[object, str], T]


class Rejected(Exception):
    """Problems found below one value; `fields` and `items` collect them across siblings."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(map(str, self.problems)))


def fail(path: str, message: str) -> NoReturn:
    raise Rejected([Problem(path, message)])


def join(path: str, part: str | int) -> str:
    if isinstance(part, int):
        return f"{path}[{part}]"
    return f"{path}.{part}" if path else part


# ---- values in words ----------------------------------------------------------------------------
# strictdecode's `type_name`, `_described` and `one_of`, kept private here so that reading a fake node file loads no
# pydantic; tests/nvml/test_fake_docread.py holds the two wordings equal.


def _type_name(value: object) -> str:
    """What a decoded JSON/YAML value is, in the words error messages use ("got a list")."""
    if value is None:
        return "null"
    for kind, name in ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string")):
        if isinstance(value, kind):
            return name
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _described(value: object) -> str:
    """`_type_name`, with the value itself when it is short enough to help ("a string '5'")."""
    if isinstance(value, str | int | float) and len(repr(value)) <= 40:
        return f"{_type_name(value)} {value!r}"
    return _type_name(value)


def _one_of(choices: Iterable[str], value: object) -> str:
    """The message for a value outside a fixed set of choices."""
    names = list(choices)
    return f"{_allowed(names)}{',' if len(names) == 1 else ';'} got {value!r}"


def _allowed(choices: Sequence[str]) -> str:
    return f"must be {choices[0]!r}" if len(choices) == 1 else f"must be one of {', '.join(choices)}"


def _wrong_type(path: str, expected: str, value: object, hint: str = "") -> NoReturn:
    fail(path, f"must be {expected}, got {_described(value)}{f' ({hint})' if hint else ''}")


# ---- scalars ------------------------------------------------------------------------------------


def integer(lo: int | None = None, hi: int | None = None, *, hint: str = "") -> Read[int]:
    """An integer (never a boolean) within [lo, hi]."""

    def read(value: object, path: str) -> int:
        if type(value) is not int:
            _wrong_type(path, "an integer", value, hint)
        _check_range(value, path, lo, hi, hint)
        return value

    return read


def number(lo: float | None = None) -> Read[float]:
    """A number: an integer or a float (never a boolean), >= lo."""

    def read(value: object, path: str) -> float:
        if type(value) is not int and type(value) is not float:
            _wrong_type(path, "a number", value)
        _check_range(value, path, lo, None, "")
        return float(value)

    return read


def _check_range(value: float, path: str, lo: float | None, hi: float | None, hint: str) -> None:
    if (lo is None or value >= lo) and (hi is None or value <= hi):
        return
    noun = "a whole number " if type(value) is int and lo is not None and lo >= 0 else ""
    suffix = f", got {value!r}{f' ({hint})' if hint else ''}"
    if lo is not None and hi is not None:
        fail(path, f"must be {noun}between {lo} and {hi}{suffix}")
    fail(path, f"must be {noun}{'>= ' + str(lo) if lo is not None else '<= ' + str(hi)}{suffix}")


NON_NEGATIVE: Final = integer(0)
POSITIVE: Final = integer(1)


def string(*, nonempty: bool = False, check: Callable[[str], str] | None = None) -> Read[str]:
    """A string; `check` may normalise it or raise ValueError with the message."""

    def read(value: object, path: str) -> str:
        if not isinstance(value, str):
            _wrong_type(path, "a string", value)
        if nonempty and not value:
            fail(path, "must not be empty")
        return value if check is None else checked(check, value, path)

    return read


NON_EMPTY: Final = string(nonempty=True)
STRING: Final = string()


def boolean(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        _wrong_type(path, "a boolean", value)
    return value


def choice(*choices: str) -> Read[str]:
    """One of fixed strings (a Literal)."""

    def read(value: object, path: str) -> str:
        if not isinstance(value, str) or value not in choices:
            fail(path, _one_of(choices, value))
        return value

    return read


def member_named(enum_type: type[E], *, upper: bool = False, any_case: bool = False, skip: Iterable[E] = ()) -> Read[E]:
    """An enum member given by its name (lower-case unless `upper`), as files spell it."""
    skipped = set(skip)
    names = {m.name if upper else m.name.lower(): m for m in enum_type if m not in skipped}

    def read(value: object, path: str) -> E:
        key = value.lower() if any_case and isinstance(value, str) else value
        if isinstance(key, str) and key in names:
            return names[key]
        fail(path, _one_of(names, value))

    return read


def checked(check: Callable[[T], K], value: T, path: str) -> K:
    """`check(value)`, its ValueError a problem at `path`."""
    try:
        return check(value)
    except ValueError as exc:
        fail(path, str(exc))


def then(read: Read[T], check: Callable[[T], K]) -> Read[K]:
    """`read`, then `check` on what it read (a ValueError is the problem)."""
    return lambda value, path: checked(check, read(value, path), path)


def nullable(read: Read[T]) -> Read[T | None]:
    """`read`, or null (None)."""
    return lambda value, path: None if value is None else read(value, path)


# ---- containers ---------------------------------------------------------------------------------


def items(
    read: Read[T], *, min_len: int | None = None, max_len: int | None = None, hint: str = ""
) -> Read[tuple[T, ...]]:
    """A list of items, each read by `read`; every bad item is reported."""

    def read_items(value: object, path: str) -> tuple[T, ...]:
        if not isinstance(value, list | tuple):
            _wrong_type(path, "a list", value, hint)
        out: list[T] = []
        problems: list[Problem] = []
        for i, item in enumerate(value):
            try:
                out.append(read(item, join(path, i)))
            except Rejected as exc:
                problems.extend(exc.problems)
        if problems:
            raise Rejected(problems)
        note = f" ({hint})" if hint else ""
        if min_len is not None and len(out) < min_len:
            fail(path, f"needs at least {min_len} entr{'y' if min_len == 1 else 'ies'}{note}")
        if max_len is not None and len(out) > max_len:
            fail(path, f"takes at most {max_len} entr{'y' if max_len == 1 else 'ies'}{note}")
        return tuple(out)

    return read_items


def mapping(key: Read[K], read: Read[T], *, min_len: int | None = None, hint: str = "") -> Read[dict[K, T]]:
    """An object of any keys, each key read by `key` and its value by `read` (both at `<path>.<key>`)."""

    def read_map(value: object, path: str) -> dict[K, T]:
        if not isinstance(value, Mapping):
            _wrong_type(path, "an object", value, hint)
        out: dict[K, T] = {}
        problems: list[Problem] = []
        for raw, item in value.items():
            where = f"{path}.{raw}"
            found: list[Problem] = []  # a bad key and a bad value are both reported
            try:
                decoded_key = key(raw, where)
            except Rejected as exc:
                found.extend(exc.problems)
            try:
                decoded = read(item, where)
            except Rejected as exc:
                found.extend(exc.problems)
            if found:
                problems.extend(found)
            else:
                out[decoded_key] = decoded
        if problems:
            raise Rejected(problems)
        if min_len is not None and len(out) < min_len:
            note = f" ({hint})" if hint else ""
            fail(path, f"needs at least {min_len} entr{'y' if min_len == 1 else 'ies'}{note}")
        return out

    return read_map


def by_type(**members: Read[Any]) -> Read[Any]:
    """A value whose JSON type picks how it is read: `by_type(a_string=..., an_object=...)`; an error then speaks
    about that member only."""
    readers = {name.replace("_", " "): read for name, read in members.items()}

    def read(value: object, path: str) -> Any:
        member = readers.get(_type_name(value))
        if member is None:
            fail(path, f"must be {' or '.join(readers)}, got {_described(value)}")
        return member(value, path)

    return read


_REQUIRED: Final = object()
_NOT_NULL: Final = "must not be null; leave the field out for its default"


@dataclass(frozen=True)
class Field:
    """One field of an object: its key, how it is read and its default (none: required). `opt`: it may be left out
    (its default then) but not given as null. `choices`: named when the required field is missing."""

    key: str
    read: Read[Any]
    default: object = _REQUIRED
    opt: bool = False
    choices: tuple[str, ...] = ()


def fields(value: object, path: str, spec: Iterable[Field]) -> dict[str, Any]:
    """An object's fields as {key: value} (defaults filled in), read in `spec`'s order; unknown keys are errors.
    Raises Rejected with the problems of every field."""
    spec = tuple(spec)
    if not isinstance(value, Mapping):
        _wrong_type(path, "an object", value)
    out: dict[str, Any] = {}
    problems: list[Problem] = []
    for field in spec:
        where = join(path, field.key)
        if field.key not in value:
            if field.default is _REQUIRED:
                allowed = f"; {_allowed(field.choices)}" if field.choices else ""
                problems.append(Problem(where, f"required field is missing{allowed}"))
            else:
                out[field.key] = field.default
            continue
        given = value[field.key]
        if given is None and field.opt:
            problems.append(Problem(where, _NOT_NULL))
            continue
        try:
            out[field.key] = field.read(given, where)
        except Rejected as exc:
            problems.extend(exc.problems)
    known = {f.key for f in spec}
    for key in value:
        if key not in known:
            problems.append(
                Problem(join(path, str(key)), f"unknown field; allowed fields: {', '.join(known_keys(spec))}")
            )
    if problems:
        raise Rejected(problems)
    return out


def known_keys(spec: Iterable[Field]) -> list[str]:
    return [f.key for f in spec]


def given(value: object, key: str) -> bool:
    """Whether the object `value` (already read by `fields`) gave `key` itself."""
    return isinstance(value, Mapping) and key in value


def problems_at(path: str, found: Iterable[tuple[str | int | tuple[str | int, ...], str]]) -> Rejected:
    """A whole-object check's problems, each at a key (or key path) below `path`."""
    out: list[Problem] = []
    for loc, message in found:
        where = path
        for part in loc if isinstance(loc, tuple) else (loc,):
            where = join(where, part)
        out.append(Problem(where, message))
    return Rejected(out)
