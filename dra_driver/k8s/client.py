"""Building an API client, and a small JSON REST layer over it.

The driver works with plain JSON objects (what the API server sends) rather than the generated models:
ResourceSlices are built as dicts, claims are read as dicts, and nothing is lost in a model round trip
when the API adds fields.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.config
import urllib3.exceptions

from dra_driver.errors import DraDriverError

JsonObject = dict[str, Any]


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


def load_api_client(kubeconfig: str | None = None) -> kubernetes.client.ApiClient:
    """Explicit kubeconfig, else in-cluster service account, else $KUBECONFIG / ~/.kube/config."""
    configuration = kubernetes.client.Configuration()
    if kubeconfig:
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=configuration
        )
    elif (
        os.environ.get("KUBERNETES_SERVICE_HOST")
        and Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists()
    ):
        kubernetes.config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        kubernetes.config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return kubernetes.client.ApiClient(configuration)


class KubeRest:
    """JSON in, JSON out. Errors become ApiError; nothing here retries (callers decide)."""

    def __init__(self, api_client: kubernetes.client.ApiClient, timeout: float = 10.0) -> None:
        self.api_client = api_client
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int | bool] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> JsonObject:
        response = self._send(method, path, query=query, body=body, content_type=content_type, timeout=timeout)
        try:
            raw = response.read()
        except urllib3.exceptions.HTTPError as exc:
            raise ApiError(0, f"{method} {path}: {exc}") from exc
        data = _json(raw)
        if not 200 <= response.status < 300:
            raise ApiError(response.status, str(response.reason or ""), data)
        return data

    def get(self, path: str, *, timeout: float | None = None) -> JsonObject | None:
        """The object, or None when it does not exist."""
        try:
            return self.request("GET", path, timeout=timeout)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    def watch(
        self, path: str, *, query: Mapping[str, str | int | bool] | None = None, timeout_seconds: int = 60
    ) -> WatchStream:
        """Watch events ({"type", "object"}) until the server closes the stream or `close()` is called."""
        params = {**(query or {}), "watch": "true", "timeoutSeconds": timeout_seconds}
        response = self._send("GET", path, query=params, timeout=timeout_seconds + 15.0)
        if not 200 <= response.status < 300:
            raise ApiError(response.status, str(response.reason or ""), _json(response.read()))
        return WatchStream(path, response.response)

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int | bool] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        params: Sequence[tuple[str, str]] = [
            (k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in (query or {}).items()
        ]
        method_, url, header_params, serialized, post = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(params),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            return self.api_client.call_api(
                method_,
                url,
                header_params=header_params,
                body=serialized,
                post_params=post,
                _request_timeout=timeout or self.timeout,
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, f"{method} {path}: {exc}") from exc
        except kubernetes.client.ApiException as exc:  # pragma: no cover - call_api does not raise on status
            raise ApiError(int(exc.status or 0), str(exc.reason)) from exc


def _json(raw: bytes | None) -> JsonObject:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {"message": raw[:500].decode(errors="replace")}
    return value if isinstance(value, dict) else {"items": value}


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
                        yield json.loads(line)
            if buffer.strip():
                yield json.loads(buffer)
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            if not self._closed:
                raise ApiError(0, f"watch {self._path}: {exc}") from exc
        finally:
            with contextlib.suppress(Exception):
                self._raw.release_conn()
