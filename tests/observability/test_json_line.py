"""`json_line`, the one processor our own JSON log lines go through, writes what structlog's processor chain
(context merge, timestamp, level, logger, stack and exception, rename, field order, JSONRenderer) wrote: the same
bytes but for the timestamp's value."""

from __future__ import annotations

import io
import json
import re
import sys
from typing import Any

import structlog
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.contextvars import bind_contextvars, reset_contextvars

from dra_driver.observability import logging as obslog

_TS = re.compile(r'^\{"ts": "[^"]*"')


def _chain(logger: Any, method: str, event: dict[str, Any]) -> str:
    """The chain `configure_logging("…", "json")` used for our own lines before `json_line`."""
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
        structlog.processors.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
        structlog.processors.EventRenamer("msg"),
        obslog._field_order,
        structlog.processors.JSONRenderer(sort_keys=False),
    ]
    out: Any = event
    for processor in processors:
        out = processor(logger, method, out)
    return str(out)


def _same_but_ts(old: str, new: str) -> None:
    assert _TS.match(old) and _TS.match(new), (old, new)
    assert _TS.sub('{"ts": ""', old) == _TS.sub('{"ts": ""', new)


class _Odd:
    def __repr__(self) -> str:
        return "<odd>"


class _Structlogged:
    def __structlog__(self) -> str:
        return "structlogged"


_names = st.text(min_size=1, max_size=12)
_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    fields=st.dictionaries(
        _names | st.sampled_from(["ts", "level", "logger", "msg", "claim_uid"]), _values, max_size=6
    ),
    context=st.dictionaries(_names | st.sampled_from(["ts", "claim_uid", "event"]), _values, max_size=4),
    method=st.sampled_from(["debug", "info", "warning", "warn", "error", "exception", "critical"]),
    event=st.text(max_size=30),
)
def test_the_same_line_as_the_chain(fields: dict[str, Any], context: dict[str, Any], method: str, event: str) -> None:
    logger = obslog._NamedPrintLogger(io.StringIO(), "dra_driver.plugin.engine")
    fields = {k: v for k, v in fields.items() if k not in ("event", "stack_info", "exc_info")}
    tokens = bind_contextvars(**context)
    try:
        old = _chain(logger, method, {**fields, "event": event})
        new = obslog.json_line(logger, method, {**fields, "event": event})
    finally:
        reset_contextvars(**tokens)
    _same_but_ts(old, new)


def test_odd_values_exceptions_and_stacks_as_the_chain() -> None:
    logger = obslog._NamedPrintLogger(io.StringIO(), "x")
    for extra in ({"value": _Odd(), "other": _Structlogged()}, {}):
        _same_but_ts(
            _chain(logger, "info", {"event": "e", **extra}), obslog.json_line(logger, "info", {"event": "e", **extra})
        )
    # The stack differs by where it was taken: the same fields in the same order, a stack in each.
    old_stack = json.loads(_chain(logger, "info", {"event": "e", "stack_info": True, "n": 1}))
    new_stack = json.loads(obslog.json_line(logger, "info", {"event": "e", "stack_info": True, "n": 1}))
    assert list(old_stack) == list(new_stack) == ["ts", "level", "logger", "msg", "n", "stack"]
    assert new_stack["stack"].startswith("Stack (most recent call last):")
    try:
        raise ValueError("boom")
    except ValueError:
        old = _chain(logger, "exception", {"event": "failed", "exc_info": True})
        new = obslog.json_line(logger, "exception", {"event": "failed", "exc_info": sys.exc_info()})
    _same_but_ts(old, new)
    assert json.loads(new)["exception"].rstrip().endswith("ValueError: boom")


def test_configured_lines_are_json_line_s(monkeypatch: Any) -> None:
    stream = io.StringIO()
    obslog.configure_logging("info", "json", stream=stream)
    try:
        tokens = bind_contextvars(claim_uid="u-1")
        try:
            structlog.get_logger("dra_driver.t").info("claim prepared", devices=["gpu-0"])
            structlog.get_logger("dra_driver.t").debug("filtered")
        finally:
            reset_contextvars(**tokens)
    finally:
        obslog.configure_logging("warning", "text")
    (line,) = stream.getvalue().splitlines()
    assert re.fullmatch(
        r'\{"ts": "\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z", "level": "info", "logger": "dra_driver.t", '
        r'"msg": "claim prepared", "devices": \["gpu-0"\], "claim_uid": "u-1"\}',
        line,
    ), line
