"""One way to decode documents strictly, for the product and the test bench alike.

Every format read from users or from disk (opaque claim config, fake NVML node and state files, e2e
scenarios, CDI specs) is described by models derived from `StrictModel`: unknown fields, wrong types and
silent coercions ("1" for 1, true for 1) are errors, and decoded values are frozen. A `Decoder` runs such
a schema and turns pydantic's errors into `Problem`s in our words, each naming the exact field path
(`sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit['gpu0']`) and saying what would be accepted. The
YAML loaders refuse duplicate keys, which PyYAML would otherwise resolve silently (the last one wins).
"""

from __future__ import annotations

import enum
import functools
import types
import typing
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Generic, Literal, TypeVar, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Strict,
    Tag,
    TypeAdapter,
    ValidationError,
)
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from dra_driver.errors import DecodeError as DecodeError
from dra_driver.errors import Problem as Problem

T = TypeVar("T")
Loc = tuple[str | int, ...]

# ---- values in words ---------------------------------------------------------------------------


# The words for each kind of value, the first that matches: bool before int (bool is an int subclass).
_TYPE_NAMES: tuple[tuple[type[Any] | types.UnionType, str], ...] = (
    (types.NoneType, "null"),
    (bool, "a boolean"),
    (int, "an integer"),
    (float, "a number"),
    (str, "a string"),
    (Mapping, "an object"),
    (list | tuple, "a list"),
)


def type_name(value: object) -> str:
    """What a decoded JSON/YAML value is, in the words error messages use ("got a list")."""
    return next((name for kind, name in _TYPE_NAMES if isinstance(value, kind)), type(value).__name__)


def _described(value: object) -> str:
    """`type_name`, with the value itself when it is short enough to help ("a string '5'")."""
    if isinstance(value, str | int | float) and len(repr(value)) <= 40:
        return f"{type_name(value)} {value!r}"
    return type_name(value)


# ---- building blocks of models -----------------------------------------------------------------


class StrictModel(BaseModel):
    """Base of every decoded document: unknown fields and coercions are errors; values are frozen."""

    # defer_build: a schema is built on first use, so a process pays only for the formats it reads.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, defer_build=True)


class CamelModel(StrictModel):
    """A Kubernetes-style document: attributes in snake_case, keys in camelCase."""

    model_config = ConfigDict(alias_generator=to_camel)


NonNegative = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(ge=1)]
NonEmpty = Annotated[str, Field(min_length=1)]
# Documents hold lists, frozen values hold tuples: the container converts, its items stay strict.
Items = Annotated[tuple[T, ...], Strict(False)]
E = TypeVar("E", bound=enum.Enum)
# An enum member given by its value: documents hold the string, strict mode would want the member.
Choice = Annotated[E, Strict(False)]

# A union whose members differ in JSON type ("nvlink: nvswitch" or "nvlink: {kind: direct, ...}"): the
# member is picked by the input's type, so an error speaks about that member only. Tag each member.
BY_TYPE = Discriminator(type_name)
STRING, INTEGER, BOOLEAN = Tag("a string"), Tag("an integer"), Tag("a boolean")
LIST, OBJECT = Tag("a list"), Tag("an object")


def _not_null(value: object) -> object:
    if value is None:
        raise ValueError("must not be null; leave the field out for its default")
    return value


# A field that may be left out (None then), but not given as null: omission has a meaning, null is a typo.
Opt = Annotated[T | None, BeforeValidator(_not_null)]


def by_name(enum_type: type[E], *, upper: bool = False, any_case: bool = False, skip: Iterable[E] = ()) -> Any:
    """Annotation that takes an enum member by its name (lower-case unless `upper`), as files spell it."""
    names = {m.name if upper else m.name.lower(): m for m in enum_type if m not in set(skip)}

    def pick(value: object) -> object:
        key = value.lower() if any_case and isinstance(value, str) else value
        if isinstance(key, str) and key in names:
            return names[key]
        raise ValueError(one_of(list(names), value))

    return BeforeValidator(pick)


def one_of(choices: Sequence[str], value: object) -> str:
    """The message for a value outside a fixed set of choices."""
    return f"{_allowed(choices)}{',' if len(choices) == 1 else ';'} got {value!r}"


def _allowed(choices: Sequence[str]) -> str:
    return f"must be {choices[0]!r}" if len(choices) == 1 else f"must be one of {', '.join(choices)}"


def invalid(message: str, *loc: str | int) -> ValidationError:
    """A validator's problem at `loc` below the value it checks (pydantic prefixes the value's path)."""
    return rejected([(loc, message)])


def rejected(problems: Iterable[tuple[Loc, str]]) -> ValidationError:
    """Several problems one validator found, each at its `loc` below the value it checks."""
    return ValidationError.from_exception_data(
        "invalid", [{"type": "value_error", "loc": loc, "input": None, "ctx": {"error": m}} for loc, m in problems]
    )


