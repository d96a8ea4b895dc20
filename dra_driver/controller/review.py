"""What the webhook server accepts as an AdmissionReview before any check runs, and the answers it gives otherwise.

Everything in a review is untrusted input: anyone who can reach the port can send one. Three outcomes
(docs/webhook.md "What is refused"):

* `Refused`: there is no AdmissionReview to answer (not UTF-8, not JSON, not a JSON object, not
  `admission.k8s.io/v1` `AdmissionReview`, no `request` object, no `request.uid`). The server answers that HTTP
  status with a `metav1.Status` body naming the problem; the API server counts it as a failed call, so the
  webhook's `failurePolicy` decides.
* `Denied`: an AdmissionReview whose `request.uid` can be echoed, but whose request the checks cannot trust (a
  `request.object` that is not a JSON object, the wrong resource for the handler path, nesting beyond
  `MAX_DEPTH`, ...). Answered `allowed: false` with `status.code` 400 and the message: it fails closed whatever
  the failurePolicy.
* `Accepted`: the review goes to the checks.

The shape is the API server's (k8s.io/api admission/v1 `AdmissionReview`): it sends `admission.k8s.io/v1` when
the webhook lists `admissionReviewVersions: [v1]`, and it refuses an answer whose apiVersion/kind differ from
what it sent or whose `response.uid` is not the request's (`expected response.uid=...`).
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
OPERATIONS: Final = ("CREATE", "UPDATE", "DELETE", "CONNECT")

# Objects and arrays nested inside one another, counted from the review itself (depth 1): `request` is 2,
# `request.object` 3, a ResourceClaim's `spec.devices.config[0].opaque.parameters` 9, and the deepest field of a
# GpuConfig about 13. The checks, the strict decoder and kopf's diff of object and oldObject recurse once or more
# per level under Python's recursion limit (1,000 frames); 100 keeps them far from it, and leaves another
# driver's opaque parameters some 90 levels.
MAX_DEPTH: Final = 100
BAD_REQUEST: Final = 400


@dataclass(frozen=True)
class Refused:
    """No AdmissionReview can be answered: why (the HTTP status is BAD_REQUEST)."""

    message: str


@dataclass(frozen=True)
class Denied:
    """Answer `allowed: false` (`status.code` BAD_REQUEST) to the review with `uid`."""

    uid: str
    message: str


@dataclass(frozen=True)
class Accepted:
    """A review the checks may read: `request` is a JSON object with a uid, the handler's resource, a known
    operation, userInfo, and the objects the operation needs; nothing is nested deeper than MAX_DEPTH."""

    review: dict[str, Any]

    @property
    def uid(self) -> str:
        return str(self.review["request"]["uid"])


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


_STRINGS: Final = re.compile(rb'"[^"]*"')
_STEPS: Final = bytes.maketrans(b"{[}]", b"\x02\x02\x00\x00")
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"{[}]")


def max_depth(raw: bytes) -> int:
    """How deep objects and arrays nest in `raw`, valid JSON (a scalar is 0, `{}` 1, `{"a": []}` 2). On the bytes,
    at C speed: every review is measured, and a walk of the decoded value in Python costs several times the decode
    on a body of millions of small values. Escaped backslashes and quotes go first, so every quote left delimits a
    string; strings go (their brackets are text); each bracket left is +1 or -1 and the deepest point of the running
    sum is the depth."""
    plain = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    steps = _STRINGS.sub(b"", plain).translate(_STEPS, _NOT_BRACKETS)
    if not steps:
        return 0
    # Opening brackets are 2 and closing ones 0: the sum after i steps minus i is the depth there.
    return int(max(map(operator.sub, itertools.accumulate(steps), itertools.count(1))))


def deep_path(value: Any, limit: int = MAX_DEPTH) -> str:
    """The path of the first object or array nested more than `limit` deep in `value` (which is itself at depth 1),
    for the message; empty when there is none. Only run on a document max_depth found too deep: it walks in
    Python, depth first, holding one iterator per level (no recursion, nothing per value kept alive)."""
    if not isinstance(value, dict | list):
        return ""
    stack: list[Iterator[tuple[Any, Any]]] = [_items(value)]
    keys: list[Any] = []
    while stack:
        for key, child in stack[-1]:
            if isinstance(child, dict | list):
                keys.append(key)
                if len(stack) >= limit:
                    return _path(keys)
                stack.append(_items(child))
                break
        else:
            stack.pop()
            if keys:
                keys.pop()
    return ""


def _items(node: dict[str, Any] | list[Any]) -> Iterator[tuple[Any, Any]]:
    return iter(node.items()) if isinstance(node, dict) else enumerate(node)


def _path(keys: list[Any]) -> str:
    """The path the API server would print: `request.object.spec.devices.config[0]`."""
    out = ""
    for key in keys:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out


def _shorten(path: str, keep: int = 120) -> str:
    return path if len(path) <= keep else path[:keep] + "..."


_TOO_DEEP: Final = Refused(f"the request body nests JSON arrays and objects too deeply to decode; "
                           f"at most {MAX_DEPTH} levels are accepted")


def decode(raw: bytes) -> Any | Refused:
    """The body as JSON, or why not."""
    if not raw:
        return Refused(f"the request body is empty; expected an {KIND} ({API_VERSION})")
    try:
        return msgspec.json.decode(raw)  # refuses invalid UTF-8 too
    except RecursionError:
        # msgspec stops at Python's recursion limit (about 1,000 levels) with RecursionError, not DecodeError.
        return _TOO_DEEP
    except msgspec.DecodeError as exc:
        error = exc
    try:
        raw.decode("utf-8")  # only for the message: which of the two it is
    except UnicodeDecodeError as exc:
        return Refused(f"the request body is not UTF-8 (byte {exc.start}: {exc.reason}); "
                       f"expected an {KIND} ({API_VERSION}) in JSON")
    return Refused(f"the request body is not valid JSON: {error}")


def read_review(raw: bytes, *, handler: str, resource: tuple[str, str, str]) -> Accepted | Denied | Refused:
    """Judge the body POSTed to the handler path `/<handler>`, which checks `resource` (group, version,
    plural)."""
    value = decode(raw)
    if isinstance(value, Refused):
        return value
    if not isinstance(value, dict):
        # Whether msgspec reaches its recursion limit depends on the thread's stack and the interpreter's limit, so
        # a deep body that happened to decode gets the same answer as one that did not.
        if isinstance(value, list) and max_depth(raw) > MAX_DEPTH:
            return _TOO_DEEP
        return Refused(f"the request body must be a JSON object (an {KIND}), got {json_type(value)}")
    if value.get("apiVersion") != API_VERSION or value.get("kind") != KIND:
        return Refused(f"expected apiVersion {API_VERSION} kind {KIND}, got apiVersion "
                       f"{value.get('apiVersion')!r} kind {value.get('kind')!r} (the webhook "
                       "configuration must list admissionReviewVersions [v1])")
    request = value.get("request")
    if not isinstance(request, dict):
        return Refused(f"request must be a JSON object, got {json_type(request)}")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        return Refused(f"request.uid must be a non-empty string, got {json_type(uid)}"
                       f"{' (empty)' if uid == '' else ''}; an answer must echo it")
    problem = _request_problem(value, request, handler, resource, max_depth(raw))
    return Denied(uid, problem) if problem else Accepted(value)


def _request_problem(review: Mapping[str, Any], request: Mapping[str, Any], handler: str,
                     resource: tuple[str, str, str], depth: int) -> str:
    """Why `request` cannot be checked; empty when it can."""
    if depth > MAX_DEPTH:
        where = _shorten(deep_path(review)) or "the review"
        return (f"{where} is nested more than {MAX_DEPTH} levels deep (counted from the AdmissionReview); "
                "this webhook refuses deeper documents")
    got = request.get("resource")
    group, version, plural = resource
    if not isinstance(got, dict) or (got.get("group"), got.get("version"), got.get("resource")) != resource:
        shown = (f"{got.get('group')!r}/{got.get('version')!r} {got.get('resource')!r}" if isinstance(got, dict)
                 else json_type(got))
        return (f"request.resource is {shown}; the handler at /{handler} checks "
                f"{group}/{version} {plural} (a webhook configuration that points another resource here?)")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        return f"request.operation must be one of {', '.join(OPERATIONS)}, got {operation!r}"
    if not isinstance(request.get("userInfo"), dict):
        return f"request.userInfo must be a JSON object, got {json_type(request.get('userInfo'))}"
    for field in ("object", "oldObject"):
        if request.get(field) is not None and not isinstance(request[field], dict):
            return f"request.{field} must be a JSON object, got {json_type(request[field])}"
    for field in ("object", "oldObject"):
        meta = (request.get(field) or {}).get("metadata")
        if meta is not None and not isinstance(meta, dict):
            return f"request.{field}.metadata must be a JSON object, got {json_type(meta)}"
    if operation in ("CREATE", "UPDATE") and request.get("object") is None:
        return f"request.object is missing; a {operation} review carries the object to check"
    if operation == "UPDATE" and request.get("oldObject") is None:
        return "request.oldObject is missing; an UPDATE review carries the stored object too"
    if request.get("object") is None and request.get("oldObject") is None:
        return "request.object and request.oldObject are both missing"
    for field in ("subResource", "name", "namespace"):
        if request.get(field) is not None and not isinstance(request[field], str):
            return f"request.{field} must be a string, got {json_type(request[field])}"
    if request.get("dryRun") is not None and not isinstance(request["dryRun"], bool):
        return f"request.dryRun must be a boolean, got {json_type(request['dryRun'])}"
    return ""


def denial(uid: str, message: str, code: int = BAD_REQUEST) -> dict[str, Any]:
    """The AdmissionReview answer that refuses the request `uid`: `status.message` reaches the user as
    `admission webhook "<name>" denied the request: <message>`."""
    return {"apiVersion": API_VERSION, "kind": KIND,
            "response": {"uid": uid, "allowed": False,
                         "status": {"status": "Failure", "code": code, "message": message,
                                    "reason": "BadRequest" if code == BAD_REQUEST else "InternalError"}}}


REASONS: Final = {400: "BadRequest", 404: "NotFound", 405: "MethodNotAllowed", 408: "Timeout",
                  413: "RequestEntityTooLarge", 415: "UnsupportedMediaType", 500: "InternalError"}


def status_body(status: int, message: str) -> dict[str, Any]:
    """A `metav1.Status` for an HTTP error answer: the API server's client shows its message in
    `failed calling webhook ...`."""
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": status,
            "reason": REASONS.get(status, "BadRequest"), "message": message}
