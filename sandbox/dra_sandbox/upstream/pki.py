"""The certificates and keys of a local upstream control plane (docs/upstream.md "Certificates"), made with the
openssl command line (no shell; `cryptography` is not among the locked dependencies).

One directory holds: the cluster CA (`ca.crt`/`ca.key`: signs the API server's serving certificate and every client
certificate, and kube-controller-manager signs CSRs with it), the front-proxy CA and client (the aggregation
layer's request-header authentication, as kubeadm sets it up), the service-account key pair, and one client
certificate per identity. Keys are ECDSA P-256 (fast to make on 2 cores; every component accepts them) and mode
0600; the directory is 0700. Everything is valid for a year: a sandbox lives for hours.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import secrets
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from dra_sandbox.paths import Below

DAYS = "365"
KEY_MODE = 0o600


class PkiError(RuntimeError):
    pass


def _openssl(directory: Path, *args: str) -> None:
    out = subprocess.run(["openssl", *args], cwd=directory, capture_output=True, text=True, check=False, timeout=60)
    if out.returncode != 0:
        raise PkiError(f"openssl {args[0]} failed in {directory}: {out.stderr.strip()[-800:]}")


def _new_key(directory: Path, name: str) -> Path:
    key = directory / f"{name}.key"
    _openssl(directory, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key.name)
    key.chmod(KEY_MODE)
    return key


@dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """The files of one control plane's PKI (paths only; `make_pki` writes them)."""

    root: Path

    service_account_key = Below("sa.key")
    service_account_pub = Below("sa.pub")

    @property
    def ca(self) -> CertPair:
        return self.pair("ca")

    @property
    def front_proxy_ca(self) -> CertPair:
        return self.pair("front-proxy-ca")

    def pair(self, name: str) -> CertPair:
        return CertPair(self.root / f"{name}.crt", self.root / f"{name}.key")

    def _make_ca(self, name: str, common_name: str) -> CertPair:
        key = _new_key(self.root, name)
        _openssl(self.root, "req", "-x509", "-new", "-key", key.name, "-out", f"{name}.crt", "-days", DAYS,
                 "-subj", f"/CN={common_name}", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature")
        return self.pair(name)

    def issue(self, name: str, common_name: str, groups: Sequence[str] = (), *, server: bool = False,
              client: bool = True, hosts: Sequence[str] = (), ca: CertPair | None = None) -> CertPair:
        """A certificate `<name>.crt` + key signed by `ca` (default: the cluster CA). Client certificates carry
        the user (CN) and groups (O) the API server authenticates; `hosts` (IPs or DNS names) become SANs."""
        signer = ca or self.ca
        key = _new_key(self.root, name)
        subject = "".join(f"/O={group}" for group in groups) + f"/CN={common_name}"
        _openssl(self.root, "req", "-new", "-key", key.name, "-out", f"{name}.csr", "-subj", subject)
        usages = [u for u, on in (("serverAuth", server), ("clientAuth", client)) if on]
        ext = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
               f"extendedKeyUsage={','.join(usages)}"]
        if hosts:
            ext.append("subjectAltName=" + ",".join(_san(h) for h in hosts))
        (self.root / f"{name}.ext").write_text("\n".join(ext) + "\n")
        _openssl(self.root, "x509", "-req", "-in", f"{name}.csr", "-CA", str(signer.cert), "-CAkey", str(signer.key),
                 "-set_serial", str(secrets.randbits(63)), "-days", DAYS, "-extfile", f"{name}.ext",
                 "-out", f"{name}.crt")
        (self.root / f"{name}.csr").unlink()
        (self.root / f"{name}.ext").unlink()
        return self.pair(name)


def _san(host: str) -> str:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return f"DNS:{host}"
    return f"IP:{host}"


# Client identities of the control plane: file name -> (user, groups). The groups and users are the ones the
# API server's bootstrap RBAC policy binds (system:kube-controller-manager, system:kube-scheduler, system:masters).
CLIENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "admin": ("kubernetes-admin", ("system:masters",)),
    "controller-manager": ("system:kube-controller-manager", ()),
    "scheduler": ("system:kube-scheduler", ()),
    # The API server's identity towards kubelets (logs, exec, port-forward); bound to system:kubelet-api-admin.
    "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", ()),
}


def make_pki(root: Path, serving_hosts: Sequence[str]) -> Pki:
    """Every certificate and key of a control plane whose API server answers on `serving_hosts`."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    pki = Pki(root)
    pki._make_ca("ca", "dra-sandbox-ca")
    pki._make_ca("front-proxy-ca", "dra-sandbox-front-proxy-ca")
    pki.issue("apiserver", "kube-apiserver", server=True, client=False, hosts=serving_hosts)
    pki.issue("front-proxy-client", "front-proxy-client", ca=pki.front_proxy_ca)
    for name, (user, groups) in CLIENTS.items():
        pki.issue(name, user, groups)
    sa = _new_key(root, "sa")
    _openssl(root, "pkey", "-in", sa.name, "-pubout", "-out", "sa.pub")
    return pki


def kubeconfig(server: str, ca: Path, client: CertPair, user: str) -> str:
    """A kubeconfig with everything inline (the file alone logs in; mode 0600 where it is written)."""

    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "dra-sandbox", "cluster": {"server": server, "certificate-authority-data": b64(ca)}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(client.cert),
                                          "client-key-data": b64(client.key)}}],
        "contexts": [{"name": "dra-sandbox", "context": {"cluster": "dra-sandbox", "user": user}}],
        "current-context": "dra-sandbox",
    }
    return yaml.safe_dump(doc, sort_keys=False)


def token_kubeconfig(server: str, ca: Path, token: str, user: str) -> str:
    """A kubeconfig that logs in with a bearer token (a service account's, from the TokenRequest API)."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "dra-sandbox", "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "dra-sandbox", "context": {"cluster": "dra-sandbox", "user": user}}],
        "current-context": "dra-sandbox",
    }
    return yaml.safe_dump(doc, sort_keys=False)


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner may read (kubeconfigs carry keys and tokens), replacing it whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, KEY_MODE)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, path)
