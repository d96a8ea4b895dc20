"""The controller's admission webhook end to end: the sandbox API server calls it over HTTPS (a test CA),
through a ValidatingWebhookConfiguration shaped like the chart's (`service:` clientConfig, one webhook per
handler path), and answers kubectl-style denials."""

from __future__ import annotations

import base64
import logging
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_driver.controller.operator import ControllerSettings, run
from dra_driver.controller.webhook import HANDLERS, KOPF_OBJECTS_LOGGER, WebhookSettings
from dra_driver.k8s.client import ApiError, KubeRest
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.cluster import free_tcp_port
from tests.polling import wait_for

DRIVER = "gpu.dra.dev"
TIMEOUT = 20.0
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
SERVICE = ("dra-driver", "dra-driver-controller-webhook")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(d: Path) -> None:
    """A test CA and a serving certificate for 127.0.0.1 signed by it."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
             "-subj", "/CN=test-ca", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr", "-subj",
             "/CN=127.0.0.1", cwd=d)
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out",
             "tls.crt", "-days", "1", "-extfile", "ext", cwd=d)


def configuration(ca: bytes, failure_policy: str) -> dict[str, Any]:
    """What charts/dra-driver/templates/webhook.yaml renders."""
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "dra-driver"},
            "webhooks": [{
                "name": f"{handler}.{DRIVER}",
                "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": failure_policy,
                "timeoutSeconds": 5,
                "clientConfig": {"caBundle": base64.b64encode(ca).decode(),
                                 "service": {"namespace": SERVICE[0], "name": SERVICE[1], "path": f"/{handler}",
                                             "port": 443}},
                "rules": [{"apiGroups": [group], "apiVersions": [version], "resources": [plural],
                           "operations": ["CREATE", "UPDATE"], "scope": "*"}],
            } for handler, (group, version, plural) in HANDLERS.items()]}


@dataclass
class Cluster:
    rest: KubeRest
    stop: threading.Event
    thread: threading.Thread
    ca: bytes


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    make_certs(tmp_path)
    port = free_tcp_port()
    urls = {"/".join(SERVICE): f"https://127.0.0.1:{port}"}
    with ApiServer(webhook_service_urls=urls) as srv, srv.rest() as rest:
        kubeconfig = tmp_path / "kubeconfig"
        srv.write_kubeconfig(kubeconfig)
        webhook = WebhookSettings(port=port, addr="127.0.0.1", certfile=str(tmp_path / "tls.crt"),
                                 keyfile=str(tmp_path / "tls.key"))
        options = ControllerSettings(driver_name=DRIVER, kubeconfig=str(kubeconfig), healthz_port=-1,
                                    resync_seconds=1.0, watch_timeout_seconds=10, webhook=webhook)
        stop, ready = threading.Event(), threading.Event()
        thread = threading.Thread(target=run, args=(options,), kwargs={"stop_flag": stop, "ready_flag": ready},
                                  daemon=True)
        thread.start()
        try:
            assert ready.wait(TIMEOUT), "the controller did not become ready"
            wait_for(lambda: listening(port), TIMEOUT, "the webhook server listening")
            yield Cluster(rest, stop, thread, (tmp_path / "ca.crt").read_bytes())
        finally:
            stop.set()
            thread.join(TIMEOUT)
        assert not thread.is_alive(), "the controller did not stop"


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def claim(name: str, pct: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dra.dev"}}],
                "config": [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
                    "apiVersion": "gpu.dra.dev/v1beta1", "kind": "GpuConfig",
                    "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": pct}}}}}]}}}


def rejected(rest: KubeRest, path: str, body: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as caught:
        rest.request("POST", path, body=body)
    return caught.value


def test_webhook_denies_bad_config_and_selector_and_admits_valid(cluster: Cluster,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    rest = cluster.rest
    rest.request("POST", WEBHOOKS, body=configuration(cluster.ca, "Fail"))

    caplog.set_level(logging.INFO, logger=KOPF_OBJECTS_LOGGER)
    err = rejected(rest, CLAIMS, claim("too-much", 101))
    assert err.status == 422
    reason = ("spec.devices.config[0].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage: "
              "must be a whole number between 1 and 100, got 101")
    assert err.body["message"] == f'admission webhook "resourceclaims.gpu.dra.dev" denied the request: {reason}'
    assert rest.get(f"{CLAIMS}/too-much") is None
    # A denial is the webhook working (issue 38): one info line, not kopf's "failed permanently" error.
    denials = [r for r in caplog.records if r.name == KOPF_OBJECTS_LOGGER and "too-much" not in r.getMessage()
               and reason in r.getMessage()]
    assert [(r.levelname, r.getMessage()) for r in denials] == [
        ("INFO", f"admission webhook /resourceclaims: denied the request: {reason}")]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text

    rest.request("POST", CLAIMS, body=claim("fine", 50))
    assert rest.get(f"{CLAIMS}/fine") is not None

    typo = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "typo"},
            "spec": {"selectors": [{"cel": {"expression":
                                            'device.attributes["gpu.dra.dev"].prodcutName == "NVIDIA H100"'}}]}}
    err = rejected(rest, CLASSES, typo)
    assert err.status == 422
    assert err.body["message"].startswith(
        'admission webhook "deviceclasses.gpu.dra.dev" denied the request: spec.selectors[0].cel.expression: '
        'driver gpu.dra.dev publishes no attribute "prodcutName"')

    # UPDATE is checked too (a claim's spec is immutable; a class's is not).
    good = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "mps"},
            "spec": {"config": [{"opaque": claim("x", 50)["spec"]["devices"]["config"][0]["opaque"]}]}}
    rest.request("POST", CLASSES, body=good)
    current = rest.get(f"{CLASSES}/mps")
    assert current is not None
    current["spec"]["config"][0]["opaque"]["parameters"]["sharing"]["mpsConfig"]["defaultActiveThreadPercentage"] = 0
    with pytest.raises(ApiError) as caught:
        rest.request("PUT", f"{CLASSES}/mps", body=current)
    assert caught.value.body["message"].startswith(
        'admission webhook "deviceclasses.gpu.dra.dev" denied the request: '
        "spec.config[0].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage: ")


@pytest.mark.parametrize("policy", ["Ignore", "Fail"])
def test_failure_policy_with_the_controller_stopped(cluster: Cluster, policy: str) -> None:
    rest = cluster.rest
    rest.request("POST", WEBHOOKS, body=configuration(cluster.ca, policy))
    cluster.stop.set()
    cluster.thread.join(TIMEOUT)
    assert not cluster.thread.is_alive()
    if policy == "Ignore":
        rest.request("POST", CLAIMS, body=claim("unchecked", 101))  # nobody checks: the API server admits it
        assert rest.get(f"{CLAIMS}/unchecked") is not None
    else:
        err = rejected(rest, CLAIMS, claim("unchecked", 50))
        assert err.status == 500
        assert err.body["message"].startswith('Internal error occurred: failed calling webhook '
                                              '"resourceclaims.gpu.dra.dev": failed to call webhook: Post "https://')


@pytest.mark.parametrize("policy", ["Ignore", "Fail"])
def test_a_configuration_pointing_at_an_unknown_path_fails_closed(cluster: Cluster, policy: str) -> None:
    """A clientConfig path the controller does not serve is a failed call (404), never an answer that allows:
    with Fail nothing passes unchecked; with Ignore the API server admits, as for a controller that is down."""
    rest = cluster.rest
    config = configuration(cluster.ca, policy)
    for hook in config["webhooks"]:
        hook["clientConfig"]["service"]["path"] = "/validate-" + hook["clientConfig"]["service"]["path"][1:]
    rest.request("POST", WEBHOOKS, body=config)
    if policy == "Fail":
        err = rejected(rest, CLAIMS, claim("unchecked", 50))
        assert err.status == 500
        assert err.body["message"].startswith('Internal error occurred: failed calling webhook '
                                              '"resourceclaims.gpu.dra.dev": failed to call webhook: Post "https://')
        assert "404" in err.body["message"]
        assert rest.get(f"{CLAIMS}/unchecked") is None
    else:
        rest.request("POST", CLAIMS, body=claim("unchecked", 101))
        assert rest.get(f"{CLAIMS}/unchecked") is not None