# ---- decoding and messages ---------------------------------------------------------------------


class Decoder(Generic[T]):
    """Decodes plain data (parsed JSON or YAML) into `schema` strictly, or raises `error` (a DecodeError).

    `quoted_keys` writes map keys as `['key']` (JSON-path style) instead of `.key` (YAML style)."""

    def __init__(self, schema: Any, *, error: type[DecodeError] = DecodeError, quoted_keys: bool = False) -> None:
        self._schema = schema
        self._error = error
        self._quoted_keys = quoted_keys

    @functools.cached_property
    def _adapter(self) -> TypeAdapter[T]:
        return TypeAdapter(self._schema)

    def __call__(self, data: object, *, at: str = "", context: object = None) -> T:
        """`at` is the path of `data` in a larger document; `context` reaches validators as `info.context`."""
        try:
            return self._adapter.validate_python(data, context=context)
        except ValidationError as exc:
            errors = exc.errors()
            # pydantic measures a tuple after dropping its invalid items; the input was not short then.
            bad_items = {e["loc"][:i] for e in errors for i, part in enumerate(e["loc"]) if isinstance(part, int)}
            kept = [e for e in errors if not (e["type"] == "too_short" and e["loc"] in bad_items)] or errors
            raise self._error.of([self._problem(e, at) for e in kept]) from None

    def _problem(self, error: Mapping[str, Any], at: str) -> Problem:
        spot = _locate(self._schema, error["loc"], at, self._quoted_keys)
        kind, ctx, value = error["type"], error.get("ctx", {}), error["input"]
        if kind in ("union_tag_invalid", "union_tag_not_found"):
            return _union_problem(spot, ctx, value)
        return Problem(spot.path, _message(kind, ctx, value, spot) or error["msg"])


@dataclass(frozen=True)
class _Spot:
    """Where an error sits: its path text and, when the schema says, the type and field found there."""

    path: str
    type: Any = None
    model: type[BaseModel] | None = None  # the model whose field the path ends in
    field: FieldInfo | None = None


_MAPS = (dict, Mapping)
_SEQUENCES = (list, tuple, Sequence, set, frozenset)


def _locate(schema: Any, loc: Loc, at: str, quoted_keys: bool) -> _Spot:
    """Follow pydantic's `loc` through the schema, writing the path as users see it."""
    spot = _Spot(at, schema)
    for part in loc:
        here = _bare(spot.type)
        member = _member(here, part)
        if member is not None:  # pydantic names the union member it tried; users never wrote that
            spot = _Spot(spot.path, member, spot.model, spot.field)
        elif part == "[key]":  # the key itself of a map entry is wrong; the path already names it
            spot = _Spot(spot.path)
        elif isinstance(here, type) and issubclass(here, BaseModel):
            fields = {info.alias or name: info for name, info in here.model_fields.items()}
            field = fields.get(str(part))
            spot = _Spot(_join(spot.path, str(part)), field.annotation if field else None, here, field)
        elif get_origin(here) in _MAPS:
            path = f"{spot.path}[{part!r}]" if quoted_keys else f"{spot.path}.{part}"
            spot = _Spot(path, get_args(here)[1])
        elif get_origin(here) in _SEQUENCES:
            spot = _Spot(_join(spot.path, part), get_args(here)[0])
        else:
            spot = _Spot(_join(spot.path, part))
    return spot


def _join(path: str, part: str | int) -> str:
    if isinstance(part, int):
        return f"{path}[{part}]"
    return f"{path}.{part}" if path else part


def _bare(annotation: Any) -> Any:
    """The annotation without Annotated wrappers and without `| None`."""
    while True:
        if get_origin(annotation) is Annotated:
            annotation = get_args(annotation)[0]
        elif _is_union(annotation) and type(None) in get_args(annotation):
            rest = [a for a in get_args(annotation) if a is not type(None)]
            annotation = rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]  # noqa: UP007 - built at runtime
        else:
            return annotation


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (typing.Union, types.UnionType)


def _member(union: Any, part: str | int) -> Any:
    """The member of `union` that pydantic's loc `part` names (its tag, class name or literal kind)."""
    if not _is_union(union):
        return None
    return next((m for m in get_args(union) if part in _names(m)), None)


def _names(member: Any) -> set[str | int]:
    names: set[str | int] = {m.tag for m in getattr(member, "__metadata__", ()) if isinstance(m, Tag)}
    bare = _bare(member)
    if isinstance(bare, type) and issubclass(bare, BaseModel):
        names.add(bare.__name__)
        for info in bare.model_fields.values():
            if get_origin(_bare(info.annotation)) is Literal:
                names.update(get_args(_bare(info.annotation)))
    return names


def _choices(annotation: Any) -> list[str] | None:
    bare = _bare(annotation)
    if get_origin(bare) is Literal:
        return [str(v) for v in get_args(bare)]
    if isinstance(bare, type) and issubclass(bare, enum.Enum):
        return [str(m.value) for m in bare]
    return None


