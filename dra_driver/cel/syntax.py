"""CEL source text -> syntax tree (pure). Follows the CEL language definition (cel-spec `doc/langdef.md`)
and the parser macros of cel-go (`parser/macro.go`, `ext/bindings.go`, `ext/comprehensions.go`,
`ext/lists.go` sortBy, optional types' optMap/optFlatMap) as used by Kubernetes' DRA environment.

Macros are expanded here, as cel-go's parser does, into `Comprehension` nodes (or `Bind`, `Has`), so the
checker and the evaluator see one shape per construct.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Final, TypeVar

__all__ = [
    "Bind",
    "Call",
    "Comprehension",
    "CreateList",
    "CreateMap",
    "Expr",
    "Has",
    "Ident",
    "Index",
    "Literal",
    "Select",
    "SyntaxIssue",
    "UInt",
    "parse",
]

MAX_NESTING: Final = 250  # cel-go's default parser recursion limit


class UInt(int):
    """A CEL `uint` value (Python's int with a distinct type, so `1u` and `1` keep their CEL types)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"{int(self)}u"


@dataclass(frozen=True)
class SyntaxIssue(Exception):
    """A parse error at a 0-based offset into the expression."""

    message: str
    offset: int


# -- syntax tree ---------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Expr:
    offset: int


@dataclass(frozen=True, eq=False)
class Literal(Expr):
    value: object  # int | UInt | float | bool | str | bytes | None


@dataclass(frozen=True, eq=False)
class Ident(Expr):
    name: str


@dataclass(frozen=True, eq=False)
class Select(Expr):
    operand: Expr
    field: str
    optional: bool = False  # a.?b


@dataclass(frozen=True, eq=False)
class Index(Expr):
    operand: Expr
    index: Expr
    optional: bool = False  # a[?b]


@dataclass(frozen=True, eq=False)
class Call(Expr):
    function: str  # operators use cel-go's names: _+_, _==_, !_, -_, _?_:_, _&&_, _||_, @in, _[_]
    args: tuple[Expr, ...]
    target: Expr | None = None  # receiver of a member call


@dataclass(frozen=True, eq=False)
class CreateList(Expr):
    elements: tuple[Expr, ...]
    optional_indices: frozenset[int] = frozenset()


@dataclass(frozen=True, eq=False)
class CreateMap(Expr):
    entries: tuple[tuple[Expr, Expr, bool], ...]  # key, value, optional entry


@dataclass(frozen=True, eq=False)
class Has(Expr):
    operand: Expr
    field: str


@dataclass(frozen=True, eq=False)
class Bind(Expr):
    """cel.bind(var, init, body)."""

    var: str
    init: Expr
    body: Expr


@dataclass(frozen=True, eq=False)
class Comprehension(Expr):
    """A macro over a list or map. `kind` names the macro: all, exists, exists_one, map, filter (one iteration
    variable); all2, exists2, existsOne2, transformList, transformMap, transformMapEntry (two variables);
    sortBy. `predicate` is the condition (or None), `transform` the value computed (or None)."""

    kind: str
    range_: Expr
    var: str
    var2: str | None
    predicate: Expr | None
    transform: Expr | None = None


@dataclass(frozen=True, eq=False)
class OptMap(Expr):
    """optional.optMap(var, expr) / optFlatMap(var, expr)."""

    operand: Expr
    var: str
    body: Expr
    flat: bool


def children(node: Expr) -> list[Expr]:
    """The sub-expressions directly below `node`, in field order (a map entry's key, then its value)."""
    out: list[Expr] = []
    for f in fields(node):
        value = getattr(node, f.name)
        if isinstance(value, Expr):
            out.append(value)
        elif isinstance(value, tuple):
            for item in value:
                if isinstance(item, Expr):
                    out.append(item)
                elif isinstance(item, tuple):
                    out.extend(x for x in item if isinstance(x, Expr))
    return out


# -- lexer ---------------------------------------------------------------------------------------

_RESERVED: Final = frozenset({
    "as", "break", "const", "continue", "else", "for", "function", "if", "import", "let", "loop", "package",
    "namespace", "return", "var", "void", "while",
})
_TOKEN: Final = re.compile(
    r"""
    (?P<ws>[ \t\n\r\f]+|//[^\n]*)
  | (?P<float>(?:\d+\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\.\d+(?:[eE][+-]?\d+)?))
  | (?P<hex>0[xX][0-9a-fA-F]+[uU]?)
  | (?P<int>\d+[uU]?)
  | (?P<string>(?:[rR][bB]?|[bB][rR]?)?(?:\"\"\"|'''|\"|'))
  | (?P<ident>[_a-zA-Z][_a-zA-Z0-9]*)
  | (?P<op>\|\||&&|==|!=|<=|>=|\.\?|\[\?|[-+*/%!<>?:.,\[\](){}])
    """,
    re.VERBOSE,
)
_SIMPLE_ESCAPES: Final = {
    "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
    "\\": "\\", "'": "'", '"': '"', "`": "`", "?": "?",
}


@dataclass(frozen=True)
class _ByteEscape:
    """An escape of four characters, backslash included: a byte (bytes literal) or a code point below 256 (string)."""

    digits: int  # how many of its last characters are the number
    pattern: re.Pattern[str]  # what they must be
    base: int
    name: str  # in the error


_BYTE_ESCAPES: Final = {
    **dict.fromkeys("xX", _ByteEscape(2, re.compile("[0-9a-fA-F]{2}"), 16, "\\x")),
    **dict.fromkeys("0123", _ByteEscape(3, re.compile("[0-3][0-7]{2}"), 8, "octal")),
}


@dataclass(frozen=True)
class _Token:
    kind: str  # float | int | uint | string | bytes | ident | op | eof
    text: str
    offset: int
    value: object = None


def _unescape(body: str, offset: int, is_bytes: bool) -> str | bytes:
    chars: list[str] = []
    raw: list[int] = []

    def emit(text: str) -> None:
        if is_bytes:
            raw.extend(text.encode("utf-8"))
        else:
            chars.append(text)

    def emit_code(code: int) -> None:
        """A _BYTE_ESCAPES escape: a byte of a bytes literal, a code point of a string."""
        if is_bytes:
            raw.append(code)
        else:
            chars.append(chr(code))

    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            emit(c)
            i += 1
            continue
        if i + 1 >= len(body):
            raise SyntaxIssue("Syntax error: invalid escape sequence at end of string", offset + i)
        e = body[i + 1]
        if e in _SIMPLE_ESCAPES:
            emit(_SIMPLE_ESCAPES[e])
            i += 2
        elif e in _BYTE_ESCAPES:
            escape = _BYTE_ESCAPES[e]
            digits = body[i + 4 - escape.digits : i + 4]
            if not escape.pattern.fullmatch(digits):
                raise SyntaxIssue(f"Syntax error: invalid {escape.name} escape", offset + i)
            emit_code(int(digits, escape.base))
            i += 4
        elif e in "uU":
            n = 4 if e == "u" else 8
            digits = body[i + 2 : i + 2 + n]
            if is_bytes or not re.fullmatch(rf"[0-9a-fA-F]{{{n}}}", digits):
                raise SyntaxIssue(f"Syntax error: invalid \\{e} escape", offset + i)
            code = int(digits, 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise SyntaxIssue(f"Syntax error: invalid unicode code point \\{e}{digits}", offset + i)
            chars.append(chr(code))
            i += 2 + n
        else:
            raise SyntaxIssue(f"Syntax error: invalid escape sequence \\{e}", offset + i)
    return bytes(raw) if is_bytes else "".join(chars)


def _tokens(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise SyntaxIssue(f"Syntax error: token recognition error at: '{text[pos]}'", pos)
        kind = m.lastgroup
        assert kind is not None
        if kind == "ws":
            pos = m.end()
            continue
        if kind == "string":
            opener = m.group(kind)
            prefix = opener.rstrip("'\"")
            quote = opener[len(prefix) :]
            is_raw = "r" in prefix.lower()
            is_bytes = "b" in prefix.lower()
            start = m.end()
            i = start
            while True:
                if i >= len(text):
                    raise SyntaxIssue("Syntax error: unterminated string literal", pos)
                if text.startswith(quote, i):
                    break
                if len(quote) == 1 and text[i] in "\n\r":
                    raise SyntaxIssue("Syntax error: newline in string literal", i)
                i += 2 if (text[i] == "\\" and not is_raw) or (text[i] == "\\" and is_raw and i + 1 < len(text)
                                                               and text[i + 1] == quote[0]) else 1
            body = text[start:i]
            if is_raw:
                value: object = body.encode("utf-8") if is_bytes else body
            else:
                value = _unescape(body, start, is_bytes)
            tokens.append(_Token("bytes" if is_bytes else "string", text[pos : i + len(quote)], pos, value))
            pos = i + len(quote)
            continue
        lexeme = m.group(kind)
        if kind == "float":
            tokens.append(_Token("float", lexeme, pos, float(lexeme)))
        elif kind in ("int", "hex"):
            unsigned = lexeme[-1] in "uU"
            digits = lexeme[:-1] if unsigned else lexeme
            number = int(digits, 16) if kind == "hex" else int(digits)
            if unsigned:
                if number > 2**64 - 1:
                    raise SyntaxIssue(f"invalid uint literal: {lexeme}", pos)
                tokens.append(_Token("uint", lexeme, pos, UInt(number)))
            else:
                if number > 2**63:  # 2**63 is allowed only negated; checked by the parser
                    raise SyntaxIssue(f"invalid int literal: {lexeme}", pos)
                tokens.append(_Token("int", lexeme, pos, number))
        else:
            tokens.append(_Token(kind, lexeme, pos))
        pos = m.end()
    tokens.append(_Token("eof", "<EOF>", len(text)))
    return tokens


# -- parser --------------------------------------------------------------------------------------

_RELATIONS: Final = {"<": "_<_", "<=": "_<=_", ">": "_>_", ">=": "_>=_", "==": "_==_", "!=": "_!=_", "in": "@in"}
_ADDITIVE: Final = {"+": "_+_", "-": "_-_"}
_MULTIPLICATIVE: Final = {"*": "_*_", "/": "_/_", "%": "_%_"}
# The binary operators by precedence, lowest first.
_PRECEDENCE: Final = ({"||": "_||_"}, {"&&": "_&&_"}, _RELATIONS, _ADDITIVE, _MULTIPLICATIVE)
_E = TypeVar("_E")  # an element of a list or map literal as parsed


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.pos = 0
        self.depth = 0

    # token helpers
    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.pos + ahead, len(self.tokens) - 1)]

    def at(self, text: str) -> bool:
        tok = self.peek()
        return tok.kind in ("op", "ident") and tok.text == text

    def take(self) -> _Token:
        tok = self.tokens[self.pos]
        self.pos = min(self.pos + 1, len(self.tokens) - 1)
        return tok

    def expect(self, text: str) -> _Token:
        tok = self.peek()
        if not self.at(text):
            raise self.unexpected(tok, f"expecting '{text}'")
        return self.take()

    def unexpected(self, tok: _Token, wanted: str = "") -> SyntaxIssue:
        what = "<EOF>" if tok.kind == "eof" else tok.text
        suffix = f" {wanted}" if wanted else ""
        return SyntaxIssue(f"Syntax error: mismatched input '{what}'{suffix}", tok.offset)

    def nest(self, offset: int) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise SyntaxIssue(f"Syntax error: expression recursion limit exceeded: {MAX_NESTING}", offset)

    # grammar
    def parse(self) -> Expr:
        expr = self.expr()
        tok = self.peek()
        if tok.kind != "eof":
            raise SyntaxIssue(f"Syntax error: extraneous input '{tok.text}' expecting <EOF>", tok.offset)
        return expr

    def expr(self) -> Expr:
        self.nest(self.peek().offset)
        try:
            cond = self.binary()
            if self.at("?"):
                q = self.take()
                yes = self.binary()
                self.expect(":")
                no = self.expr()
                return Call(q.offset, "_?_:_", (cond, yes, no))
            return cond
        finally:
            self.depth -= 1

    def binary(self, level: int = 0) -> Expr:
        """The binary operators from `level` of _PRECEDENCE down, each level left-associative. One frame a level,
        as a method a level had, so that nesting reaches as deep before Python's recursion limit."""
        operators = _PRECEDENCE[level]
        last = level == len(_PRECEDENCE) - 1
        left = self.unary() if last else self.binary(level + 1)
        while (tok := self.peek()).kind in ("op", "ident") and tok.text in operators:
            self.take()
            right = self.unary() if last else self.binary(level + 1)
            left = Call(tok.offset, operators[tok.text], (left, right))
        return left

    def unary(self) -> Expr:
        tok = self.peek()
        if tok.kind == "op" and tok.text in ("!", "-"):
            ops: list[_Token] = []
            while self.peek().kind == "op" and self.peek().text == tok.text:
                ops.append(self.take())
            if tok.text == "-":
                nxt = self.peek()
                if nxt.kind in ("int", "float") and not self._continues_member(1):
                    self.take()
                    value: object = -nxt.value  # type: ignore[operator]
                    ops.pop()
                    operand: Expr = Literal(tok.offset, value)
                    if isinstance(value, int) and value < -(2**63):
                        raise SyntaxIssue(f"invalid int literal: -{nxt.text}", tok.offset)
                else:
                    operand = self.member()
            else:
                operand = self.member()
            for op in reversed(ops):
                operand = Call(op.offset, "!_" if op.text == "!" else "-_", (operand,))
            return operand
        return self.member()

    def _continues_member(self, ahead: int) -> bool:
        nxt = self.peek(ahead)
        return nxt.kind == "op" and nxt.text in (".", "[", ".?", "[?")

    def member(self) -> Expr:
        expr = self.primary()
        while True:
            tok = self.peek()
            if tok.kind != "op":
                return expr
            if tok.text in (".", ".?"):
                self.take()
                name_tok = self.take()
                if name_tok.kind != "ident":
                    raise self.unexpected(name_tok, "expecting IDENTIFIER")
                name = name_tok.text
                if tok.text == "." and self.at("("):
                    self.take()
                    args = self.args(")")
                    expr = self.member_call(expr, name, args, name_tok.offset)
                else:
                    expr = Select(tok.offset, expr, name, optional=tok.text == ".?")
            elif tok.text in ("[", "[?"):
                self.take()
                index = self.expr()
                self.expect("]")
                expr = Index(tok.offset, expr, index, optional=tok.text == "[?")
            else:
                return expr

    def args(self, closer: str) -> list[Expr]:
        args: list[Expr] = []
        if self.at(closer):
            self.take()
            return args
        while True:
            args.append(self.expr())
            if self.at(","):
                self.take()
                continue
            self.expect(closer)
            return args

    def primary(self) -> Expr:
        tok = self.peek()
        if tok.kind in ("int", "uint", "float", "string", "bytes"):
            self.take()
            if tok.kind == "int" and isinstance(tok.value, int) and tok.value >= 2**63:
                raise SyntaxIssue(f"invalid int literal: {tok.text}", tok.offset)
            return Literal(tok.offset, tok.value)
        if tok.kind == "ident":
            self.take()
            if tok.text in ("true", "false"):
                return Literal(tok.offset, tok.text == "true")
            if tok.text == "null":
                return Literal(tok.offset, None)
            if tok.text == "in":
                raise self.unexpected(tok)
            if tok.text in _RESERVED:
                raise SyntaxIssue(f"reserved identifier: {tok.text}", tok.offset)
            if self.at("("):
                self.take()
                return self.global_call(tok.text, self.args(")"), tok.offset)
            if self.at("{"):
                raise SyntaxIssue(f"undeclared reference to '{tok.text}' (in container '')", tok.offset)
            return Ident(tok.offset, tok.text)
        if tok.kind == "op":
            if tok.text == ".":
                self.take()
                ident = self.take()
                if ident.kind != "ident":
                    raise self.unexpected(ident, "expecting IDENTIFIER")
                if self.at("("):
                    self.take()
                    return self.global_call(ident.text, self.args(")"), ident.offset)
                return Ident(ident.offset, ident.text)
            if tok.text == "(":
                self.take()
                inner = self.expr()
                self.expect(")")
                return inner
            if tok.text in ("[", "[?"):
                return self.list_literal()
            if tok.text == "{":
                return self.map_literal()
        raise self.unexpected(tok)

    def list_literal(self) -> Expr:
        start = self.take()
        first_optional = start.text == "[?"  # one token: the first element is optional
        if not first_optional and self.at("]"):
            self.take()
            return CreateList(start.offset, ())

        def element() -> tuple[Expr, bool]:
            nonlocal first_optional
            optional = first_optional or self._optional_mark()
            first_optional = False
            return self.expr(), optional

        elements = self._elements("]", element)
        return CreateList(start.offset, tuple(e for e, _ in elements),
                          frozenset(i for i, (_, optional) in enumerate(elements) if optional))

    def map_literal(self) -> Expr:
        start = self.take()
        if self.at("}"):
            self.take()
            return CreateMap(start.offset, ())

        def entry() -> tuple[Expr, Expr, bool]:
            optional = self._optional_mark()
            key = self.expr()
            self.expect(":")
            return key, self.expr(), optional

        return CreateMap(start.offset, tuple(self._elements("}", entry)))

    def _optional_mark(self) -> bool:
        """Takes the `?` that makes an element or entry optional (cel-go's optional syntax); whether there was one."""
        if self.at("?"):
            self.take()
            return True
        return False

    def _elements(self, closer: str, element: Callable[[], _E]) -> list[_E]:
        """The elements of a list or map literal that is not empty, up to its `closer` (taken): separated by commas,
        and a comma may end them."""
        elements = [element()]
        while self.at(","):
            self.take()
            if self.at(closer):
                break
            elements.append(element())
        self.expect(closer)
        return elements

    # macros
    def global_call(self, name: str, args: list[Expr], offset: int) -> Expr:
        if name == "has" and len(args) == 1:
            arg = args[0]
            if not isinstance(arg, Select) or arg.optional:
                raise SyntaxIssue("invalid argument to has() macro", offset)
            return Has(offset, arg.operand, arg.field)
        return Call(offset, name, tuple(args))

    def member_call(self, target: Expr, name: str, args: list[Expr], offset: int) -> Expr:
        if isinstance(target, Ident) and target.name == "cel" and name == "bind" and len(args) == 3:
            bound = args[0]
            if not isinstance(bound, Ident):
                raise SyntaxIssue("cel.bind() variable names must be simple identifiers", bound.offset)
            return Bind(offset, bound.name, args[1], args[2])
        one_var = {"all": 2, "exists": 2, "exists_one": 2, "filter": 2}
        if name in one_var and len(args) == 2:
            return Comprehension(offset, name, target, self.iter_var(args[0], name), None, args[1])
        if name == "map" and len(args) in (2, 3):
            var = self.iter_var(args[0], name)
            if len(args) == 2:
                return Comprehension(offset, "map", target, var, None, None, args[1])
            return Comprehension(offset, "map", target, var, None, args[1], args[2])
        two_var = {"all": "all2", "exists": "exists2", "existsOne": "existsOne2", "exists_one": "existsOne2"}
        if name in two_var and len(args) == 3:
            v1, v2 = self.iter_var(args[0], name), self.iter_var(args[1], name)
            self.distinct_vars(v1, v2, name, offset)
            return Comprehension(offset, two_var[name], target, v1, v2, args[2])
        if name in ("transformList", "transformMap") and len(args) in (3, 4):
            v1, v2 = self.iter_var(args[0], name), self.iter_var(args[1], name)
            self.distinct_vars(v1, v2, name, offset)
            if len(args) == 3:
                return Comprehension(offset, name, target, v1, v2, None, args[2])
            return Comprehension(offset, name, target, v1, v2, args[2], args[3])
        if name == "transformMapEntry" and len(args) in (3, 4):
            v1, v2 = self.iter_var(args[0], name), self.iter_var(args[1], name)
            self.distinct_vars(v1, v2, name, offset)
            if len(args) == 3:
                return Comprehension(offset, name, target, v1, v2, None, args[2])
            return Comprehension(offset, name, target, v1, v2, args[2], args[3])
        if name == "sortBy" and len(args) == 2:
            return Comprehension(offset, "sortBy", target, self.iter_var(args[0], name), None, None, args[1])
        if name in ("optMap", "optFlatMap") and len(args) == 2:
            mapped = args[0]
            if not isinstance(mapped, Ident):
                raise SyntaxIssue(f"{name}() variable name must be a simple identifier", mapped.offset)
            return OptMap(offset, target, mapped.name, args[1], flat=name == "optFlatMap")
        return Call(offset, name, tuple(args), target)

    @staticmethod
    def iter_var(arg: Expr, macro: str) -> str:
        if not isinstance(arg, Ident):
            raise SyntaxIssue("argument must be a simple name", arg.offset)
        if arg.name == "__result__":
            raise SyntaxIssue("iteration variable overwrites accumulator variable", arg.offset)
        return arg.name

    @staticmethod
    def distinct_vars(v1: str, v2: str, macro: str, offset: int) -> None:
        if v1 == v2:
            raise SyntaxIssue(f"duplicate variable name: {v1}", offset)


def parse(text: str) -> Expr:
    """Parse one CEL expression; raise SyntaxIssue."""
    return _Parser(text).parse()


@dataclass(frozen=True)
class Position:
    line: int
    column: int
    line_text: str = field(default="")


def position(text: str, offset: int) -> Position:
    """1-based line and 1-based column (cel-go's `<input>:L:C`) of a 0-based offset."""
    before = text[:offset]
    line = before.count("\n") + 1
    start = before.rfind("\n") + 1
    end = text.find("\n", offset)
    return Position(line, offset - start + 1, text[start : end if end >= 0 else len(text)])
