"""The shared strict decoder: paths as users write them, messages in our words, YAML without duplicate keys."""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal, Self

import pytest
import yaml
from pydantic import Field, model_validator

from dra_driver.strictdecode import (
    BY_TYPE,
    OBJECT,
    STRING,
    CamelModel,
    DecodeError,
    Decoder,
    Items,
    Opt,
    StrictModel,
    by_name,
    load_yaml,
    load_yaml_all,
    rejected,
    type_name,
)


class Colour(enum.IntEnum):
    RED = 1
    GREEN = 2


class Inner(CamelModel):
    colour_name: Annotated[Colour, by_name(Colour)] = Colour.RED
    per_key: dict[str, int] = Field(default_factory=dict)


class Doc(StrictModel):
    name: Annotated[str, Field(description="what the thing is called")]
    count: Annotated[int, Field(ge=1, le=8)] = 1
    items: Annotated[Items[Annotated[int, Field(ge=0)]], Field(min_length=1)] = (0,)
    inner: Annotated[Annotated[Literal["none"], STRING] | Annotated[Inner, OBJECT], BY_TYPE] = "none"
    note: Opt[str] = None

    @model_validator(mode="after")
    def _count_fits_items(self) -> Self:
        if self.count < len(self.items):
            raise rejected([(("items", i), f"beyond count {self.count}") for i in range(self.count, len(self.items))])
        return self


def problems(data: Any, quoted_keys: bool = False) -> list[str]:
    with pytest.raises(DecodeError) as err:
        Decoder[Doc](Doc, quoted_keys=quoted_keys)(data, at="doc")
    return [str(p) for p in err.value.problems]


def test_a_valid_document_decodes_to_frozen_values() -> None:
    doc = Decoder[Doc](Doc)({"name": "x", "items": [1, 2], "count": 2, "inner": {"colourName": "green"}})
    assert doc.items == (1, 2) and isinstance(doc.inner, Inner) and doc.inner.colour_name is Colour.GREEN
    with pytest.raises(ValueError, match="frozen"):
        doc.name = "y"  # type: ignore[misc]  # the point: a frozen field refuses assignment


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({}, ["doc.name: required field is missing (what the thing is called)"]),
        ({"name": 5}, ["doc.name: must be a string, got an integer 5 (what the thing is called)"]),
        ({"name": "x", "count": True}, ["doc.count: must be an integer, got a boolean True"]),
        ({"name": "x", "count": 9}, ["doc.count: must be a whole number between 1 and 8, got 9"]),
        ({"name": "x", "colour": 1}, ["doc.colour: unknown field; allowed fields: name, count, items, inner, note"]),
        # A bad item is reported as such, not also as a list that is too short.
        ({"name": "x", "items": ["a"]}, ["doc.items[0]: must be an integer, got a string 'a'"]),
        ({"name": "x", "items": []}, ["doc.items: needs at least 1 entry"]),
        ({"name": "x", "inner": "some"}, ["doc.inner: must be 'none', got 'some'"]),
        ({"name": "x", "inner": [1]}, ["doc.inner: must be a string or an object, got a list"]),
        ({"name": "x", "inner": {"colourName": "blue"}}, ["doc.inner.colourName: must be one of red, green; got 'blue'"]),
        ({"name": "x", "inner": {"perKey": {"a b": "1"}}}, ["doc.inner.perKey.a b: must be an integer, got a string '1'"]),
        ({"name": "x", "note": None}, ["doc.note: must not be null; leave the field out for its default"]),
        ({"name": "x", "items": [0, 1, 2]}, ["doc.items[1]: beyond count 1", "doc.items[2]: beyond count 1"]),
        ({"name": "x", 3: 1}, ["doc.3: field names must be strings, got an integer 3"]),
        ([], ["doc: must be an object, got a list"]),
    ],
)
def test_problems_name_the_field_and_what_would_do(data: Any, expected: list[str]) -> None:
    assert problems(data) == expected


def test_map_keys_can_be_written_json_path_style() -> None:
    assert problems({"name": "x", "inner": {"perKey": {"a b": "1"}}}, quoted_keys=True) == [
        "doc.inner.perKey['a b']: must be an integer, got a string '1'"
    ]


def test_every_problem_is_kept_and_the_first_is_at_hand() -> None:
    with pytest.raises(DecodeError) as err:
        Decoder[Doc](Doc)({"count": 0, "note": None})
    assert (err.value.path, err.value.message) == ("name", "required field is missing (what the thing is called)")
    assert len(err.value.problems) == 3
    assert str(err.value) == "; ".join(str(p) for p in err.value.problems)


def test_type_name() -> None:
    values: tuple[object, ...] = (None, True, 1, 1.5, "", {}, [], ())
    assert [type_name(v) for v in values] == [
        "null", "a boolean", "an integer", "a number", "a string", "an object", "a list", "a list"
    ]


def test_yaml_refuses_duplicate_keys_at_any_depth() -> None:
    assert load_yaml("a: {b: 1, c: 2}") == {"a": {"b": 1, "c": 2}}
    with pytest.raises(yaml.YAMLError, match=r"duplicate key 'b': each key may appear once\n.*line 1"):
        load_yaml("a: {b: 1, b: 2}")
    with pytest.raises(yaml.YAMLError, match="duplicate key 'x'"):
        load_yaml_all("a: 1\n---\nx: 1\nx: 2\n")
    assert load_yaml_all("a: 1\n---\n---\nb: 2\n") == [{"a": 1}, None, {"b": 2}]
