"""The fake NVML's hand-written reader (nvml/fake/docread.py) speaks strictdecode's words, so a node file reads the
same as the product's pydantic-decoded documents; and its rules: strict types, null is not "left out", every
problem at once."""

from __future__ import annotations

import pytest

from dra_driver import strictdecode
from dra_driver.nvml.fake import docread
from dra_driver.nvml.fake.docread import NON_NEGATIVE, Field, Rejected, by_type, choice, fields, integer, items

VALUES: list[object] = [None, True, 0, 7, 1.5, "", "x", "a" * 50, {}, {"a": 1}, [], [1], (1,)]


@pytest.mark.parametrize("value", VALUES)
def test_values_are_named_in_strictdecodes_words(value: object) -> None:
    assert docread._type_name(value) == strictdecode.type_name(value)
    assert docread._described(value) == strictdecode._described(value)


@pytest.mark.parametrize("choices", [["on"], ["none", "nvswitch", "direct"]])
def test_choices_are_named_in_strictdecodes_words(choices: list[str]) -> None:
    assert docread._one_of(choices, "mesh") == strictdecode.one_of(choices, "mesh")


SPEC = (
    Field("count", integer(1, 8), 1),
    Field("name", docread.NON_EMPTY, None, opt=True),
    Field("kind", choice("a", "b"), choices=("a", "b")),
    Field("ids", items(NON_NEGATIVE), ()),
    Field("numa", by_type(an_integer=NON_NEGATIVE, a_list=items(NON_NEGATIVE)), None, opt=True),
)


def _problems(value: object) -> list[str]:
    with pytest.raises(Rejected) as err:
        fields(value, "doc", SPEC)
    return [str(p) for p in err.value.problems]


def test_defaults_fill_in_and_values_are_frozen() -> None:
    assert fields({"kind": "a", "ids": [3, 1]}, "doc", SPEC) == {
        "count": 1, "name": None, "kind": "a", "ids": (3, 1), "numa": None,
    }  # fmt: skip


def test_every_problem_of_an_object_is_reported_at_once_in_field_order() -> None:
    assert _problems({"count": True, "name": None, "ids": [1, -1, "2"], "numa": "x", "colour": 1}) == [
        "doc.count: must be an integer, got a boolean True",
        "doc.name: must not be null; leave the field out for its default",
        "doc.kind: required field is missing; must be one of a, b",
        "doc.ids[1]: must be a whole number >= 0, got -1",
        "doc.ids[2]: must be an integer, got a string '2'",
        "doc.numa: must be an integer or a list, got a string 'x'",
        "doc.colour: unknown field; allowed fields: count, name, kind, ids, numa",
    ]


def test_ranges_and_types_of_the_whole_value() -> None:
    assert _problems({"kind": "c", "count": 9}) == [
        "doc.count: must be a whole number between 1 and 8, got 9",
        "doc.kind: must be one of a, b; got 'c'",
    ]
    assert _problems([]) == ["doc: must be an object, got a list"]
