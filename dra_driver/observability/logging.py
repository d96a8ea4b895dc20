"""structlog setup: JSON lines by default (for log pipelines), readable key=value for people.

JSON lines follow the field's conventions (docs/operations.md, "Log schema"): `ts` (RFC 3339, UTC), `level`,
`logger` (the module), `msg`, then the line's own fields (`claim_namespace`, `claim_name`, `claim_uid`, `error` …).
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog

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
        processors=[*shared, renderer],
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
    def __init__(self, file: TextIO) -> None:
        self._file = file

    def __call__(self, *args: object) -> _NamedPrintLogger:
        return _NamedPrintLogger(self._file, str(args[0]) if args else "dra_driver")


def claim_fields(namespace: str, name: str, uid: str) -> dict[str, str]:
    """The three fields every log line about a claim carries."""
    return {"claim_namespace": namespace, "claim_name": name, "claim_uid": uid}