_EXPECTED = {
    "int_type": "an integer",
    "string_type": "a string",
    "bool_type": "a boolean",
    "float_type": "a number",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "list_type": "a list",
    "tuple_type": "a list",
    "set_type": "a list",
}
_BOUNDS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}


def _message(kind: str, ctx: Mapping[str, Any], value: Any, spot: _Spot) -> str | None:
    """Our words for one pydantic error; None keeps pydantic's own message."""
    # A field's description, where the schema gives one, says what the field holds when its shape is wrong.
    description = next((m.description for m in _metadata(spot) if isinstance(m, FieldInfo) and m.description), None)
    hint = f" ({description})" if description else ""
    if kind in _EXPECTED:
        return f"must be {_EXPECTED[kind]}, got {_described(value)}{hint}"
    if kind == "missing":
        choices = _choices(spot.type)
        return f"required field is missing{hint}" + (f"; {_allowed(choices)}" if choices else "")
    if kind == "extra_forbidden" and spot.model is not None:
        allowed = [info.alias or name for name, info in spot.model.model_fields.items()]
        return f"unknown field; allowed fields: {', '.join(allowed)}"
    if kind in ("literal_error", "enum") and (choices := _choices(spot.type)):
        return one_of(choices, value)
    if kind in _BOUNDS:
        low, high = _range(spot)
        noun = "a whole number " if type(value) is int and low is not None and low >= 0 else ""
        if low is not None and high is not None:
            return f"must be {noun}between {low} and {high}, got {value!r}{hint}"
        bound = next(iter(ctx.values()))
        bound = int(bound) if isinstance(bound, float) and bound.is_integer() else bound
        return f"must be {noun}{_BOUNDS[kind]} {bound}, got {value!r}{hint}"
    if kind == "too_short":
        n = ctx["min_length"]
        return f"needs at least {n} entr{'y' if n == 1 else 'ies'}{hint}"
    if kind == "too_long":
        n = ctx["max_length"]
        return f"takes at most {n} entr{'y' if n == 1 else 'ies'}{hint}"
    if kind == "invalid_key":
        return f"field names must be strings, got {_described(value)}"
    if kind == "string_too_short":
        return f"must not be empty{hint}"
    if kind in ("value_error", "assertion_error"):
        return str(ctx["error"])
    return None


def _metadata(spot: _Spot) -> list[Any]:
    """Everything the schema attaches at `spot`: the field's own and that of Annotated types inside it."""
    found: list[Any] = [spot.field, *spot.field.metadata] if spot.field is not None else []
    pending = [spot.type]
    while pending:
        annotation = pending.pop()
        if get_origin(annotation) is Annotated:
            found.extend(annotation.__metadata__)
            pending.append(get_args(annotation)[0])
        elif _is_union(annotation):
            pending.extend(get_args(annotation))
    return found + [m for info in found if isinstance(info, FieldInfo) for m in info.metadata]


def _range(spot: _Spot) -> tuple[Any, Any]:
    """The inclusive bounds (ge, le) the schema sets at `spot`; pydantic reports only the one crossed."""
    found = _metadata(spot)
    low = next((m.ge for m in found if getattr(m, "ge", None) is not None), None)
    high = next((m.le for m in found if getattr(m, "le", None) is not None), None)
    return low, high


def _union_problem(spot: _Spot, ctx: Mapping[str, Any], value: Any) -> Problem:
    members = get_args(_bare(spot.type))
    discriminator = str(ctx.get("discriminator", ""))
    if discriminator.startswith("'"):  # a field such as `kind` picks the member
        name = discriminator.strip("'")
        fields = [f for m in members for n, f in _bare(m).model_fields.items() if name in (n, f.alias)]
        kinds = [str(v) for f in fields for v in get_args(_bare(f.annotation))]
        path = _join(spot.path, name)
        if "tag" not in ctx:
            return Problem(path, f"required field is missing; {_allowed(kinds)}")
        return Problem(path, one_of(kinds, ctx["tag"]))
    tags = [str(m.tag) for member in members for m in getattr(member, "__metadata__", ()) if isinstance(m, Tag)]
    return Problem(spot.path, f"must be {' or '.join(tags)}, got {_described(value)}")


# ---- YAML ----------------------------------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys."""


def _mapping_without_duplicates(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Hashable] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, Hashable) and key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}: each key may appear once", key_node.start_mark
            )
        if isinstance(key, Hashable):
            seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def load_yaml(text: str) -> Any:
    """One YAML document as plain data; a duplicate key is a yaml.YAMLError naming key and line."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def load_yaml_all(text: str) -> list[Any]:
    """Every document of a YAML stream, as `load_yaml` reads one."""
    return list(yaml.load_all(text, Loader=_UniqueKeyLoader))
