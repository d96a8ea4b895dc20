"""The product's API client: a small JSON REST layer over `HttpTransport` (kept-alive connections with its own
HTTP/1.1 exchange; urllib3 for watches and streamed lists).

The driver works with plain JSON objects (what the API server sends) rather than the generated models:
ResourceSlices are built as dicts, claims are read as dicts, and nothing is lost in a model round trip
when the API adds fields. Where the server is and who we are comes from `kubeconfig.py` (kubeconfig files and
the in-cluster service account); nothing on this path imports the `kubernetes` package, which only
`fallback.py` loads, for kubeconfigs that need exec plugins or auth providers (docs/kubelet-plugin.md,
"Connecting to the API server").
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any, TypedDict, Unpack

import msgspec
import urllib3.exceptions

from dra_driver import __version__
from dra_driver.errors import DraDriverError
from dra_driver.k8s.kubeconfig import ApiConnection, UnsupportedKubeconfig, load_connection
from dra_driver.k8s.transport import HttpTransport, Reply

JsonObject = dict[str, Any]
USER_AGENT = f"dra-driver/{__version__}"


def product_user_agent(component: str) -> str:
    """`dra-driver/<version> (<component>)`: names the part of the product in API server audit logs (as client-go's
    `<binary>/<version>`), and lets the test suite tell the product's requests from others' (docs/reference/
    api-requests.md)."""
    return f"{USER_AGENT} ({component})" if component else USER_AGENT

log = logging.getLogger(__name__)


class ApiError(DraDriverError):
    """A failed API request. `status` 0 means the server was not reached (connection or timeout)."""

    def __init__(self, status: int, reason: str, body: JsonObject | None = None) -> None:
        self.status = status
        self.reason = reason
        self.body = body or {}
        message = str(self.body.get("message") or reason)
        super().__init__(f"HTTP {status}: {message}" if status else message)

    @property
    def not_found(self) -> bool:
        return self.status == 404


def connect(kubeconfig: str | None = None, *, timeout: float = 10.0, component: str = "") -> KubeRest:
    """A client for an explicit kubeconfig, else in-cluster, else $KUBECONFIG / ~/.kube/config
    (`kubeconfig.load_connection`). Raises `KubeconfigError` (a DraDriverError) naming what is wrong.

    A kubeconfig that needs what the product's loader does not implement (exec plugins, auth providers) is
    loaded by the `kubernetes` package instead, imported only then: people run `explain`/`status` with cloud
    kubeconfigs, while the kubelet plugin, in-cluster, never pays for that import."""
    try:
        transport = HttpTransport.for_connection(load_connection(kubeconfig))
    except UnsupportedKubeconfig as exc:
        from dra_driver.k8s.fallback import kubernetes_transport

        log.info("loading the kubeconfig with the kubernetes package: %s", exc)
        transport = kubernetes_transport(kubeconfig)
    return KubeRest(transport, timeout, user_agent=product_user_agent(component))


class RequestOptions(TypedDict, total=False):
    """The options of `KubeRest.request`, which it passes on to `_send` (their defaults are its): `body` goes as it
    is when bytes, else JSON-encoded; `timeout` replaces the client's."""

    query: Mapping[str, str | int | bool] | None
    body: Any
    content_type: str
    timeout: float | None


class KubeRest:
    """JSON in, JSON out. Errors become ApiError; nothing here retries (callers decide) beyond the transport's
    retries of a connection that failed and of an idempotent request answered with Retry-After (`transport.py`)."""

    def __init__(self, transport: HttpTransport | ApiConnection, timeout: float = 10.0, *,
                 user_agent: str = USER_AGENT) -> None:
        self.transport = transport if isinstance(transport, HttpTransport) else HttpTransport.for_connection(transport)
        self.timeout = timeout
        self.user_agent = user_agent

    def request(self, method: str, path: str, **options: Unpack[RequestOptions]) -> JsonObject:
        """The answer's JSON object; ApiError for a status that is not 2xx."""
        response = self._send(method, path, **options)
        data = decode_json(response.data)
        if not 200 <= response.status < 300:
            raise ApiError(response.status, str(response.reason or ""), data)
        return data

    def get(
        self, path: str, *, query: Mapping[str, str | int | bool] | None = None, timeout: float | None = None
    ) -> JsonObject | None:
        """The object, or None when it does not exist."""
        try:
            return self.request("GET", path, query=query, timeout=timeout)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    def watch(
        self, path: str, *, query: Mapping[str, str | int | bool] | None = None, timeout_seconds: int = 60
    ) -> WatchStream:
        """Watch events ({"type", "object"}) until the server closes the stream or `close()` is called."""
        params = {**(query or {}), "watch": "true", "timeoutSeconds": timeout_seconds}
        response = self.send_streaming("GET", path, query=params, timeout=timeout_seconds + 15.0)
        if not 200 <= response.status < 300:
            try:
                raw = response.read()
            except (urllib3.exceptions.HTTPError, OSError):
                raw = b""
            finally:
                response.release_conn()
            raise ApiError(response.status, str(response.reason or ""), decode_json(raw))
        return WatchStream(path, response)

    def request_bytes(
        self, method: str, path: str, *, query: Mapping[str, str | int | bool] | None = None
    ) -> bytes:
        """The answer's body undecoded (the caller decodes what it needs of it); ApiError as `request`."""
        response = self._send(method, path, query=query)
        if not 200 <= response.status < 300:
            raise ApiError(response.status, str(response.reason or ""), decode_json(response.data))
        return bytes(response.data or b"")

    def send_streaming(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int | bool] | None = None,
        timeout: float | None = None,
    ) -> urllib3.BaseHTTPResponse:
        """The response unread, whatever its status (the caller reads it, then releases it): for a watch and for
        bodies decoded as they arrive (`liststream.py`)."""
        headers = {"Accept": "application/json", "User-Agent": self.user_agent}
        try:
            return self.transport.send(
                method, path, query=_params(query), headers=headers, timeout=timeout or self.timeout, stream=True
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, f"{method} {path}: {exc}") from exc

    def credentials(self) -> ApiConnection:
        """Where the server is and the credentials current now (kopf makes its own connections from them)."""
        return self.transport.credentials()

    def close(self) -> None:
        """Closes the pooled connections (a later request opens new ones)."""
        self.transport.close()

    def __enter__(self) -> KubeRest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int | bool] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Reply:
        """The answer read whole (over a kept-alive connection where the transport has them)."""
        headers = {"Accept": "application/json", "User-Agent": self.user_agent}
        payload: bytes | None = None
        if body is not None:
            headers["Content-Type"] = content_type
            payload = body if isinstance(body, bytes) else encode_json(body)
        try:
            return self.transport.send(
                method, path, query=_params(query), headers=headers, body=payload, timeout=timeout or self.timeout
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, f"{method} {path}: {exc}") from exc


