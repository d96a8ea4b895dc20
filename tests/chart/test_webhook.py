"""The webhook's chart objects: off by default, Service + VWC (service clientConfig) + TLS per mode, no VWC RBAC."""

from __future__ import annotations

import base64

import pytest

from dra_driver import defaults
from dra_driver.commands import controller as controller_command
from dra_driver.commands.flags import FlagParser, apply_env_defaults
from dra_driver.controller.webhook import HANDLERS
from tests import kubeschema
from tests.chart.helm import CHART, Helm, by_kind


def test_off_by_default(helm: Helm) -> None:
    objects = helm.render()
    assert not by_kind(objects, "ValidatingWebhookConfiguration")
    assert not [o for o in by_kind(objects, "Service") if o["metadata"]["name"].endswith("-webhook")]


@pytest.mark.parametrize("mode,extra", [("selfSigned", ()), ("certManager", ("webhook.tls.certManager.issuerName=ca",)),
                                        ("secret", ("webhook.tls.secretName=mine", "webhook.tls.caBundle=Q0E="))])
@pytest.mark.parametrize("kube", ["1.34.0", "1.35.0"])
def test_on(helm: Helm, mode: str, extra: tuple[str, ...], kube: str) -> None:
    objects = helm.render(["webhook.enabled=true", f"webhook.tls.mode={mode}", *extra])
    (vwc,) = by_kind(objects, "ValidatingWebhookConfiguration")
    assert [w["name"] for w in vwc["webhooks"]] == [f"{h}.gpu.dra.dev" for h in HANDLERS]
    for hook in vwc["webhooks"]:
        assert hook["failurePolicy"] == "Ignore"
        assert hook["clientConfig"]["service"]["path"] == "/" + hook["name"].split(".")[0]
    if mode == "selfSigned":
        assert base64.b64decode(vwc["webhooks"][0]["clientConfig"]["caBundle"]).startswith(b"-----BEGIN CERTIFICATE")
    deployment = next(d for d in by_kind(objects, "Deployment") if d["metadata"]["name"].endswith("-controller"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--webhook" in container["args"]
    rules = [r for role in by_kind(objects, "ClusterRole") for r in role["rules"]]
    assert not [r for r in rules if "validatingwebhookconfigurations" in r.get("resources", [])]
    for obj in objects:
        if obj["kind"] in ("Certificate",):
            continue
        kubeschema.validate(obj, kube.rsplit(".", 1)[0])


def test_lint_with_webhook(helm: Helm) -> None:
    proc = helm.run("lint", "--strict", str(CHART), "--set", "webhook.enabled=true", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("bind", ["", "0.0.0.0", "::"])
def test_where_the_webhook_listens_and_its_body_limit(helm: Helm, bind: str) -> None:
    """Default: the pod's IP (downward API), where the Service sends; else the address given. The body limit is
    the flag's default, rendered as an integer the parser accepts (Helm prints large numbers as floats)."""
    objects = helm.render(["webhook.enabled=true", f"webhook.bindAddress={bind}"])
    deployment = next(d for d in by_kind(objects, "Deployment") if d["metadata"]["name"].endswith("-controller"))
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    [entry] = [e for e in container["env"] if e["name"] == "DRA_DRIVER_WEBHOOK_BIND_ADDRESS"]
    if bind:
        assert entry == {"name": "DRA_DRIVER_WEBHOOK_BIND_ADDRESS", "value": bind}
    else:
        assert entry == {"name": "DRA_DRIVER_WEBHOOK_BIND_ADDRESS",
                         "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    parser = FlagParser()
    controller_command.add_arguments(parser)
    apply_env_defaults(parser, {e["name"]: e.get("value", "10.1.2.3") for e in container["env"]})
    args = parser.parse_args(container["args"])
    assert args.webhook_max_request_bytes == defaults.CONTROLLER_WEBHOOK_MAX_REQUEST_BYTES
    assert args.webhook_bind_address == (bind or "10.1.2.3")
    assert controller_command.webhook_flag_problem(args) == ""


def test_a_body_limit_below_1_mib_is_refused_by_the_schema(helm: Helm) -> None:
    assert "maxRequestBytes" in helm.fail(["webhook.enabled=true", "webhook.maxRequestBytes=65536"])
