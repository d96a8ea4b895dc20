"""Narrowing for tests: a value typed optional that the test knows is there."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def present(value: T | None) -> T:
    """`value`, which the test expects to be set; a None fails the test here instead of later on None.attr."""
    assert value is not None, "expected a value, got None"
    return value
