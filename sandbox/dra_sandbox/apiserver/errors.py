"""API errors and the `Status` bodies the kube-apiserver sends for them.

Messages and reasons copy the apiserver's wording (`pods "x" not found`, `Operation cannot be
fulfilled on ...`), because clients and people match on them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .validation.fielderrors import FieldError, format_errors

# HTTP code -> Status reason, for faults injected by code and for generic errors.
REASONS: Mapping[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """Anything a handler rejects; rendered as a `Status` with the same code."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        list_meta: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = dict(details) if details else None
        self.headers = dict(headers) if headers else {}
        self.list_meta = dict(list_meta) if list_meta else {}

    def status(self) -> dict[str, Any]:
        body = status_body(self.code, self.reason, self.message, self.details)
        body["metadata"] = dict(self.list_meta)  # Status.ListMeta: a fresh continue token on an expired one
        return body


def status_body(code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if not reason:
        del body["reason"]  # StatusReasonUnknown is "" and omitted, as for errors storage did not classify
    if details:
        body["details"] = dict(details)
    return body


def success_status(name: str, group: str, kind: str, uid: str) -> dict[str, Any]:
    """What DELETE returns for kinds that do not return the deleted object."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "group": group, "kind": kind, "uid": uid},
    }


def group_resource(plural: str, group: str) -> str:
    """`pods`, `resourceslices.resource.k8s.io` - how the apiserver names a resource in messages."""
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, group: str, name: str) -> ApiError:
    return _about_object(404, "NotFound", plural, group, name, "not found")


def already_exists(plural: str, group: str, name: str) -> ApiError:
    return _about_object(409, "AlreadyExists", plural, group, name, "already exists")


def _about_object(code: int, reason: str, plural: str, group: str, name: str, what: str) -> ApiError:
    """`<resource> "<name>" <what>`, with the details (name, group, kind) the apiserver's Status carries."""
    return ApiError(code, reason, f'{group_resource(plural, group)} "{name}" {what}',
                    {"name": name, "group": group, "kind": plural})


def conflict(plural: str, group: str, name: str, detail: str | None = None) -> ApiError:
    why = detail or "the object has been modified; please apply your changes to the latest version and try again"
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {group_resource(plural, group)} "{name}": {why}',
        {"name": name, "group": group, "kind": plural},
    )


def invalid(kind: str, group: str, name: str, errors: Sequence[FieldError]) -> ApiError:
    qualified = f"{kind}.{group}" if group else kind
    return ApiError(
        422,
        "Invalid",
        f'{qualified} "{name}" is invalid: {format_errors(errors)}',
        {
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [{"reason": e.reason, "message": e.message, "field": e.field} for e in errors],
        },
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def forbidden(plural: str, group: str, name: str, why: str) -> ApiError:
    return _about_object(403, "Forbidden", plural, group, name, f"is forbidden: {why}")


def method_not_allowed(message: str = "the server does not allow this method on the requested resource") -> ApiError:
    return ApiError(405, "MethodNotAllowed", message)


def expired(message: str, *, list_meta: Mapping[str, Any] | None = None) -> ApiError:
    return ApiError(410, "Expired", message, list_meta=list_meta)


def resource_version_too_large(requested: int, current: int) -> ApiError:
    """storage.NewTooLargeResourceVersionError: a list at a version the cache has not reached within 3 s."""
    return ApiError(504, "Timeout", f"Timeout: Too large resource version: {requested}, current: {current}",
                    {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                     "retryAfterSeconds": 1}, headers={"Retry-After": "1"})


def storage_too_large() -> ApiError:
    """etcd refusing a value over its --max-request-bytes: the apiserver passes the raw error on as a 500
    with no reason (kubernetes/kubernetes issue 112152, still open)."""
    return ApiError(500, "", "etcdserver: request is too large")


def request_entity_too_large(message: str) -> ApiError:
    """errors.NewRequestEntityTooLargeError: a body over 3 MiB, a JSON patch of over 10000 operations."""
    return ApiError(413, "RequestEntityTooLarge", f"Request entity too large: {message}")


def unsupported_media_type(message: str) -> ApiError:
    return ApiError(415, "UnsupportedMediaType", message)


def not_served(plural: str, subresource: str) -> ApiError:
    """A subresource kube-apiserver serves and this imitation does not (UNSERVED_SUBRESOURCES): said so, with
    where to go, instead of a NotFound that reads as a missing object."""
    return ApiError(405, "MethodNotAllowed",
                    f"the dra-sandbox API server does not serve {plural}/{subresource}: its kubelets keep no "
                    f"container running to reach (a container's devices are CDI-checked, or podman runs a probe in "
                    f"it once; only the pods run as host processes keep running); `kubectl logs` works for those; "
                    f"for {subresource} start `dra-sandbox up --kubernetes upstream` (a real kubelet and containerd)")


def path_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def from_code(code: int, message: str | None = None, *, name: str = "", plural: str = "", group: str = "") -> ApiError:
    """An error for an arbitrary HTTP code (fault injection), worded like the apiserver's."""
    if code == 409:
        return conflict(plural, group, name)
    if code == 404:
        return not_found(plural, group, name)
    reason = REASONS.get(code, "Unknown")
    text = message or {
        500: "Internal error occurred: injected fault",
        503: "the server is currently unable to handle the request (injected fault)",
        429: "the server has received too many requests and has asked us to try again later (injected fault)",
        504: "the server was unable to return a response in the time allotted, but may still be processing the "
        "request (injected fault)",
    }.get(code, f"injected fault ({code})")
    details: dict[str, Any] = {"name": name, "group": group, "kind": plural}
    if code == 500:
        details["causes"] = [{"message": text}]
    headers = {"Retry-After": "1"} if code in (429, 503) else {}
    if code == 429:
        details["retryAfterSeconds"] = 1
    return ApiError(code, reason, text, details, headers)
