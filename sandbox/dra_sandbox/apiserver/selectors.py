"""Label and field selectors with the apiserver's syntax and error behaviour.

Label selectors: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`, plus `a>1`/`a<1`.
Field selectors: `f=v`, `f==v`, `f!=v`, comma-joined, `\\` escapes; only labels the resource declares.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from dra_driver.k8s.names import is_label_value, is_qualified_name

from .registry import FieldLabel


class SelectorError(ValueError):
    """Unparseable or unsupported selector; the handler answers 400 BadRequest with this text."""


@dataclass(frozen=True)
class LabelRequirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key, "")
        if self.op in ("=", "in"):
            return has and value in self.values
        if self.op in ("!=", "notin"):
            return not has or value not in self.values
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        if not has:
            return False
        try:
            number, bound = int(value), int(self.values[0])
        except ValueError:
            return False
        return number > bound if self.op == "gt" else number < bound


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[LabelRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


_TOKEN_RE: Final = re.compile(r"\s*(==|!=|=|!|\(|\)|,|>|<|[^\s=!(),<>]+)")


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if not m:
            break
        out.append(m.group(1))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


def _check_key(key: str) -> str:
    if not is_qualified_name(key):
        raise SelectorError(f"unable to parse requirement: invalid label key {key!r}: must be a qualified name "
                            "such as app or example.com/app")
    return key


def _check_value(value: str) -> str:
    if not is_label_value(value):
        raise SelectorError(f"unable to parse requirement: invalid label value {value!r}: must be 63 characters "
                            "or less, alphanumeric, '-', '_' or '.', starting and ending alphanumeric")
    return value


def parse_label_selector(text: str | None) -> LabelSelector:
    if not text or not text.strip():
        return LabelSelector()
    toks = _tokens(text)
    reqs: list[LabelRequirement] = []
    i = 0

    def expect(tok: str) -> None:
        nonlocal i
        if i >= len(toks) or toks[i] != tok:
            found = toks[i] if i < len(toks) else "end of string"
            raise SelectorError(f"unable to parse requirement: found '{found}', expected: '{tok}'")
        i += 1

    while i < len(toks):
        if toks[i] == "!":
            i += 1
            if i >= len(toks):
                raise SelectorError("unable to parse requirement: found end of string, expected: identifier")
            reqs.append(LabelRequirement(_check_key(toks[i]), "!"))
            i += 1
        else:
            k = _check_key(toks[i])
            i += 1
            if i >= len(toks) or toks[i] == ",":
                reqs.append(LabelRequirement(k, "exists"))
            elif toks[i] in ("=", "==", "!="):
                op = "!=" if toks[i] == "!=" else "="
                i += 1
                value = ""
                if i < len(toks) and toks[i] != ",":
                    value = toks[i]
                    i += 1
                reqs.append(LabelRequirement(k, op, (_check_value(value),)))
            elif toks[i] in (">", "<"):
                op = "gt" if toks[i] == ">" else "lt"
                i += 1
                if i >= len(toks) or not re.fullmatch(r"-?\d+", toks[i]):
                    raise SelectorError(f"unable to parse requirement: for 'Gt', 'Lt' operators, the value must be "
                                        f"an integer (key {k!r})")
                reqs.append(LabelRequirement(k, op, (toks[i],)))
                i += 1
            elif toks[i] in ("in", "notin"):
                op = toks[i]
                i += 1
                expect("(")
                values: list[str] = []
                while i < len(toks) and toks[i] != ")":
                    if toks[i] == ",":
                        i += 1
                        continue
                    values.append(_check_value(toks[i]))
                    i += 1
                expect(")")
                if not values and op == "in":
                    raise SelectorError(f"unable to parse requirement: for 'in', 'notin' operators, values set "
                                        f"can't be empty (key {k!r})")
                reqs.append(LabelRequirement(k, op, tuple(values)))
            else:
                raise SelectorError(f"unable to parse requirement: found '{toks[i]}', expected: "
                                    "in, notin, =, ==, !=, gt, lt")
        if i < len(toks):
            expect(",")
            if i >= len(toks):
                raise SelectorError("unable to parse requirement: found end of string after ',', expected: "
                                    "identifier")
    return LabelSelector(tuple(reqs))


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
