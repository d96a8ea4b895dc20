"""Where the API server is and how to prove who we are: kubeconfig files and the in-cluster service account.

The product's own loader, so that the kubelet plugin reaches the API without importing the `kubernetes` package
(its `kubernetes.config` alone costs about half a second of start-up: oauthlib, requests, pydantic, yaml, the
dynamic client; docs/benchmarks.md "Kubelet-plugin start-up"). It reads what a node agent and a person with a
kubeconfig need:

- clusters: `server`, `certificate-authority` / `certificate-authority-data`, `insecure-skip-tls-verify`,
  `tls-server-name`, `proxy-url` (http/https proxies);
- users: `token`, `tokenFile` (re-read while running: see `transport.TokenSource`), `client-certificate` /
  `client-key` (files or `-data`), `username` / `password`;
- `current-context`, `contexts` (cluster, user, namespace), several files in `$KUBECONFIG` merged the way kubectl
  merges them (the first file that names an entry or sets `current-context` wins), paths relative to the file
  that holds them;
- in-cluster: `KUBERNETES_SERVICE_HOST` / `KUBERNETES_SERVICE_PORT` and the service account's token, CA and
  namespace files (the token is a bound token the kubelet rotates: it is a `token_file`, never read once).

What it does not implement raises `UnsupportedKubeconfig`: exec credential plugins, `auth-provider`,
impersonation (`as`, `as-groups`, ...) and SOCKS proxies. `client.connect` then falls back to the `kubernetes`
package (imported only then), so `dra-driver explain` or `status` run by a person with a cloud kubeconfig (EKS, GKE,
AKS all use exec plugins) keep working; the kubelet plugin in a pod never takes that path.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.errors import DraDriverError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# What a user entry may hold that this loader leaves to the `kubernetes` package.
UNSUPPORTED_USER_FIELDS = ("exec", "auth-provider", "as", "as-uid", "as-groups", "as-user-extra")


class KubeconfigError(DraDriverError):
    """A kubeconfig (or the in-cluster environment) that cannot give a connection; the message names the field."""


class UnsupportedKubeconfig(KubeconfigError):
    """Valid, but needs something only the `kubernetes` package implements (an exec plugin, an auth provider)."""


@dataclass(frozen=True)
class ApiConnection:
    """Everything needed to reach one API server as one user. Secrets stay out of `repr` (it ends up in logs)."""

    server: str  # https://host:port[/prefix]
    ca_file: str | None = None
    ca_data: bytes | None = None  # PEM
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = field(default=None, repr=False)  # PEM
    key_data: bytes | None = field(default=None, repr=False)  # PEM
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None  # re-read while running; `token` is used while it cannot be read
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    insecure: bool = False  # insecure-skip-tls-verify
    tls_server_name: str | None = None
    proxy_url: str | None = None
    namespace: str = "default"
    source: str = ""  # where it came from, for messages: "kubeconfig FILE, context C" or "in-cluster"


def load_connection(
    kubeconfig: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
    home: Path | None = None,
) -> ApiConnection:
    """An explicit kubeconfig; else in-cluster (service host set and a token mounted); else `$KUBECONFIG` (a list of
    files, merged) or ~/.kube/config. The same order the driver used with `kubernetes.config`."""
    env = os.environ if environ is None else environ
    if kubeconfig:
        return from_kubeconfig([Path(kubeconfig)])
    if env.get("KUBERNETES_SERVICE_HOST") and (service_account_dir / "token").exists():
        return in_cluster(env, service_account_dir)
    listed = [Path(p).expanduser() for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        # kubectl skips files of the list that do not exist; all of them missing is an error.
        existing = [p for p in listed if p.exists()]
        if not existing:
            raise KubeconfigError(f"none of the files in $KUBECONFIG exists: {os.pathsep.join(map(str, listed))}")
        return from_kubeconfig(existing)
    return from_kubeconfig([(home or Path.home()) / ".kube" / "config"])


def in_cluster(environ: Mapping[str, str], service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> ApiConnection:
    """The pod's service account: the API server's Service from the environment, the token the kubelet mounts
    (and rotates), the cluster CA and the pod's namespace."""
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        missing = "KUBERNETES_SERVICE_HOST" if not host else "KUBERNETES_SERVICE_PORT"
        raise KubeconfigError(f"in-cluster: {missing} is not set")
    token = service_account_dir / "token"
    ca = service_account_dir / "ca.crt"
    try:
        if not token.read_text().strip():
            raise KubeconfigError(f"in-cluster: the service account token {token} is empty")
    except OSError as exc:
        raise KubeconfigError(f"in-cluster: cannot read the service account token {token}: {exc}") from exc
    if not ca.is_file():
        raise KubeconfigError(f"in-cluster: the service account CA {ca} does not exist")
    try:
        namespace = (service_account_dir / "namespace").read_text().strip() or "default"
    except OSError:
        namespace = "default"
    bracketed = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return ApiConnection(
        server=f"https://{bracketed}:{port}",
        ca_file=str(ca),
        token_file=str(token),
        namespace=namespace,
        source="in-cluster",
    )


@dataclass(frozen=True)
class _Entry:
    """A named cluster, user or context of one file, with that file's directory for relative paths."""

    value: Mapping[str, Any]
    base: Path


