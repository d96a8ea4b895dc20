"""The `kubernetes` package's kubeconfig loader, for the kubeconfigs the product's loader does not implement.

Exec credential plugins (EKS, GKE, AKS, OIDC login helpers), `auth-provider` and impersonation: `kubernetes.config`
loads them and refreshes exec tokens through its configuration's `refresh_api_key_hook`. Only the credentials come
from there: requests still go through `HttpTransport` (over the pool manager `kubernetes` configured for TLS and
proxies), so `KubeRest` behaves the same on both paths. Imported only when `client.connect` needs it, which the
kubelet plugin in a pod never does: its in-cluster connection is the product's own.
"""

from __future__ import annotations

from collections.abc import Mapping

import kubernetes.client
import kubernetes.config

from dra_driver.k8s.kubeconfig import ApiConnection
from dra_driver.k8s.transport import HttpTransport, pool_size


class KubernetesConfigAuth:
    """Headers and credentials from a `kubernetes.client.Configuration` (tokens refreshed by its hook)."""

    def __init__(self, configuration: kubernetes.client.Configuration) -> None:
        self._configuration = configuration

    def _authorization(self) -> str:
        setting = self._configuration.auth_settings().get("BearerToken")
        return str(setting["value"]) if setting and setting.get("value") else ""

    def headers(self) -> Mapping[str, str]:
        value = self._authorization()
        return {"Authorization": value} if value else {}

    def credentials(self) -> ApiConnection:
        c = self._configuration
        value = self._authorization()
        token = value.removeprefix("Bearer ").strip() if value.startswith("Bearer ") else None
        return ApiConnection(
            server=str(c.host),
            ca_file=c.ssl_ca_cert or None,
            cert_file=c.cert_file or None,
            key_file=c.key_file or None,
            token=token,
            username=c.username or None,
            password=c.password or None,
            insecure=not c.verify_ssl,
            tls_server_name=c.tls_server_name or None,
            proxy_url=c.proxy or None,
            source="kubeconfig (through the kubernetes package)",
        )


def kubernetes_transport(kubeconfig: str | None) -> HttpTransport:
    """`kubernetes.config.load_kube_config` (the file given, else $KUBECONFIG / ~/.kube/config)."""
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, client_configuration=configuration
    )
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, pool_size())
    client = kubernetes.client.ApiClient(configuration)
    return HttpTransport(str(configuration.host), client.rest_client.pool_manager, KubernetesConfigAuth(configuration))
