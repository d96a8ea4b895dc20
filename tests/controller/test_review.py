"""The webhook's front door on plain bytes (dra_driver.controller.review): the depth measured on the bytes is the
depth of the decoded value, whatever the strings hold; the path of a too-deep document."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from dra_driver.controller.review import MAX_DEPTH, deep_path, max_depth


def depth(value: Any) -> int:
    """The reference: recursion over the decoded value (the documents here are shallow)."""
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


TRICKY = [
    0, "x", None, {}, [], [[]], {"a": {"b": []}},
    {"s": "[[[{{{"}, {"s": "]]]}}}", "t": [1]}, {"s": '\\"[', "t": [[2]]}, {"s": "\\", "t": {"u": []}},
    {'k"[': ['"', "\\\\", '\\"]]]'], "z": [{"y": "é[ü]{"}]}, ["\u2028[", {"\\\\\\": [[["]"]]]}],
]


@pytest.mark.parametrize("value", TRICKY)
@pytest.mark.parametrize("ascii_only", [True, False])
def test_the_depth_on_the_bytes_is_the_decoded_depth(value: Any, ascii_only: bool) -> None:
    for raw in (json.dumps(value, ensure_ascii=ascii_only), json.dumps(value, ensure_ascii=ascii_only, indent=2)):
        assert max_depth(raw.encode()) == depth(value), raw


def test_random_documents() -> None:
    rng = random.Random(7)
    alphabet = '[]{}"\\,:ab é'

    def make(level: int) -> Any:
        roll = rng.random()
        if level > 6 or roll < 0.3:
            return "".join(rng.choice(alphabet) for _ in range(rng.randrange(6)))
        if roll < 0.65:
            return [make(level + 1) for _ in range(rng.randrange(4))]
        return {"".join(rng.choice(alphabet) for _ in range(3)): make(level + 1) for _ in range(rng.randrange(4))}

    for _ in range(500):
        value = make(0)
        assert max_depth(json.dumps(value, ensure_ascii=False).encode()) == depth(value)


def test_the_path_of_the_first_too_deep_container() -> None:
    inner: Any = {}
    for _ in range(MAX_DEPTH - 4):
        inner = {"a": inner}
    doc = {"request": {"object": {"small": [1, {"x": []}], "deep": [inner]}}}
    assert depth(doc) == MAX_DEPTH + 1
    assert deep_path(doc) == "request.object.deep[0]" + ".a" * (MAX_DEPTH - 4)
    assert deep_path(doc, limit=MAX_DEPTH + 1) == ""
    assert deep_path([[[]]], limit=2) == "[0][0]"
