"""Label selectors (`labelSelector=`) exactly as the apiserver parses and matches them.

The grammar, the token rules and every error text follow k8s.io/apimachinery `pkg/labels/selector.go`
(`Parse`, its lexer and `NewRequirement`), because a client that gets a selector through the sandbox must get
the same selector through a real cluster, and one a cluster refuses must be refused here with the same words:

    <selector>    ::= <requirement> | <requirement> "," <selector>
    <requirement> ::= [!] KEY [ ("in" | "notin") "(" VALUE {"," VALUE} ")" | ("=" | "==" | "!=" | ">" | "<") VALUE ]

- Whitespace is only space, tab, CR and LF; `=!(),<>` always end an identifier; `==` and `!=` are the only
  two-character operators; `in`/`notin` are operators only right after a key (`in in (in)` is valid).
- Keys are qualified names and values label values (63 characters, alphanumeric at both ends); an empty
  value is valid (`x=`, `x in ()`, `x in (a,)` all hold the value "").
- `>` and `<` take a base-10 int64 that is also a valid label value (so no sign); a label whose value is
  not such an integer never matches them.
- A NUL character ends the token it is in, and at the start of a token it ends the selector, as Go's lexer
  reads it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final

from dra_driver.k8s.names import label_value_problems, qualified_name_problems


class SelectorError(ValueError):
    """Unparseable or unsupported selector; the handler answers 400 BadRequest with this text."""


class _Tok(Enum):
    END = "end"
    IDENT = "identifier"
    CLOSE = ")"
    COMMA = ","
    NOT = "!"
    DOUBLE_EQUALS = "=="
    EQUALS = "="
    GREATER = ">"
    LESS = "<"
    NOT_EQUALS = "!="
    OPEN = "("
    IN = "in"
    NOT_IN = "notin"


_SYMBOLS: Final = {t.value: t for t in (_Tok.CLOSE, _Tok.COMMA, _Tok.NOT, _Tok.DOUBLE_EQUALS, _Tok.EQUALS,
                                        _Tok.GREATER, _Tok.LESS, _Tok.NOT_EQUALS, _Tok.OPEN)}
_KEYWORDS: Final = {"in": _Tok.IN, "notin": _Tok.NOT_IN}
_SPECIAL: Final = frozenset("=!(),<>")
_WHITESPACE: Final = frozenset(" \t\r\n")
_NUL: Final = "\x00"

# Operators by the names selection.Operator gives them (Gt/Lt are "gt"/"lt" there, and so in messages).
EQUALS: Final = "="
DOUBLE_EQUALS: Final = "=="
NOT_EQUALS: Final = "!="
IN: Final = "in"
NOT_IN: Final = "notin"
EXISTS: Final = "exists"
DOES_NOT_EXIST: Final = "!"
GREATER_THAN: Final = "gt"
LESS_THAN: Final = "lt"
_BINARY_OPERATORS: Final = (IN, NOT_IN, EQUALS, DOUBLE_EQUALS, NOT_EQUALS, GREATER_THAN, LESS_THAN)
_OPERATOR_OF: Final = {_Tok.IN: IN, _Tok.NOT_IN: NOT_IN, _Tok.EQUALS: EQUALS, _Tok.DOUBLE_EQUALS: DOUBLE_EQUALS,
                       _Tok.NOT_EQUALS: NOT_EQUALS, _Tok.GREATER: GREATER_THAN, _Tok.LESS: LESS_THAN}
_INT64_RE: Final = re.compile(r"[+-]?[0-9]+")  # strconv.ParseInt(s, 10, 64), before its range check
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


def parse_int64(text: str) -> int | None:
    """The value Go's strconv.ParseInt(text, 10, 64) gives, or None where it fails (no `_`, no spaces)."""
    if not _INT64_RE.fullmatch(text):
        return None
    number = int(text)
    return number if _INT64_MIN <= number <= _INT64_MAX else None


@dataclass(frozen=True)
class _Token:
    kind: _Tok
    text: str


