"""Field selectors with the apiserver's syntax and error behaviour (label selectors: `labelselector`).

Field selectors: `f=v`, `f==v`, `f!=v`, comma-joined, `\\` escapes in values (apimachinery `pkg/fields/selector.go`);
only the labels the kind's conversion function serves in the reported version (fieldlabels.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from .fieldlabels import FieldLabel, FieldLabelRules, refusal
from .labelselector import SelectorError

__all__ = ["FieldRequirement", "FieldSelector", "SelectorError", "field_value", "parse_field_selector"]


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
