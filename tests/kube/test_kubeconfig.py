"""The product's API connection: kubeconfig and in-cluster loading, TLS and credentials against a real HTTPS
server, token files re-read, proxies from the environment, and the `kubernetes` fallback for exec plugins."""

from __future__ import annotations

import base64
import json
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml

from dra_driver.k8s.client import ApiError, KubeRest, connect
from dra_driver.k8s.fallback import KubernetesConfigAuth
from dra_driver.k8s.kubeconfig import (
    ApiConnection,
    KubeconfigError,
    UnsupportedKubeconfig,
    from_kubeconfig,
    in_cluster,
    load_connection,
)
from dra_driver.k8s.transport import (
    MIN_POOL_SIZE,
    ConnectionAuth,
    HttpTransport,
    TokenSource,
    bypasses_proxy,
    environment_proxy,
)
from tests.kube.tlsserver import Pki, https_server, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def server(pki: Pki) -> Iterator[str]:
    with https_server(pki) as url:
        yield url


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(
    path: Path, cluster: dict[str, Any], user: dict[str, Any] | None = None, *, namespace: str | None = None
) -> Path:
    context: dict[str, Any] = {"cluster": "c", "user": "u"}
    if namespace:
        context["namespace"] = namespace
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user or {}}],
        "contexts": [{"name": "ctx", "context": context}],
        "current-context": "ctx",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def rest_for(connection: ApiConnection) -> KubeRest:
    """No proxy from this process's environment: the test server is local."""
    return KubeRest(HttpTransport.for_connection(connection, environ={}), timeout=10)


def seen(rest: KubeRest) -> dict[str, Any]:
    """What the test server saw of the request: the Authorization header, the client certificate's CN."""
    return rest.request("GET", "/version")


def test_ca_data_and_a_token(tmp_path: Path, pki: Pki, server: str) -> None:
    path = write_kubeconfig(
        tmp_path / "config",
        {"server": server, "certificate-authority-data": b64(pki.path("ca.crt"))},
        {"token": "t-123"},
        namespace="gpu-system",
    )
    connection = load_connection(str(path))
    assert connection.ca_data == pki.path("ca.crt").read_bytes() and connection.ca_file is None
    assert (connection.server, connection.namespace) == (server, "gpu-system")
    assert "t-123" not in repr(connection)  # secrets stay out of logs
    rest = connect(str(path))
    assert isinstance(rest.transport.auth, ConnectionAuth)  # the product's own path, not the kubernetes package
    assert seen(rest) == {"authorization": "Bearer t-123", "client": None}
    assert rest.credentials().token == "t-123"


def test_client_certificate_files_relative_to_the_kubeconfig(tmp_path: Path, pki: Pki, server: str) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    for name in ("ca.crt", "client.crt", "client.key"):
        shutil.copy(pki.path(name), certs / name)
    path = write_kubeconfig(
        tmp_path / "config",
        {"server": server, "certificate-authority": "certs/ca.crt"},
        {"client-certificate": "certs/client.crt", "client-key": "certs/client.key"},
    )
    connection = from_kubeconfig([path])
    assert connection.cert_file == str(certs / "client.crt") and connection.ca_file == str(certs / "ca.crt")
    assert seen(rest_for(connection)) == {"authorization": None, "client": "node-agent"}


def test_client_certificate_data_leaves_no_files_behind(tmp_path: Path, pki: Pki, server: str) -> None:
    path = write_kubeconfig(
        tmp_path / "config",
        {"server": server, "certificate-authority-data": b64(pki.path("ca.crt"))},
        {"client-certificate-data": b64(pki.path("client.crt")), "client-key-data": b64(pki.path("client.key"))},
    )
    scratch = Path(tempfile.gettempdir())
    before = set(scratch.glob("dra-driver-tls-*"))
    rest = rest_for(from_kubeconfig([path]))
    assert set(scratch.glob("dra-driver-tls-*")) == before
    assert seen(rest) == {"authorization": None, "client": "node-agent"}


def test_a_client_certificate_without_its_key_is_refused(tmp_path: Path, pki: Pki, server: str) -> None:
    path = write_kubeconfig(
        tmp_path / "config", {"server": server}, {"client-certificate-data": b64(pki.path("client.crt"))}
    )
    with pytest.raises(KubeconfigError, match="client-key"):
        rest_for(from_kubeconfig([path]))


def test_token_file_beats_token_and_token_is_the_fallback(tmp_path: Path, pki: Pki, server: str) -> None:
    (tmp_path / "token").write_text("from-file\n")
    path = write_kubeconfig(
        tmp_path / "config",
        {"server": server, "certificate-authority": str(pki.path("ca.crt"))},
        {"tokenFile": "token", "token": "static"},
    )
    rest = rest_for(from_kubeconfig([path]))
    assert seen(rest)["authorization"] == "Bearer from-file"
    unreadable = write_kubeconfig(
        tmp_path / "config2",
        {"server": server, "certificate-authority": str(pki.path("ca.crt"))},
        {"tokenFile": "missing", "token": "static"},
    )
    assert seen(rest_for(from_kubeconfig([unreadable])))["authorization"] == "Bearer static"


