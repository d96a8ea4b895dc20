"""The parts of the upstream control plane that need no upstream binary: the PKI, the address lease, the chart's
objects as install.py applies them (docs/upstream.md)."""

from __future__ import annotations

import base64
import shutil
import socket
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from dra_sandbox.upstream.controlplane import FEATURE_GATES, RUNTIME_CONFIG, AddressLease, feature_gates_flag
from dra_sandbox.upstream.install import (
    KINDS,
    InstallError,
    _webhook_via_url,
    guess_resource,
    helm_binary,
    object_path,
    render,
)
from dra_sandbox.upstream.pki import make_pki

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")


def _text(cert: Path) -> str:
    return subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-text"], capture_output=True, text=True,
                          check=True).stdout


def test_the_pki_signs_what_each_identity_needs(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", ["127.241.0.7", "kubernetes.default.svc"])
    assert stat.S_IMODE((tmp_path / "pki").stat().st_mode) == 0o700
    for key in (tmp_path / "pki").glob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert not list((tmp_path / "pki").glob("*.csr"))  # nothing half-made left
    for name in ("apiserver", "admin", "controller-manager", "scheduler", "apiserver-kubelet-client"):
        verified = subprocess.run(["openssl", "verify", "-CAfile", str(pki.ca.cert), str(pki.pair(name).cert)],
                                  capture_output=True, text=True)
        assert verified.returncode == 0, verified.stderr
    serving = _text(pki.pair("apiserver").cert)
    assert "IP Address:127.241.0.7" in serving and "DNS:kubernetes.default.svc" in serving
    assert "TLS Web Server Authentication" in serving and "TLS Web Client Authentication" not in serving
    admin = _text(pki.pair("admin").cert)
    assert "O = system:masters, CN = kubernetes-admin" in admin and "TLS Web Client Authentication" in admin
    # The front-proxy client is signed by its own CA, not the cluster's (the API server tells them apart).
    other = subprocess.run(["openssl", "verify", "-CAfile", str(pki.ca.cert),
                            str(pki.pair("front-proxy-client").cert)], capture_output=True, text=True)
    assert other.returncode != 0
    assert b"PUBLIC KEY" in pki.service_account_pub.read_bytes()


def test_two_leases_never_share_an_address_and_a_released_one_is_free(tmp_path: Path) -> None:
    first = AddressLease.acquire(second_octets=(247,))
    try:
        second = AddressLease.acquire(second_octets=(247,))
        try:
            assert first.address != second.address
            assert first.address.startswith("127.247.0.") and second.address.startswith("127.247.0.")
        finally:
            second.release()
        # A stranger listening on a wildcard address at one of the ports: every address is passed over.
        with socket.socket() as stranger:
            stranger.bind(("0.0.0.0", 0))
            stranger.listen(1)
            port = stranger.getsockname()[1]
            with pytest.raises(RuntimeError, match=f"no free control-plane address in 127.248-248.0.x: ports {port}"):
                AddressLease.acquire(second_octets=(248,), ports=(port,))
    finally:
        first.release()


def test_feature_gates_are_only_those_the_release_knows_and_defaults_off() -> None:
    assert feature_gates_flag("1.37") == "DRADeviceCompatibilityGroups=true,DRAListTypeAttributes=true"
    assert "DRAListTypeAttributes" not in feature_gates_flag("1.35")  # new in 1.36: 1.35 would refuse it
    assert "DRADeviceTaintRules" not in feature_gates_flag("1.34")  # new in 1.35
    assert set(FEATURE_GATES) == set(RUNTIME_CONFIG) == {"1.34", "1.35", "1.36", "1.37"}


@pytest.fixture(scope="module")
def objects() -> list[dict[str, object]]:
    try:
        helm_binary()
    except InstallError as exc:
        pytest.skip(str(exc))
    return render("v1.37.2", b"-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n")


def test_every_kind_the_chart_renders_is_applied_or_run_locally(objects: list[dict[str, object]]) -> None:
    kinds = {str(o["kind"]) for o in objects}
    assert kinds - set(KINDS) == {"Deployment", "DaemonSet"}
    crd = next(o for o in objects if o["kind"] == "CustomResourceDefinition")
    assert object_path(crd).startswith("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/")
    account = next(o for o in objects if o["kind"] == "ServiceAccount")
    assert object_path(account).startswith("/api/v1/namespaces/dra-driver/serviceaccounts/")
    with pytest.raises(InstallError, match="the chart rendered a CronJob"):
        object_path({"kind": "CronJob", "metadata": {"name": "x"}})


def test_resources_are_named_as_apimachinery_guesses_them() -> None:
    kinds = ("Namespace", "ConfigMap", "PodDisruptionBudget", "DeviceClass", "ValidatingAdmissionPolicy", "Endpoints")
    assert [guess_resource(k) for k in kinds] == [
        "namespaces", "configmaps", "poddisruptionbudgets", "deviceclasses", "validatingadmissionpolicies", "endpoints"]
    with pytest.raises(InstallError, match="the chart rendered a Secret without apiVersion"):
        object_path({"kind": "Secret", "metadata": {"name": "x"}})


def test_the_webhook_calls_the_control_planes_address_with_the_charts_rules(objects: list[dict[str, object]]) -> None:
    rendered = next(o for o in objects if o["kind"] == "ValidatingWebhookConfiguration")
    moved = _webhook_via_url(rendered, "127.242.0.9")
    hooks = moved["webhooks"]
    assert isinstance(hooks, list) and hooks
    for before, after in zip(rendered["webhooks"], hooks, strict=True):  # type: ignore[call-overload]
        assert after["clientConfig"]["url"] == f"https://127.242.0.9:9443{before['clientConfig']['service']['path']}"
        assert "service" not in after["clientConfig"]
        assert base64.b64decode(after["clientConfig"]["caBundle"]).startswith(b"-----BEGIN CERTIFICATE-----")
        assert {k: v for k, v in after.items() if k != "clientConfig"} == {
            k: v for k, v in before.items() if k != "clientConfig"}


def test_the_controller_deployment_runs_the_dra_driver_command(objects: list[dict[str, object]]) -> None:
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    container = yaml.safe_load(yaml.safe_dump(deployment))["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["dra-driver", "controller"]
    assert any(a.startswith("--webhook-port=") for a in container["args"])