def _lex(text: str) -> list[_Token]:
    """Every token up to and including END."""
    out: list[_Token] = []
    pos, size = 0, len(text)
    while True:
        while pos < size and text[pos] in _WHITESPACE:
            pos += 1
        if pos >= size or text[pos] == _NUL:
            out.append(_Token(_Tok.END, ""))
            return out
        if text[pos] in _SPECIAL:
            pair = text[pos:pos + 2]
            symbol = pair if pair in _SYMBOLS else text[pos]
            out.append(_Token(_SYMBOLS[symbol], symbol))
            pos += len(symbol)
            continue
        start = pos
        while pos < size and text[pos] not in _SPECIAL and text[pos] not in _WHITESPACE and text[pos] != _NUL:
            pos += 1
        word = text[start:pos]
        if pos < size and text[pos] == _NUL:
            pos += 1  # the NUL that ended the identifier is consumed with it
        out.append(_Token(_KEYWORDS.get(word, _Tok.IDENT), word))


@dataclass(frozen=True)
class LabelRequirement:
    key: str
    op: str  # one of the operator constants above
    values: tuple[str, ...] = ()  # sorted and unique, as sets.String.List() gives them

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key, "")
        if self.op in (EQUALS, DOUBLE_EQUALS, IN):
            return has and value in self.values
        if self.op in (NOT_EQUALS, NOT_IN):
            return not has or value not in self.values
        if self.op == EXISTS:
            return has
        if self.op == DOES_NOT_EXIST:
            return not has
        if not has or len(self.values) != 1:
            return False
        number, bound = parse_int64(value), parse_int64(self.values[0])
        if number is None or bound is None:
            return False
        return number > bound if self.op == GREATER_THAN else number < bound


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[LabelRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


def _quoted(value: str) -> str:
    """Go's %q of a string, for the ASCII text selectors hold (non-ASCII bytes are escaped as Go does)."""
    out = ['"']
    for ch in value:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif " " <= ch < "\x7f" or (ord(ch) > 0x9f and ch.isprintable()):
            out.append(ch)
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(f"\\u{ord(ch):04x}")
    out.append('"')
    return "".join(out)


def _invalid(path: str, value: str, detail: str) -> str:
    return f"{path}: Invalid value: {_quoted(value)}: {detail}"


def _requirement_errors(key: str, op: str, values: tuple[str, ...]) -> list[str]:
    """NewRequirement's checks past the key (the parser validated that already), in its order."""
    errs: list[str] = []
    if op in (GREATER_THAN, LESS_THAN):
        for i, v in enumerate(values):
            if parse_int64(v) is None:
                errs.append(_invalid(f"values[{i}]", v, "for 'Gt', 'Lt' operators, the value must be an integer"))
    for i, v in enumerate(values):
        problems = label_value_problems(v)
        if problems:
            errs.append(_invalid(f"values[{i}][{key}]", v, "; ".join(problems)))
    return errs


def _aggregate(errs: list[str]) -> str:
    """utilerrors.Aggregate's text: one message alone, several (duplicates dropped) in brackets."""
    unique = list(dict.fromkeys(errs))
    return unique[0] if len(unique) == 1 else "[" + ", ".join(unique) + "]"


class _Parser:
    def __init__(self, text: str) -> None:
        self._tokens = _lex(text)
        self._pos = 0

    def _peek(self, *, operator: bool = False) -> _Token:
        # Outside the operator position `in` and `notin` are plain identifiers (keys or values).
        return self._as_context(self._tokens[self._pos], operator)

    def _take(self, *, operator: bool = False) -> _Token:
        token = self._tokens[self._pos]
        self._pos += 1
        return self._as_context(token, operator)

    @staticmethod
    def _as_context(token: _Token, operator: bool) -> _Token:
        if not operator and token.kind in (_Tok.IN, _Tok.NOT_IN):
            return _Token(_Tok.IDENT, token.text)
        return token

    def parse(self) -> LabelSelector:
        reqs: list[LabelRequirement] = []
        while True:
            head = self._peek()
            if head.kind == _Tok.END:
                break
            if head.kind not in (_Tok.IDENT, _Tok.NOT):
                raise SelectorError(f"found '{head.text}', expected: !, identifier, or 'end of string'")
            try:
                reqs.append(self._requirement())
            except SelectorError as exc:
                raise SelectorError(f"unable to parse requirement: {exc}") from None
            after = self._take()
            if after.kind == _Tok.END:
                break
            if after.kind != _Tok.COMMA:
                raise SelectorError(f"found '{after.text}', expected: ',' or 'end of string'")
            following = self._peek()
            if following.kind not in (_Tok.IDENT, _Tok.NOT):
                raise SelectorError(f"found '{following.text}', expected: identifier after ','")
        return LabelSelector(tuple(sorted(reqs, key=lambda r: r.key)))

    def _requirement(self) -> LabelRequirement:
        token = self._take()
        negated = token.kind == _Tok.NOT
        if negated:
            token = self._take()
        if token.kind != _Tok.IDENT:
            raise SelectorError(f"found '{token.text}', expected: identifier")
        key = token.text
        problems = qualified_name_problems(key)
        if problems:
            raise SelectorError(_invalid("<nil>", key, "; ".join(problems)))
        if negated:
            return LabelRequirement(key, DOES_NOT_EXIST)
        if self._peek().kind in (_Tok.END, _Tok.COMMA):
            return LabelRequirement(key, EXISTS)
        op_token = self._take(operator=True)
        op = _OPERATOR_OF.get(op_token.kind)
        if op is None:
            raise SelectorError(f"found '{op_token.text}', expected: {', '.join(_BINARY_OPERATORS)}")
        values = self._value_set() if op in (IN, NOT_IN) else self._exact_value()
        errs = _requirement_errors(key, op, values)
        if errs:
            raise SelectorError(_aggregate(errs))
        return LabelRequirement(key, op, values)

    def _exact_value(self) -> tuple[str, ...]:
        if self._peek().kind in (_Tok.END, _Tok.COMMA):
            return ("",)
        token = self._take()
        if token.kind != _Tok.IDENT:
            raise SelectorError(f"found '{token.text}', expected: identifier")
        return (token.text,)

    def _value_set(self) -> tuple[str, ...]:
        token = self._take()
        if token.kind != _Tok.OPEN:
            raise SelectorError(f"found '{token.text}' expected: '('")
        first = self._peek()
        if first.kind == _Tok.CLOSE:
            self._take()
            return ("",)
        if first.kind not in (_Tok.IDENT, _Tok.COMMA):
            raise SelectorError(f"found '{first.text}', expected: ',', ')' or identifier")
        values = self._identifiers()
        if self._take().kind != _Tok.CLOSE:
            raise SelectorError(f"found '{first.text}', expected: ')'")
        return tuple(sorted(values))

    def _identifiers(self) -> set[str]:
        """A comma-separated list whose empty slots (`(,a)`, `(a,)`, `(a,,b)`) stand for the value ""."""
        values: set[str] = set()
        while True:
            token = self._take()
            if token.kind == _Tok.IDENT:
                values.add(token.text)
                nxt = self._peek()
                if nxt.kind == _Tok.CLOSE:
                    return values
                if nxt.kind != _Tok.COMMA:
                    raise SelectorError(f"found '{nxt.text}', expected: ',' or ')'")
            elif token.kind == _Tok.COMMA:
                if not values:
                    values.add("")
                nxt = self._peek()
                if nxt.kind == _Tok.CLOSE:
                    values.add("")
                    return values
                if nxt.kind == _Tok.COMMA:
                    self._take()
                    values.add("")
            else:
                raise SelectorError(f"found '{token.text}', expected: ',', or identifier")


def parse_label_selector(text: str | None) -> LabelSelector:
    """The selector `text` means, or SelectorError with the apiserver's message (its 400 BadRequest text)."""
    return _Parser(text or "").parse()
