"""What the Helm chart installs, on the upstream control plane (docs/upstream.md "What is installed").

`helm template` renders charts/dra-driver (CRDs included, the webhook on, its TLS from our CA) and every object is
applied with server-side apply as the chart would create it, with two differences a cluster without a kubelet that
runs our image needs:

- the Deployment (the controller) runs as a local process instead: the rendered container's command, args and env,
  logged in with a token of the chart's ServiceAccount `dra-driver-controller` (so the chart's RBAC is what it has),
  serving the webhook on the control plane's own address with a certificate from our CA;
- the ValidatingWebhookConfiguration keeps every rule the chart renders but calls that address (`url:`) instead of
  the Service (a host-process API server has no Service routing).

The DaemonSet (the kubelet plugin) is not applied either: each node runs its plugin itself (the real node's kubelet
or the fake nodes), logged in with the chart's ServiceAccount `dra-driver-kubelet-plugin` through a token bound to
its Node (`plugin_kubeconfig`), which the chart's admission policies check.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_sandbox.polling import wait_for
from dra_sandbox.upstream.controlplane import WEBHOOK_PORT, ControlPlane, Server
from dra_sandbox.upstream.pki import token_kubeconfig, write_private

RELEASE = "dra-driver"
NAMESPACE = "dra-driver"
CONTROLLER = f"{RELEASE}-controller"
PLUGIN_SERVICE_ACCOUNT = f"{RELEASE}-kubelet-plugin"
FIELD_MANAGER = "dra-sandbox"
TOKEN_SECONDS = 86400  # a sandbox lives for hours
READY_TIMEOUT_S = 120.0

# Kinds the chart renders, by scope; a kind in neither set is an error naming it. Each object's API path comes from
# its apiVersion and kind, the resource as apimachinery's meta.UnsafeGuessKindToResource names it.
NAMESPACED_KINDS = frozenset({"ServiceAccount", "Secret", "Service", "ConfigMap", "Role", "RoleBinding",
                              "PodDisruptionBudget"})
CLUSTER_KINDS = frozenset({"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "DeviceClass",
                           "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                           "ValidatingWebhookConfiguration"})
KINDS = NAMESPACED_KINDS | CLUSTER_KINDS
RUN_LOCALLY = frozenset({"Deployment", "DaemonSet"})


class InstallError(RuntimeError):
    pass


def repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def helm_binary() -> Path:
    helm = repo_root() / ".tools" / "bin" / "helm"
    if not helm.is_file():
        raise InstallError(f"{helm} is missing: run `make helm` (scripts/install-helm.sh)")
    return helm


def render(kube_version: str, ca_bundle: bytes, sets: Sequence[str] = ()) -> list[JsonObject]:
    """The chart's objects for this cluster, as `helm template` renders them."""
    argv = [str(helm_binary()), "template", RELEASE, str(repo_root() / "charts" / "dra-driver"),
            "--namespace", NAMESPACE, "--include-crds", "--kube-version", kube_version,
            "--set", "webhook.enabled=true", "--set", "webhook.tls.mode=secret",
            "--set", f"webhook.tls.secretName={CONTROLLER}-webhook-tls",
            "--set", f"webhook.tls.caBundle={base64.b64encode(ca_bundle).decode()}",
            "--set", "controller.replicas=1"]
    for value in sets:
        argv += ["--set", value]
    out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    if out.returncode != 0:
        raise InstallError(f"helm template failed: {out.stderr.strip()[-2000:]}")
    return [doc for doc in yaml.safe_load_all(out.stdout) if isinstance(doc, dict)]


def guess_resource(kind: str) -> str:
    """The resource (plural) of a kind, as apimachinery's meta.UnsafeGuessKindToResource guesses it."""
    singular = kind.lower()
    if singular.endswith("endpoints"):
        return singular
    if singular.endswith("s"):
        return singular + "es"
    if singular.endswith("y"):
        return singular[:-1] + "ies"
    return singular + "s"


def object_path(obj: Mapping[str, Any]) -> str:
    kind = str(obj.get("kind"))
    if kind not in KINDS:
        raise InstallError(f"the chart rendered a {kind}, which dra_sandbox/upstream/install.py KINDS does not know: "
                           "add it to NAMESPACED_KINDS or CLUSTER_KINDS there")
    api_version = obj.get("apiVersion")
    if not isinstance(api_version, str) or not api_version:
        raise InstallError(f"the chart rendered a {kind} without apiVersion")
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    meta = obj.get("metadata") or {}
    namespace = f"/namespaces/{meta.get('namespace') or NAMESPACE}" if kind in NAMESPACED_KINDS else ""
    return f"{prefix}{namespace}/{guess_resource(kind)}/{meta['name']}"


def apply(rest: KubeRest, obj: Mapping[str, Any]) -> JsonObject:
    """Server-side apply, as `kubectl apply --server-side --force-conflicts` sends it."""
    body = dict(obj)
    if obj.get("kind") in NAMESPACED_KINDS:
        body["metadata"] = {**obj["metadata"], "namespace": obj["metadata"].get("namespace") or NAMESPACE}
    try:
        return rest.request("PATCH", object_path(obj), query={"fieldManager": FIELD_MANAGER, "force": True},
                            body=body, content_type="application/apply-patch+yaml")
    except ApiError as exc:
        raise InstallError(f"applying {obj.get('kind')} {obj['metadata'].get('name')}: {exc}") from None


