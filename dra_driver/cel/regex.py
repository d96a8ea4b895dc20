"""Regular expressions with RE2 syntax and semantics, as cel-go's `matches` and the Kubernetes regex library
use (Go's regexp is RE2). google-re2 provides them; compiled patterns are cached (patterns in selectors are
constants, so the cache stays small)."""

from __future__ import annotations

import functools
from typing import Any

import re2  # type: ignore[import-untyped]

from dra_driver.cel.runtime import CelEvalError

__all__ = ["compile_pattern", "pattern_error"]


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # report through CEL errors, not on stderr
    return options


_OPTIONS = _options()


def _message(err: Exception) -> str:
    detail = err.args[0] if err.args else ""
    if isinstance(detail, bytes):
        detail = detail.decode("utf-8", errors="replace")
    return str(detail) or "invalid regular expression"


@functools.lru_cache(maxsize=256)
def _compile(pattern: str) -> Any:
    return re2.compile(pattern, _OPTIONS)


def pattern_error(pattern: str) -> str | None:
    """Why `pattern` is not a valid RE2 expression, or None."""
    try:
        _compile(pattern)
    except re2.error as err:
        return _message(err)
    return None


def compile_pattern(pattern: str) -> Any:
    try:
        return _compile(pattern)
    except re2.error as err:
        raise CelEvalError(f"error parsing regexp: {_message(err)}") from None
