"""structlog setup: JSON lines by default (for log pipelines), readable key=value for people."""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog

LogFormat = Literal["json", "text"]
LEVELS = ("debug", "info", "warning", "error")


def configure_logging(level: str = "info", fmt: LogFormat = "json", stream: TextIO | None = None) -> None:
    """Configure structlog (and route stdlib logging, e.g. from kopf or grpc, through the same renderer)."""
    out = stream or sys.stderr
    numeric = getattr(logging, level.upper(), logging.INFO)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(sort_keys=False)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False, pad_event_to=0, sort_keys=False)
    )
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
    ]
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # Libraries (grpc, kopf, urllib3) stay at INFO or above even when our own debug logs are on.
    root.setLevel(max(numeric, logging.INFO))


def claim_fields(namespace: str, name: str, uid: str) -> dict[str, str]:
    """The three fields every log line about a claim carries."""
    return {"claim_namespace": namespace, "claim_name": name, "claim_uid": uid}