def service_account_token(rest: KubeRest, name: str, *, node: str | None = None) -> str:
    """A token of ServiceAccount NAMESPACE/name from the TokenRequest API; bound to Node `node` when given (the
    API server then adds authentication.kubernetes.io/node-name to the caller's user info)."""
    spec: dict[str, Any] = {"expirationSeconds": TOKEN_SECONDS}
    if node is not None:
        found = rest.get(f"/api/v1/nodes/{node}")
        if found is None:
            raise InstallError(f"node {node} does not exist: a token can only be bound to an existing Node")
        spec["boundObjectRef"] = {"kind": "Node", "apiVersion": "v1", "name": node,
                                  "uid": found["metadata"]["uid"]}
    answer = rest.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{name}/token",
                          body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
    token = answer.get("status", {}).get("token")
    if not isinstance(token, str) or not token:
        raise InstallError(f"the TokenRequest for {NAMESPACE}/{name} returned no token")
    return token


def plugin_kubeconfig(plane: ControlPlane, node: str, path: Path) -> Path:
    """A kubeconfig for the kubelet plugin of `node`: the chart's plugin ServiceAccount, its token bound to the
    Node (what a projected token of the plugin's pod carries, and what the chart's admission policies require)."""
    token = service_account_token(plane.admin(), PLUGIN_SERVICE_ACCOUNT, node=node)
    write_private(path, token_kubeconfig(plane.server_url, plane.pki.ca.cert, token,
                                         f"system:serviceaccount:{NAMESPACE}:{PLUGIN_SERVICE_ACCOUNT}"))
    return path


@dataclass
class Installed:
    objects: list[JsonObject]  # what was applied
    controller: Server | None  # the controller process (None: the chart's controller is off)


def _webhook_via_url(obj: JsonObject, address: str) -> JsonObject:
    hooks = []
    for hook in obj.get("webhooks") or []:
        client = dict(hook["clientConfig"])
        service = client.pop("service", None) or {}
        client["url"] = f"https://{address}:{WEBHOOK_PORT}{service.get('path') or '/'}"
        hooks.append({**hook, "clientConfig": client})
    return {**obj, "webhooks": hooks}


def _controller_process(plane: ControlPlane, deployment: JsonObject) -> Server:
    """The chart's controller container as a local process."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    tls = plane.pki.issue("controller-webhook", f"{CONTROLLER}-webhook.{NAMESPACE}.svc", server=True, client=False,
                          hosts=[plane.address])
    overrides = {"--webhook-cert": str(tls.cert), "--webhook-key": str(tls.key), "--webhook-port": str(WEBHOOK_PORT),
                 "--metrics-port": "-1"}
    args = []
    for arg in container.get("args") or []:
        flag = str(arg).split("=", 1)[0]
        args.append(f"{flag}={overrides[flag]}" if flag in overrides else str(arg))
    kubeconfig = plane.dir / "controller.kubeconfig"
    token = service_account_token(plane.admin(), str(deployment["spec"]["template"]["spec"]["serviceAccountName"]))
    write_private(kubeconfig, token_kubeconfig(plane.server_url, plane.pki.ca.cert, token,
                                               f"system:serviceaccount:{NAMESPACE}:{CONTROLLER}"))
    args += [f"--webhook-bind-address={plane.address}", f"--kubeconfig={kubeconfig}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")}
    # The downward API as the kubelet would fill it for this "pod" (its IP: the control plane's address).
    downward = {"metadata.name": f"{CONTROLLER}-local", "metadata.namespace": NAMESPACE,
                "status.podIP": plane.address}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
            continue
        field_path = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if field_path not in downward:
            raise InstallError(f"the chart's controller env {item.get('name')} comes from {item.get('valueFrom')}, "
                               "which install.py does not fill in")
        env[item["name"]] = downward[field_path]
    env.update({"DRA_DRIVER_HEALTHZ_PORT": "-1", "DRA_DRIVER_LOG_FORMAT": "text"})
    command = list(container.get("command") or ["dra-driver"])
    if command[0] != "dra-driver":
        raise InstallError(f"the chart's controller runs {command[0]}, not dra-driver")
    argv = [sys.executable, "-m", "dra_driver.cli", *command[1:], *args]
    server = Server("dra-driver-controller", argv, plane.dir / "logs" / "dra-driver-controller.log", env=env)
    plane.servers.append(server)
    server.start()
    return server


def _accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def install_chart(plane: ControlPlane, sets: Sequence[str] = ()) -> Installed:
    """Apply what the chart installs and start its controller; returns once the controller leads and serves the
    webhook and the webhook configuration is in place."""
    rest = plane.admin()
    objects = render(plane.config.binaries.release.kubernetes, plane.pki.ca.cert.read_bytes(), sets)
    apply(rest, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    applied: list[JsonObject] = []
    crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    for crd in crds:
        applied.append(apply(rest, crd))
    for crd in crds:
        _wait_established(rest, crd["metadata"]["name"])
    later = {"ValidatingWebhookConfiguration"}
    for obj in objects:
        if obj["kind"] in RUN_LOCALLY or obj["kind"] in later or obj["kind"] == "CustomResourceDefinition":
            continue
        applied.append(apply(rest, obj))
    controller = None
    deployments = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == CONTROLLER]
    if deployments:
        controller = _controller_process(plane, deployments[0])

        def serving() -> bool:
            controller.check_running()
            lease = rest.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{CONTROLLER}")
            leads = bool(lease and (lease.get("spec") or {}).get("holderIdentity"))
            return leads and _accepts(plane.address, WEBHOOK_PORT)

        wait_for(serving, READY_TIMEOUT_S, "the dra-driver controller to lead and serve its webhook", interval=0.2)
    for obj in objects:
        if obj["kind"] == "ValidatingWebhookConfiguration":
            applied.append(apply(rest, _webhook_via_url(obj, plane.address)))
    return Installed(applied, controller)


def _wait_established(rest: KubeRest, name: str) -> None:
    def established() -> bool:
        crd = rest.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") or {}
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    wait_for(established, READY_TIMEOUT_S, f"CRD {name} to be established", interval=0.2)