def test_insecure_skip_tls_verify(tmp_path: Path, server: str) -> None:
    """No CA: refused (status 0, the server was not reached), unless verification is skipped."""
    strict = write_kubeconfig(tmp_path / "strict", {"server": server}, {"token": "t"})
    with pytest.raises(ApiError) as refused:
        seen(rest_for(from_kubeconfig([strict])))
    assert refused.value.status == 0 and "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
    insecure = write_kubeconfig(
        tmp_path / "insecure", {"server": server, "insecure-skip-tls-verify": True}, {"token": "t"}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        assert seen(rest_for(from_kubeconfig([insecure])))["authorization"] == "Bearer t"


def test_tls_server_name_is_what_the_certificate_is_checked_against(tmp_path: Path, pki: Pki, server: str) -> None:
    by_name = server.replace("127.0.0.1", "localhost")  # not in the certificate
    cluster = {"server": by_name, "certificate-authority": str(pki.path("ca.crt"))}
    with pytest.raises(ApiError, match="localhost"):
        seen(rest_for(from_kubeconfig([write_kubeconfig(tmp_path / "a", cluster)])))
    named = write_kubeconfig(tmp_path / "b", {**cluster, "tls-server-name": "kube.test"})
    assert seen(rest_for(from_kubeconfig([named]))) == {"authorization": None, "client": None}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("current-context"), "current-context is not set"),
        (lambda d: d.update({"current-context": "nope"}), "current-context 'nope' is not in contexts"),
        (lambda d: d["contexts"][0]["context"].update(cluster="gone"), "cluster 'gone' is not in clusters"),
        (lambda d: d["contexts"][0]["context"].pop("cluster"), r"contexts\[ctx\].context.cluster is not set"),
        (lambda d: d["contexts"][0]["context"].update(user="who"), "user 'who' is not in users"),
        (lambda d: d["clusters"][0]["cluster"].pop("server"), r"clusters\[c\].cluster.server is not set"),
        (
            lambda d: d["clusters"][0]["cluster"].update({"certificate-authority-data": "not base64!"}),
            "certificate-authority-data is not base64",
        ),
        (
            lambda d: d["clusters"][0]["cluster"].update({"insecure-skip-tls-verify": "maybe"}),
            "insecure-skip-tls-verify is not a boolean",
        ),
    ],
)
def test_broken_kubeconfigs_name_the_field(tmp_path: Path, change: Any, message: str) -> None:
    path = write_kubeconfig(tmp_path / "config", {"server": "https://127.0.0.1:6443"}, {"token": "t"})
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(KubeconfigError, match=message) as err:
        load_connection(str(path))
    assert str(path) in str(err.value)


def test_kubeconfig_list_merges_first_wins_and_skips_missing_files(tmp_path: Path) -> None:
    first = {
        "current-context": "work",
        "contexts": [{"name": "work", "context": {"cluster": "shared", "user": "me", "namespace": "team"}}],
        "users": [{"name": "me", "user": {"token": "first"}}],
    }
    second = {
        "current-context": "other",
        "contexts": [{"name": "work", "context": {"cluster": "elsewhere", "user": "me"}}],
        "clusters": [{"name": "shared", "cluster": {"server": "https://shared:6443"}}],
        "users": [{"name": "me", "user": {"token": "second"}}],
    }
    (tmp_path / "a").write_text(yaml.safe_dump(first))
    (tmp_path / "b.json").write_text(json.dumps(second))  # JSON is a kubeconfig too
    listed = os.pathsep.join(str(tmp_path / n) for n in ("missing", "a", "b.json"))
    connection = load_connection(environ={"KUBECONFIG": listed}, home=tmp_path)
    assert (connection.server, connection.token, connection.namespace) == ("https://shared:6443", "first", "team")
    with pytest.raises(KubeconfigError, match=r"none of the files in \$KUBECONFIG"):
        load_connection(environ={"KUBECONFIG": str(tmp_path / "missing")})


def service_account(directory: Path, pki: Pki, token: str) -> Path:
    directory.mkdir(exist_ok=True)
    shutil.copy(pki.path("ca.crt"), directory / "ca.crt")
    (directory / "token").write_text(token)
    (directory / "namespace").write_text("gpu-system\n")
    return directory


