"""kopf logs in with the controller's own connection: the same server, CA, token and client certificate."""

from __future__ import annotations

from dra_driver.controller.operator import connection_info
from dra_driver.k8s.kubeconfig import ApiConnection

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_kopf_gets_the_connections_credentials() -> None:
    info = connection_info(
        ApiConnection(server="https://10.96.0.1:443", ca_file="/sa/ca.crt", token="t-1", namespace="gpu-system")
    )
    assert (info.server, info.ca_path, info.ca_data, info.token, info.insecure) == (
        "https://10.96.0.1:443", "/sa/ca.crt", None, "t-1", False
    )


def test_data_wins_over_paths_as_kopf_takes_only_one() -> None:
    info = connection_info(
        ApiConnection(
            server="https://api:6443",
            ca_file="/ca.crt",
            ca_data=PEM,
            cert_file="/tls.crt",
            cert_data=PEM,
            key_file="/tls.key",
            key_data=b"key",
            insecure=True,
            proxy_url="http://proxy:3128",
        )
    )
    assert (info.ca_path, info.certificate_path, info.private_key_path) == (None, None, None)
    assert (info.ca_data, info.certificate_data, info.private_key_data) == (PEM, PEM, b"key")
    assert info.insecure is True and info.proxy_url == "http://proxy:3128"
