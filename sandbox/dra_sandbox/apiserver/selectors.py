"""Field selectors with the apiserver's syntax and error behaviour (label selectors: `labelselector`).

Field selectors: `f=v`, `f==v`, `f!=v`, comma-joined, `\\` escapes; only labels the resource declares.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .labelselector import SelectorError
from .registry import FieldLabel

__all__ = ["FieldRequirement", "FieldSelector", "SelectorError", "field_value", "parse_field_selector"]


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    op: str  # "=" or "!="
    value: str


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def check_supported(self, supported: Iterable[str], resource: str) -> None:
        allowed = set(supported)
        for r in self.requirements:
            if r.field not in allowed:
                raise SelectorError(f'field label not supported: {r.field} (resource "{resource}" supports: '
                                    + ", ".join(sorted(allowed)) + ")")

    def matches(self, obj: Mapping[str, Any], labels: Mapping[str, FieldLabel]) -> bool:
        for r in self.requirements:
            actual = field_value(obj, r.field, labels)
            if (actual == r.value) != (r.op == "="):
                return False
        return True


def field_value(obj: Mapping[str, Any], name: str, labels: Mapping[str, FieldLabel]) -> str:
    if name in ("metadata.name", "metadata.namespace"):
        return str((obj.get("metadata") or {}).get(name.split(".")[1]) or "")
    label = labels[name]
    cur: Any = obj
    for part in label.path:
        if not isinstance(cur, Mapping) or part not in cur:
            return label.default
        cur = cur[part]
    if cur is None:
        return label.default
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts: list[str] = []
    buf: list[str] = []
    escaped = False
    for ch in text:
        if escaped:
            buf.append("\\" + ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == sep:
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
    if escaped:
        raise SelectorError("invalid field selector: trailing backslash")
    parts.append("".join(buf))
    return parts


def _unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            if text[i + 1] not in "\\,=!":
                raise SelectorError(f"invalid field selector: invalid escape sequence \\{text[i + 1]}")
            out.append(text[i + 1])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse_field_selector(text: str | None) -> FieldSelector:
    if not text or not text.strip():
        return FieldSelector()
    reqs: list[FieldRequirement] = []
    for term in _split_unescaped(text, ","):
        if not term:
            continue
        m = re.match(r"((?:[^=!\\]|\\.)+?)(==|!=|=)(.*)", term, re.S)
        if not m:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{term}'")
        op = "!=" if m.group(2) == "!=" else "="
        reqs.append(FieldRequirement(_unescape(m.group(1).strip()), op, _unescape(m.group(3))))
    return FieldSelector(tuple(reqs))
