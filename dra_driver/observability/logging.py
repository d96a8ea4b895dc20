"""structlog setup: JSON lines by default (for log pipelines), readable key=value for people.

JSON lines follow the field's conventions (docs/operations.md, "Log schema"): `ts` (RFC 3339, UTC), `level`,
`logger` (the module), `msg`, then the line's own fields (`claim_namespace`, `claim_name`, `claim_uid`, `error` …).
"""

from __future__ import annotations

import contextvars
import datetime
import json as jsonlib
import logging
import sys
from typing import Any, Literal, TextIO

import structlog
from structlog.contextvars import STRUCTLOG_KEY_PREFIX

LogFormat = Literal["json", "text"]
LEVELS = ("debug", "info", "warning", "error")


def configure_logging(level: str = "info", fmt: LogFormat = "json", stream: TextIO | None = None) -> None:
    """Configure structlog (and route stdlib logging, e.g. from kopf or grpc, through the same renderer)."""
    out: TextIO = stream or _CurrentStderr()  # type: ignore[assignment]
    numeric = getattr(logging, level.upper(), logging.INFO)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(sort_keys=False)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False, pad_event_to=0, sort_keys=False)
    )
    json = fmt == "json"
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts" if json else "timestamp"),
        structlog.processors.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
    ]
    if json:
        shared.append(structlog.processors.EventRenamer("msg"))
        shared.append(_field_order)
    structlog.configure(
        # Our own lines in JSON: one processor doing the whole chain's work (the chain per line was ≈ 13 µs, the
        # line itself ≈ 8): the same line, byte for byte (tests/observability/test_json_line.py).
        processors=[json_line] if json else [*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=_NamedPrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=shared,
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # Libraries (grpc, kopf, urllib3) stay at INFO or above even when our own debug logs are on.
    root.setLevel(max(numeric, logging.INFO))


class _CurrentStderr:
    """Whatever `sys.stderr` is when a line is written, not when logging was configured: a process (or a test) that
    replaces stderr later, and closes the old one, must not leave every thread's next log line raising on a closed
    file (a thread that dies of that stops its work silently)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


_FIRST = ("ts", "level", "logger", "msg")


def _field_order(logger: object, method: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
    """ts, level, logger, msg first (people read the head of a line), the line's own fields after."""
    head = {k: event.pop(k) for k in _FIRST if k in event}
    return {**head, **event}


class _NamedPrintLogger(structlog.PrintLogger):
    """A PrintLogger that knows its name (`structlog.get_logger(__name__)`), for the `logger` field."""

    def __init__(self, file: TextIO, name: str) -> None:
        super().__init__(file)
        self.name = name


class _NamedPrintLoggerFactory:
    """One logger per name for this configuration's output: structlog's lazy proxy asks the factory on every line
    (loggers are not cached on first use, so that configuring again takes effect), and a new PrintLogger each time
    looked up its file's lock again. A new configuration makes a new factory, so nothing outlives it."""

    def __init__(self, file: TextIO) -> None:
        self._file = file
        self._by_name: dict[str, _NamedPrintLogger] = {}

    def __call__(self, *args: object) -> _NamedPrintLogger:
        name = str(args[0]) if args else "dra_driver"
        known = self._by_name.get(name)
        if known is None:
            known = self._by_name[name] = _NamedPrintLogger(self._file, name)
        return known


_PREFIX_LEN = len(STRUCTLOG_KEY_PREFIX)
_UTC = datetime.UTC
_LEVEL_OF_METHOD = {"warn": "warning", "exception": "error"}  # as structlog's add_log_level names them
_stack_info = structlog.processors.StackInfoRenderer()


def _json_default(obj: Any) -> Any:
    # What structlog's JSONRenderer does with a value JSON has no type for: its `__structlog__()`, else its repr.
    try:
        return obj.__structlog__()
    except AttributeError:
        return repr(obj)


# One encoder for every line: `json.dumps` with keyword arguments builds a new JSONEncoder per call (≈ 1.2 µs).
_encode = jsonlib.JSONEncoder(default=_json_default).encode


def json_line(logger: Any, method_name: str, event_dict: structlog.typing.EventDict) -> str:
    """The JSON line of one of our own log calls, as the processor chain of `configure_logging` ("json") writes it
    for stdlib records: the context variables merged (the call's own fields win), `stack_info` and `exc_info`
    rendered, `ts`, `level`, `logger`, `msg` first, then the call's fields, then the context's."""
    for var, value in contextvars.copy_context().items():
        name = var.name
        if name.startswith(STRUCTLOG_KEY_PREFIX) and value is not Ellipsis:
            event_dict.setdefault(name[_PREFIX_LEN:], value)
    if "stack_info" in event_dict:
        event_dict = _stack_info(logger, method_name, event_dict)
    if "exc_info" in event_dict:
        event_dict = structlog.processors.format_exc_info(logger, method_name, event_dict)
    event_dict["ts"] = datetime.datetime.now(tz=_UTC).isoformat().replace("+00:00", "Z")
    event_dict["level"] = _LEVEL_OF_METHOD.get(method_name, method_name)
    event_dict["logger"] = logger.name
    event_dict["msg"] = event_dict.pop("event")
    return _encode(
        {
            "ts": event_dict["ts"],
            "level": event_dict["level"],
            "logger": event_dict["logger"],
            "msg": event_dict["msg"],
            **event_dict,
        }
    )


def claim_fields(namespace: str, name: str, uid: str) -> dict[str, str]:
    """The three fields every log line about a claim carries."""
    return {"claim_namespace": namespace, "claim_name": name, "claim_uid": uid}