def test_in_cluster_from_the_environment(tmp_path: Path, pki: Pki) -> None:
    sa = service_account(tmp_path / "sa", pki, "sa-token")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    connection = load_connection(environ=env, service_account_dir=sa)
    assert connection == ApiConnection(
        server="https://10.96.0.1:443",
        ca_file=str(sa / "ca.crt"),
        token_file=str(sa / "token"),
        namespace="gpu-system",
        source="in-cluster",
    )
    assert in_cluster({**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}, sa).server == "https://[fd00::1]:443"
    with pytest.raises(KubeconfigError, match="KUBERNETES_SERVICE_PORT is not set"):
        in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, sa)
    (sa / "token").write_text("")
    with pytest.raises(KubeconfigError, match=r"token .* is empty"):
        in_cluster(env, sa)
    # Without the service host it is not in-cluster: $KUBECONFIG applies.
    config = write_kubeconfig(tmp_path / "config", {"server": "https://elsewhere:6443"})
    assert load_connection(environ={"KUBECONFIG": str(config)}, service_account_dir=sa).server == (
        "https://elsewhere:6443"
    )


def test_a_rotated_service_account_token_is_sent_from_the_next_request(tmp_path: Path, pki: Pki, server: str) -> None:
    """The kubelet rotates a projected token by swapping the file (a new inode): the next request carries it."""
    sa = service_account(tmp_path / "sa", pki, "sa-1")
    port = server.rsplit(":", 1)[1]
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
    rest = rest_for(load_connection(environ=env, service_account_dir=sa))
    assert seen(rest)["authorization"] == "Bearer sa-1"
    (sa / "token.new").write_text("sa-2")
    os.replace(sa / "token.new", sa / "token")
    assert seen(rest)["authorization"] == "Bearer sa-2"
    assert rest.credentials().token == "sa-2"  # what kopf gets when it logs in again


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_token_file_is_read_again_at_least_every_minute(tmp_path: Path) -> None:
    """Even a change the file's identity does not show (same inode, size and mtime) is picked up within a
    minute; a file that cannot be read keeps the last token."""
    path = tmp_path / "token"
    path.write_text("aaaa")
    clock = Clock()
    tokens = TokenSource(str(path), clock=clock)
    assert tokens.token() == "aaaa"
    st = path.stat()
    with path.open("r+") as fh:
        fh.write("bbbb")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    clock.now += 59
    assert tokens.token() == "aaaa"
    clock.now += 1
    assert tokens.token() == "bbbb"
    path.unlink()
    clock.now += 60
    assert tokens.token() == "bbbb"


def test_exec_credential_plugins_fall_back_to_the_kubernetes_package(tmp_path: Path, pki: Pki, server: str) -> None:
    """A cloud kubeconfig (exec plugin) still works for people running explain/status: the credentials come
    from `kubernetes.config`, the requests from the same transport."""
    plugin = tmp_path / "credential.py"
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "kind": "ExecCredential",
        "status": {"token": "from-exec"},
    }
    plugin.write_text(f"import json\nprint(json.dumps({credential!r}))\n")
    exec_user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": sys.executable,
            "args": [str(plugin)],
        }
    }
    path = write_kubeconfig(
        tmp_path / "config", {"server": server, "certificate-authority": str(pki.path("ca.crt"))}, exec_user
    )
    with pytest.raises(UnsupportedKubeconfig, match=r"users\[u\].user.exec"):
        load_connection(str(path))
    rest = connect(str(path))
    assert isinstance(rest.transport.auth, KubernetesConfigAuth)
    assert seen(rest) == {"authorization": "Bearer from-exec", "client": None}
    assert rest.credentials().token == "from-exec"


def test_the_pool_keeps_enough_connections_for_the_plugins_prepare_threads(tmp_path: Path) -> None:
    rest = rest_for(ApiConnection(server="http://127.0.0.1:1"))
    assert rest.transport.pool.connection_pool_kw["maxsize"] >= MIN_POOL_SIZE >= 64


@pytest.mark.parametrize(
    ("host", "port", "no_proxy", "bypassed"),
    [
        ("10.96.0.1", 443, "", False),
        ("10.96.0.1", 443, "*", True),
        ("10.96.0.1", 443, "10.0.0.0/8", True),
        ("10.96.0.1", 443, "192.168.0.0/16, 10.96.0.1", True),
        ("api.example.com", 6443, ".example.com", True),
        ("api.example.com", 6443, "example.com", True),
        ("api.example.com", 6443, "ample.com", False),
        ("api.example.com", 6443, "api.example.com:443", False),
        ("api.example.com", 6443, "api.example.com:6443", True),
        ("fd00::1", 443, "fd00::/8", True),
    ],
)
def test_no_proxy_rules(host: str, port: int, no_proxy: str, bypassed: bool) -> None:
    assert bypasses_proxy(host, port, no_proxy) is bypassed


def test_environment_proxy_by_scheme() -> None:
    env = {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "10.0.0.0/8"}
    assert environment_proxy("https://api.example.com:6443", env) == "http://proxy:3128"
    assert environment_proxy("https://10.96.0.1:443", env) is None
    assert environment_proxy("http://api.example.com", env) is None  # no http_proxy set
