"""Which parts of `device` a compiled selector can read, found on its parse tree (pure, no evaluation).

A DRA selector's result depends only on the device fields it reads. Most devices of one product share every
attribute but their uuid/index/PCI address, and the chart's selectors read `device.driver` and one `type`
attribute, so caching results by the values actually read turns thousands of evaluations into a handful.

The analysis is conservative: anything it does not recognise as a constant path rooted at `device`
(a bare `device`, `device.attributes` as a whole, a computed index, a macro that rebinds `device`, ...)
makes the selector uncacheable (`None`), and it is evaluated for every device as before.
"""

from __future__ import annotations

import re
from typing import Any, Final

# ("driver",) | ("allowMultipleAllocations",) | ("attributes"|"capacity", domain) | (.., domain, id)
Read = tuple[str, ...]

_SIMPLE_STRING: Final = re.compile(r"""^(['"])([^'"\\\n\r]*)\1$""")
_SCALARS: Final = frozenset({"driver", "allowMultipleAllocations"})
_MAPS: Final = frozenset({"attributes", "capacity"})


class _Uncacheable(Exception):
    pass


def _rule(node: Any) -> str | None:
    data = getattr(node, "data", None)
    return str(data) if data is not None else None


def _string_constant(expr: Any) -> str | None:
    """The value of an index expression that is a plain string literal ('x' or "x"), else None."""
    node = expr
    while True:
        children = getattr(node, "children", None)
        if children is None or len(children) != 1:
            return None
        child = children[0]
        if _rule(node) == "literal":
            kind = getattr(child, "type", None)
            match = _SIMPLE_STRING.match(str(child)) if kind == "STRING_LIT" else None
            return match.group(2) if match else None
        node = child


def _device_path(member: Any) -> list[str] | None:
    """The steps of a `member` chain rooted at the identifier `device`, or None when not rooted there.
    Raises _Uncacheable for a chain rooted at `device` with a computed index."""
    children: Any = getattr(member, "children", ())
    if _rule(member) != "member" or len(children) != 1:
        return None
    inner = children[0]
    rule = _rule(inner)
    if rule == "primary":
        ident = inner.children[0] if len(inner.children) == 1 else None
        if _rule(ident) == "ident" and [str(t) for t in getattr(ident, "children", ())] == ["device"]:
            return []
        return None
    if rule == "member_dot" and len(inner.children) == 2:
        path = _device_path(inner.children[0])
        return None if path is None else [*path, str(inner.children[1])]
    if rule == "member_index" and len(inner.children) == 2:
        path = _device_path(inner.children[0])
        if path is None:
            return None
        key = _string_constant(inner.children[1])
        if key is None:
            raise _Uncacheable
        return [*path, key]
    return None


def _to_read(path: list[str]) -> Read:
    if not path:
        raise _Uncacheable  # `device` itself
    head = path[0]
    if head in _SCALARS and len(path) == 1:
        return (head,)
    if head in _MAPS and len(path) >= 2:
        return tuple(path[:3])  # what follows the id operates on the value, which the key holds
    raise _Uncacheable


def selector_reads(tree: Any) -> tuple[Read, ...] | None:
    """The device paths the expression reads, or None when the result may depend on more than those."""
    reads: set[Read] = set()
    try:
        stack = [tree]
        while stack:
            node = stack.pop()
            if _rule(node) == "member":
                path = _device_path(node)
                if path is not None:
                    reads.add(_to_read(path))
                    continue
            if _rule(node) == "ident" and [str(t) for t in node.children] == ["device"]:
                raise _Uncacheable  # `device` outside a member chain we understand
            stack.extend(c for c in getattr(node, "children", ()) if _rule(c) is not None)
    except _Uncacheable:
        return None
    return tuple(sorted(reads))
