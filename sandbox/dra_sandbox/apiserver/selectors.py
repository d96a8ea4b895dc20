"""Label and field selectors with the apiserver's syntax and error behaviour.

Label selectors: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`, plus `a>1`/`a<1`.
Field selectors: `f=v`, `f==v`, `f!=v`, comma-joined, `\\` escapes in values (apimachinery `pkg/fields/selector.go`);
only the labels the kind's conversion function serves in the reported version (fieldlabels.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from dra_driver.k8s.names import is_label_value, is_qualified_name

from .fieldlabels import FieldLabel, FieldLabelRules, refusal


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
    op: str  # "=" or "!=" ("==" reads as "=")
    value: str
    written: str = ""  # the operator as the client wrote it: "=", "==" or "!="


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def check_supported(self, rules: FieldLabelRules, minor: int, *, group: str, version: str, kind: str) -> None:
        """Refuse, as the kind's field label conversion does, the first term (in upstream's sorted order) naming
        a label this Kubernetes minor does not serve."""
        supported = set(rules.supported(minor))
        for r in self.requirements:
            if r.field not in supported:
                raise SelectorError(refusal(rules, r.field, group=group, version=version, kind=kind))

    def matches(self, obj: Mapping[str, Any], labels: Mapping[str, FieldLabel]) -> bool:
        for r in self.requirements:
            actual = field_value(obj, r.field, labels)
            if (actual == r.value) != (r.op == "="):
                return False
        return True

    @property
    def empty(self) -> bool:
        return not self.requirements


def field_value(obj: Mapping[str, Any], name: str, labels: Mapping[str, FieldLabel]) -> str:
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


# apimachinery pkg/fields/selector.go: at each position "!=" is tried before "==" before "=".
_FIELD_OPERATORS: Final = ("!=", "==", "=")


def _split_terms(text: str) -> list[str]:
    """Split on commas a backslash does not escape; escapes stay in the terms (splitTerms)."""
    terms: list[str] = []
    start, escaped = 0, False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ",":
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def _split_term(term: str) -> tuple[str, str, str] | None:
    """The first operator splits the term; the left side takes no escapes and is not trimmed (splitTerm)."""
    for i in range(len(term)):
        for op in _FIELD_OPERATORS:
            if term.startswith(op, i):
                return term[:i], op, term[i + len(op):]
    return None


def _unescape_value(text: str) -> str:
    r"""UnescapeValue: `\\`, `\,` and `\=` are the only escapes; a bare `,` or `=` is refused."""
    if not any(c in text for c in "\\,="):
        return text
    out: list[str] = []
    escaped = False
    for ch in text:
        if escaped:
            if ch not in "\\,=":
                raise SelectorError(f"invalid field selector: invalid escape sequence: \\{ch}")
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in ",=":
            # Go formats the rune with %v: its code point.
            raise SelectorError(f"invalid field selector: unescaped character in value: {ord(ch)}")
        else:
            out.append(ch)
    if escaped:
        raise SelectorError("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


def parse_field_selector(text: str | None) -> FieldSelector:
    """A `fieldSelector` as apimachinery's ParseSelector reads it: terms sorted, `=`, `==` and `!=` only."""
    if not text:
        return FieldSelector()
    reqs: list[FieldRequirement] = []
    for term in sorted(_split_terms(text)):
        if not term:
            continue
        split = _split_term(term)
        if split is None:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{term}'")
        lhs, op, rhs = split
        reqs.append(FieldRequirement(lhs, "!=" if op == "!=" else "=", _unescape_value(rhs), op))
    return FieldSelector(tuple(reqs))
