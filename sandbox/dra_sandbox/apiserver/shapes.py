"""Request shapes: what a request asks of the API, without its values, written down for the test suite.

With `DRA_SANDBOX_REQUEST_SHAPES=<directory>` in its environment, an API server appends each new shape it serves
(verb, group/version/resource, scope, subresource, query parameter names, field and label selector keys with
their operators, body content type) as one JSON line to a file of its own in that directory, with the client
that sent it. `tests/apirequests/` reads them at the end of a test session and checks the product's against the
table of requests real API servers accept (docs/reference/api-requests.md).

Who sent a request: the `X-Dra-Request-Origin` header when present (the test suite's own process marks each
request of the product's client with `product:<component>` or `test`, see tests/apirequests/plugin.py), else the
User-Agent: `dra-driver/<version> (<component>)` is the product (a bare `dra-driver/<version>` is its client in
another program's hands: the bench's), `kopf/<version>` its controller's operator
framework, anything else (kubectl, the `kubernetes` package, the sandbox's own clients) not the product.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from .labelselector import SelectorError, parse_label_selector
from .selectors import parse_field_selector

RECORD_ENV: Final = "DRA_SANDBOX_REQUEST_SHAPES"
ORIGIN_HEADER: Final = "X-Dra-Request-Origin"
# Every entry point of the product names its component (`connect(component=...)`); a bare `dra-driver/<version>`
# is the product's client used by a bench or test process as its own admin client.
PRODUCT_UA: Final = re.compile(r"dra-driver/\S+(?: \((?P<component>[\w-]+)\))?")
KOPF_UA: Final = re.compile(r"kopf/\S*")
NOT_PRODUCT: Final = ""


def client_of(headers: Mapping[str, str]) -> str:
    """The product component that sent a request ("kubelet-plugin", "controller", ...), or "" for others."""
    origin = headers.get(ORIGIN_HEADER, "")
    if origin:
        return origin.removeprefix("product:") if origin.startswith("product:") else NOT_PRODUCT
    agent = headers.get("User-Agent", "")
    if (m := PRODUCT_UA.fullmatch(agent)) and m.group("component"):
        return m.group("component")
    if KOPF_UA.fullmatch(agent):
        return "controller"
    return NOT_PRODUCT


@dataclass(frozen=True)
class RequestShape:
    component: str  # the product component, "" when not the product
    verb: str  # get list watch create update patch delete deletecollection
    group: str
    version: str
    resource: str  # plural, "plural/subresource", or a non-resource path ("/version", "/apis/{group}/{version}")
    # "cluster", "namespaced", "all-namespaces" (a namespaced kind across namespaces), "" (non-resource)
    scope: str
    named: bool
    params: tuple[str, ...]  # query parameter names, sorted
    field_selector: tuple[tuple[str, str], ...]  # (label, operator) as sent, sorted
    label_selector: tuple[tuple[str, str], ...]  # (key, operator), sorted
    content_type: str  # of the body ("" without one)


def selector_terms(field_text: str | None, label_text: str | None) -> tuple[tuple[tuple[str, str], ...],
                                                                            tuple[tuple[str, str], ...]]:
    """Selector keys and operators; an unparseable selector is kept whole as ("<unparseable>", text)."""
    fields: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    if field_text:
        try:
            fields = tuple(sorted((r.field, r.written) for r in parse_field_selector(field_text).requirements))
        except SelectorError:
            fields = (("<unparseable>", field_text),)
    if label_text:
        try:
            labels = tuple(sorted((r.key, r.op) for r in parse_label_selector(label_text).requirements))
        except SelectorError:
            labels = (("<unparseable>", label_text),)
    return fields, labels


class ShapeRecorder:
    """Appends each shape not seen before to `<directory>/<pid>-<id>.jsonl`, with one example request and the
    test that was running (PYTEST_CURRENT_TEST). Used from the server's event loop only."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._file = directory / f"{os.getpid()}-{id(self):x}.jsonl"
        self._seen: set[RequestShape] = set()

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> ShapeRecorder | None:
        directory = environ.get(RECORD_ENV)
        return cls(Path(directory)) if directory else None

    def record(self, shape: RequestShape, example: str, user_agent: str) -> None:
        if shape in self._seen:
            return
        self._seen.add(shape)
        line = {**asdict(shape), "example": example, "user_agent": user_agent,
                "test": os.environ.get("PYTEST_CURRENT_TEST", "")}
        with self._file.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, sort_keys=True) + "\n")
