"""Which parts of `device` a compiled selector can read, found on its parse tree (pure, no evaluation).

A DRA selector's result depends only on the device fields it reads. Most devices of one product share every
attribute but their uuid/index/PCI address, and the chart's selectors read `device.driver` and one `type`
attribute, so caching results by the values actually read turns thousands of evaluations into a handful.

The analysis is conservative: anything it does not recognise as a constant path rooted at `device`
(a bare `device`, `device.attributes` as a whole, a computed index, a macro that rebinds `device`, ...)
makes the selector uncacheable (`None`), and it is evaluated for every device as before.
"""

from __future__ import annotations

from typing import Final

from dra_driver.cel.syntax import Bind, Comprehension, Expr, Has, Ident, Index, Literal, OptMap, Select, children

# ("driver",) | ("allowMultipleAllocations",) | ("attributes"|"capacity", domain) | (.., domain, id)
Read = tuple[str, ...]

_SCALARS: Final = frozenset({"driver", "allowMultipleAllocations"})
_MAPS: Final = frozenset({"attributes", "capacity"})


class _Uncacheable(Exception):
    pass


def _device_path(node: Expr) -> list[str] | None:
    """The steps of a select/index chain rooted at the identifier `device`, or None when not rooted there.
    Raises _Uncacheable for a chain rooted at `device` with a computed index."""
    if isinstance(node, Ident):
        return [] if node.name == "device" else None
    if isinstance(node, Select):
        path = _device_path(node.operand)
        return None if path is None else [*path, node.field]
    if isinstance(node, Index):
        path = _device_path(node.operand)
        if path is None:
            return None
        if not (isinstance(node.index, Literal) and isinstance(node.index.value, str)):
            raise _Uncacheable
        return [*path, node.index.value]
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


def selector_reads(tree: Expr) -> tuple[Read, ...] | None:
    """The device paths the expression reads, or None when the result may depend on more than those."""
    reads: set[Read] = set()
    try:
        stack = [tree]
        while stack:
            node = stack.pop()
            if isinstance(node, Comprehension) and "device" in (node.var, node.var2):
                raise _Uncacheable  # rebinds `device`
            if isinstance(node, Bind | OptMap) and node.var == "device":
                raise _Uncacheable
            if isinstance(node, Select | Index):
                path = _device_path(node)
                if path is not None:
                    reads.add(_to_read(path))
                    if isinstance(node, Index):
                        continue
                    continue
            if isinstance(node, Has):
                path = _device_path(node.operand)
                if path is not None:
                    reads.add(_to_read([*path, node.field]))
                    continue
            if isinstance(node, Ident) and node.name == "device":
                raise _Uncacheable  # `device` outside a member chain we understand
            stack.extend(children(node))
    except _Uncacheable:
        return None
    return tuple(sorted(reads))
