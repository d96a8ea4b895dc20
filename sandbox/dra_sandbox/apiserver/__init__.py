"""An in-process Kubernetes API server speaking the real REST protocol (see docs/sandbox.md).

    from dra_sandbox.apiserver import ApiServer
    with ApiServer() as srv:
        srv.write_kubeconfig(path)       # for kubernetes.config, kubectl, kopf
        rest = srv.rest()                # dra_driver.k8s.client.KubeRest (the product's client)
        api = srv.api_client()           # kubernetes.client.ApiClient (typed API, kopf-style tests)
        srv.faults.inject(verb="update", resource="resourceslices", status=500, count=2)
        srv.request_log.count(verb="create", resource="resourceslices")
"""

from .chaos import ChaosFaults
from .errors import ApiError
from .hooks import Faults, RequestLog, RequestRecord
from .server import ApiServer
from .settings import Settings

__all__ = ["ApiError", "ApiServer", "ChaosFaults", "Faults", "RequestLog", "RequestRecord", "Settings"]