def from_kubeconfig(paths: Sequence[Path]) -> ApiConnection:
    """The current context of the merged files."""
    clusters: dict[str, _Entry] = {}
    users: dict[str, _Entry] = {}
    contexts: dict[str, _Entry] = {}
    current = ""
    for path in paths:
        doc = _read(path)
        base = path.parent
        for key, into, inner in (
            ("clusters", clusters, "cluster"),
            ("users", users, "user"),
            ("contexts", contexts, "context"),
        ):
            items = doc.get(key) or []
            if not isinstance(items, list):
                raise KubeconfigError(f"kubeconfig {path}: {key} is not a list")
            for item in items:
                if not isinstance(item, Mapping) or not item.get("name"):
                    raise KubeconfigError(f"kubeconfig {path}: an entry of {key} has no name")
                value = item.get(inner) or {}
                if not isinstance(value, Mapping):
                    raise KubeconfigError(f"kubeconfig {path}: {key}[{item['name']}].{inner} is not a mapping")
                into.setdefault(str(item["name"]), _Entry(value, base))
        current = current or str(doc.get("current-context") or "")
    files = ", ".join(map(str, paths))
    if not current:
        raise KubeconfigError(f"kubeconfig {files}: current-context is not set")
    if current not in contexts:
        raise KubeconfigError(f"kubeconfig {files}: current-context {current!r} is not in contexts")
    context = contexts[current].value
    where = f"kubeconfig {files}, context {current}"
    cluster_name = str(context.get("cluster") or "")
    if not cluster_name:
        raise KubeconfigError(f"{where}: contexts[{current}].context.cluster is not set")
    if cluster_name not in clusters:
        raise KubeconfigError(f"{where}: cluster {cluster_name!r} is not in clusters")
    user_name = str(context.get("user") or "")
    if user_name and user_name not in users:
        raise KubeconfigError(f"{where}: user {user_name!r} is not in users")
    cluster = clusters[cluster_name]
    user = users[user_name] if user_name else _Entry({}, Path("."))
    return _connection(
        cluster,
        user,
        namespace=str(context.get("namespace") or "default"),
        where=where,
        cluster_name=cluster_name,
        user_name=user_name,
    )


def _connection(
    cluster: _Entry, user: _Entry, *, namespace: str, where: str, cluster_name: str, user_name: str
) -> ApiConnection:
    c, u = cluster.value, user.value
    for name in UNSUPPORTED_USER_FIELDS:
        if u.get(name):
            raise UnsupportedKubeconfig(f"{where}: users[{user_name}].user.{name} is not implemented by dra-driver")
    server = str(c.get("server") or "")
    if not server:
        raise KubeconfigError(f"{where}: clusters[{cluster_name}].cluster.server is not set")
    proxy = str(c.get("proxy-url") or "") or None
    if proxy and not proxy.startswith(("http://", "https://")):
        raise UnsupportedKubeconfig(f"{where}: clusters[{cluster_name}].cluster.proxy-url {proxy!r} (only http/https)")
    cfield = f"clusters[{cluster_name}].cluster"
    ufield = f"users[{user_name}].user"
    insecure = c.get("insecure-skip-tls-verify", False)
    if isinstance(insecure, str) and insecure.lower() in ("true", "false"):
        insecure = insecure.lower() == "true"
    if not isinstance(insecure, bool):
        raise KubeconfigError(f"{where}: {cfield}.insecure-skip-tls-verify is not a boolean: {insecure!r}")
    return ApiConnection(
        server=server.rstrip("/"),
        ca_file=_path(c, "certificate-authority", cluster.base),
        ca_data=_data(c, "certificate-authority-data", f"{where}: {cfield}"),
        cert_file=_path(u, "client-certificate", user.base),
        key_file=_path(u, "client-key", user.base),
        cert_data=_data(u, "client-certificate-data", f"{where}: {ufield}"),
        key_data=_data(u, "client-key-data", f"{where}: {ufield}"),
        token=str(u.get("token") or "") or None,
        token_file=_path(u, "tokenFile", user.base),
        username=str(u.get("username") or "") or None,
        password=str(u.get("password") or "") or None,
        insecure=insecure,
        tls_server_name=str(c.get("tls-server-name") or "") or None,
        proxy_url=proxy,
        namespace=namespace,
        source=where,
    )


def _read(path: Path) -> Mapping[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise KubeconfigError(f"kubeconfig {path}: {exc.strerror or exc}") from exc
    doc: Any
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise KubeconfigError(f"kubeconfig {path}: not valid JSON: {exc}") from exc
    else:
        import yaml  # only for a kubeconfig file: the in-cluster path needs no YAML

        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise KubeconfigError(f"kubeconfig {path}: not valid YAML: {exc}") from exc
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise KubeconfigError(f"kubeconfig {path}: not a mapping")
    return doc


def _path(entry: Mapping[str, Any], key: str, base: Path) -> str | None:
    value = str(entry.get(key) or "")
    if not value:
        return None
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else base / path)


def _data(entry: Mapping[str, Any], key: str, where: str) -> bytes | None:
    value = entry.get(key)
    if not value:
        return None
    try:
        # Line breaks inside the base64 are tolerated, as client-go tolerates them.
        return base64.b64decode("".join(str(value).split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KubeconfigError(f"{where}.{key} is not base64: {exc}") from exc