def _params(query: Mapping[str, str | int | bool] | None) -> list[tuple[str, str]]:
    return [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in (query or {}).items()]


_DECODER: msgspec.json.Decoder[Any] = msgspec.json.Decoder()
# What Go's encoding/json escapes in strings beyond JSON's minimum (HTML-safe output), as it writes it.
_GO_ESCAPES: tuple[tuple[str, str], ...] = (
    ("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"),
)
_GO_ESCAPES_UTF8: tuple[tuple[bytes, bytes], ...] = tuple((a.encode(), b.encode()) for a, b in _GO_ESCAPES)


def go_escaped(text: str) -> str:
    """JSON text with the characters Go's encoding/json escapes (_GO_ESCAPES) escaped as it escapes them."""
    for plain, escaped in _GO_ESCAPES:
        text = text.replace(plain, escaped)
    return text


def encode_json(body: Any) -> bytes:
    """A request body exactly as Go's encoding/json would write it: compact, keys in the caller's order, `<`, `>`,
    `&`, U+2028 and U+2029 escaped. kube-apiserver keeps an opaque config's `parameters` (a RawExtension) as the
    bytes it was sent, and every JSON patch or update re-encodes it the Go way; bytes that differ (a space after a
    colon is enough) then read as a change, and a write of `status.devices` is refused 422 "status.allocation ...
    field cannot be modified once set" (docs/kubelet-plugin.md "Device status in the claim")."""
    raw = msgspec.json.encode(body)
    for plain, escaped in _GO_ESCAPES_UTF8:
        if plain in raw:
            raw = raw.replace(plain, escaped)
    return raw


def decode_json(raw: bytes | None, *, strict: bool = False) -> JsonObject:
    """The product's one JSON decoder for API answers: msgspec, which also decodes typed views of only some fields
    (`allocation/prune.py`, `liststream.py`; figures in docs/benchmarks.md, "Explain over the fleet"). `strict`:
    raise ValueError for what is not a JSON object; else such a body becomes {"message": its start} (an error
    page) or {"items": value}."""
    if not raw:
        if strict:
            raise ValueError("empty")
        return {}
    try:
        value = _DECODER.decode(raw)
    except msgspec.DecodeError:
        if strict:
            raise
        return {"message": raw[:500].decode(errors="replace")}
    if isinstance(value, dict):
        return value
    if strict:
        raise ValueError(f"not a JSON object: {type(value).__name__}")
    return {"items": value}



class WatchStream:
    """An open watch: iterate for events; `close()` from any thread ends the iteration promptly."""

    def __init__(self, path: str, raw: Any) -> None:
        self._path = path
        self._raw = raw
        self._closed = False

    def close(self) -> None:
        self._closed = True
        # urllib3's shutdown interrupts a read blocked in another thread; release alone would not.
        with contextlib.suppress(Exception):
            self._raw.shutdown()

    def __iter__(self) -> Iterator[JsonObject]:
        buffer = b""
        try:
            for chunk in self._raw.stream(4096, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield decode_json(line, strict=True)
            if buffer.strip():
                yield decode_json(buffer, strict=True)
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            if not self._closed:
                raise ApiError(0, f"watch {self._path}: {exc}") from exc
        finally:
            with contextlib.suppress(Exception):
                self._raw.release_conn()
