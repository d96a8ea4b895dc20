"""HTTP to the API server over urllib3, from an `ApiConnection`: TLS, credentials, proxies, a connection pool.

`KubeRest` sends every request through an `HttpTransport`: a base URL, a urllib3 pool manager and an `Auth`
that gives each request its headers (and kopf its credentials). The product's own `ConnectionAuth` serves
kubeconfig and in-cluster connections; `fallback.py` builds the same transport from the `kubernetes` package's
configuration for the kubeconfigs this loader does not implement.

Behaviour kept from the `kubernetes` client it replaces: urllib3's default retries (connection errors; a GET
answered 503/429 with `Retry-After` is repeated up to three times), redirects followed, one total timeout per
request, proxies from `HTTPS_PROXY`/`NO_PROXY` (as client-go), and at least as many pooled connections.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode, urlsplit

import urllib3

from dra_driver.k8s.kubeconfig import ApiConnection, KubeconfigError, UnsupportedKubeconfig

# The kubelet plugin's 64 gRPC workers each GET their claim during a prepare, beside its background loops
# (publisher and its watch, events, health, usage, cleanup). The `kubernetes` client kept cpu_count * 5 per host:
# never fewer than that either.
MIN_POOL_SIZE = 80
# A projected service-account token is rotated by the kubelet (by default hourly, valid longer); client-go
# re-reads the file every minute. Here: whenever the file changes, and at least this often.
TOKEN_REREAD_S = 60.0


def pool_size() -> int:
    return max(MIN_POOL_SIZE, (os.cpu_count() or 1) * 5)


class Auth(Protocol):
    def headers(self) -> Mapping[str, str]:
        """Headers for the next request (a fresh token when it rotated)."""
        ...

    def credentials(self) -> ApiConnection:
        """The connection with the token current now (for kopf, which makes its own connections)."""
        ...


@dataclass(eq=False, repr=False)  # no repr: `fallback` is a secret
class TokenSource:
    """A bearer token read from `path`: re-read when the file changes (the kubelet swaps a projected token's
    symlink, which changes the inode) and at least every `reread_s` seconds; while the file cannot be read, the
    last token read, else `fallback` (a kubeconfig's `token` beside its `tokenFile`)."""

    path: str
    fallback: str | None = None
    _: KW_ONLY
    clock: Callable[[], float] = time.monotonic
    reread_s: float = TOKEN_REREAD_S
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _value: str | None = field(default=None, init=False)
    _signature: tuple[int, int, int] | None = field(default=None, init=False)
    _read_at: float = field(default=0.0, init=False)

    def token(self) -> str | None:
        with self._lock:
            try:
                st = os.stat(self.path)
                signature: tuple[int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
            except OSError:
                signature = None
            now = self.clock()
            if self._value is None or signature != self._signature or now - self._read_at >= self.reread_s:
                try:
                    value = Path(self.path).read_text().strip()
                except OSError:
                    value = ""
                if value:
                    self._value = value
                self._signature, self._read_at = signature, now
            return self._value or self.fallback


class ConnectionAuth:
    """Bearer token (static or from its file), else basic auth; client certificates live in the TLS context."""

    def __init__(self, connection: ApiConnection, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._connection = connection
        self._tokens = (
            TokenSource(connection.token_file, connection.token, clock=clock) if connection.token_file else None
        )
        self._basic: Mapping[str, str] = {}
        if connection.username and connection.password is not None:
            pair = f"{connection.username}:{connection.password}".encode()
            self._basic = {"Authorization": "Basic " + base64.b64encode(pair).decode()}

    def _token(self) -> str | None:
        return self._tokens.token() if self._tokens is not None else self._connection.token

    def headers(self) -> Mapping[str, str]:
        token = self._token()
        return {"Authorization": f"Bearer {token}"} if token else self._basic

    def credentials(self) -> ApiConnection:
        return replace(self._connection, token=self._token())


class HttpTransport:
    """One API server: `send` a request, get urllib3's response (read, or streamed for a watch)."""

    def __init__(self, server: str, pool: urllib3.PoolManager, auth: Auth) -> None:
        self.server = server.rstrip("/")
        self.pool = pool
        self.auth = auth
        # Every request goes to one server: its connection pool is looked up once instead of per request (the
        # pool manager parses the URL and finds the pool on every call: ~0.1-0.2 ms of CPU per claim GET). A
        # proxy needs the pool manager's request forms, and a redirect its cross-host rules: both go through it.
        self._prefix = urlsplit(self.server).path
        self._direct: urllib3.HTTPConnectionPool | None = None
        self._direct_lock = threading.Lock()

    @classmethod
    def for_connection(
        cls,
        connection: ApiConnection,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        maxsize: int | None = None,
    ) -> HttpTransport:
        env = os.environ if environ is None else environ
        return cls(
            connection.server,
            connection_pool(connection, environ=env, maxsize=maxsize or pool_size()),
            ConnectionAuth(connection, clock=clock),
        )

    def send(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        timeout: float,
        stream: bool = False,
    ) -> urllib3.BaseHTTPResponse:
        """Raises urllib3's errors (HTTPError) or OSError when the server is not reached; any status is returned."""
        if query:
            path += ("&" if "?" in path else "?") + urlencode(query)
        # The same request either way below.
        request: dict[str, Any] = {
            "body": body,
            "headers": {**(headers or {}), **self.auth.headers()},
            "timeout": urllib3.Timeout(total=timeout),
            "preload_content": not stream,
        }
        direct = self._direct_pool()
        if direct is not None:
            response = direct.urlopen(method, self._prefix + path, redirect=False, assert_same_host=False, **request)
            if not response.get_redirect_location():
                return response
            # A redirect (an API server does not send them, a front proxy might): asked again through the pool
            # manager, which follows it as before (the server did not act on a request it redirected).
            response.drain_conn()
            response.release_conn()
        return self.pool.request(method, self.server + path, **request)

    def _direct_pool(self) -> urllib3.HTTPConnectionPool | None:
        if isinstance(self.pool, urllib3.ProxyManager):
            return None
        direct = self._direct
        if direct is None:
            with self._direct_lock:
                direct = self._direct = self._direct or self.pool.connection_from_url(self.server)
        return direct

    def credentials(self) -> ApiConnection:
        return self.auth.credentials()

    def close(self) -> None:
        with self._direct_lock:
            self._direct = None
        self.pool.clear()


def connection_pool(connection: ApiConnection, *, environ: Mapping[str, str], maxsize: int) -> urllib3.PoolManager:
    options: dict[str, object] = {"maxsize": maxsize}
    if urlsplit(connection.server).scheme == "https":
        options["ssl_context"] = ssl_context(connection)
        options["cert_reqs"] = ssl.CERT_NONE if connection.insecure else ssl.CERT_REQUIRED
        if connection.insecure:
            options["assert_hostname"] = False
        if connection.tls_server_name:
            options["server_hostname"] = connection.tls_server_name
    proxy = connection.proxy_url or environment_proxy(connection.server, environ)
    if proxy is None:
        return urllib3.PoolManager(**options)  # type: ignore[arg-type]
    if not proxy.startswith(("http://", "https://")):
        raise UnsupportedKubeconfig(f"{connection.source}: proxy {proxy!r} (only http/https proxies are implemented)")
    return urllib3.ProxyManager(proxy, **options)  # type: ignore[arg-type]


def ssl_context(connection: ApiConnection) -> ssl.SSLContext:
    """Server verification from the CA (file and/or data; the system's CAs when neither), the client certificate."""
    try:
        context = ssl.create_default_context(
            cafile=connection.ca_file, cadata=connection.ca_data.decode() if connection.ca_data else None
        )
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise KubeconfigError(f"{connection.source}: cannot load the certificate authority: {exc}") from exc
    if connection.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    has_cert = bool(connection.cert_file or connection.cert_data)
    has_key = bool(connection.key_file or connection.key_data)
    if has_cert != has_key:
        missing = "client-key" if has_cert else "client-certificate"
        raise KubeconfigError(f"{connection.source}: {missing} (or {missing}-data) is not set")
    if has_cert:
        try:
            _load_client_certificate(context, connection)
        except (OSError, ssl.SSLError) as exc:
            raise KubeconfigError(f"{connection.source}: cannot load the client certificate/key: {exc}") from exc
    return context


def _load_client_certificate(context: ssl.SSLContext, connection: ApiConnection) -> None:
    if connection.cert_file and connection.key_file:
        context.load_cert_chain(connection.cert_file, connection.key_file)
        return
    # Python's ssl loads a certificate chain only from files: the -data forms are written to a private (0700)
    # directory for the duration of the call, then removed; the context keeps what it loaded.
    with tempfile.TemporaryDirectory(prefix="dra-driver-tls-") as tmp:
        cert = connection.cert_file or _private_file(Path(tmp) / "tls.crt", connection.cert_data or b"")
        key = connection.key_file or _private_file(Path(tmp) / "tls.key", connection.key_data or b"")
        context.load_cert_chain(cert, key)


def _private_file(path: Path, data: bytes) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return str(path)


def environment_proxy(server: str, environ: Mapping[str, str]) -> str | None:
    """`<scheme>_proxy` / `<SCHEME>_PROXY` for the server's scheme unless `no_proxy` / `NO_PROXY` exempts it, as
    client-go (and the `kubernetes` client since 35) read them."""
    parts = urlsplit(server)
    scheme = parts.scheme.lower()
    proxy = environ.get(f"{scheme}_proxy") or environ.get(f"{scheme.upper()}_PROXY")
    if not proxy:
        return None
    exempt = environ.get("no_proxy") or environ.get("NO_PROXY") or ""
    return None if bypasses_proxy(parts.hostname or "", parts.port, exempt) else proxy


def bypasses_proxy(host: str, port: int | None, no_proxy: str) -> bool:
    """`*`, a host or domain suffix (`example.com`, `.example.com`), `host:port`, or a CIDR (for IP hosts)."""
    host = host.lower().strip("[]")
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        if ip is not None:
            try:
                if ip in ipaddress.ip_network(entry.strip("[]"), strict=False):
                    return True
                continue
            except ValueError:
                pass
        name, _, entry_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if entry_port and entry_port != str(port):
            continue
        name = name.lstrip(".")
        if host == name or host.endswith("." + name):
            return True
    return False
