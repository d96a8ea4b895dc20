"""The controller's validating admission webhook, served by kopf (only with `--webhook`).

The checks are `dra_driver.controller.admission`; this module registers them as kopf validation handlers
(one per resource, each at `/<handler id>` on the webhook server) and configures the HTTPS server.

Who writes the ValidatingWebhookConfiguration: by default the chart (a `service:` clientConfig, the same
handler paths, `failurePolicy` from its values), so the controller needs no RBAC on it. With
`managed_configuration` set, kopf creates and patches one of that name itself, with a `url:` clientConfig
built from `host` and `port` (for development outside the chart).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import kopf

from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.controller.admission import (
    Problem,
    check_device_class,
    check_resource_claim,
    check_resource_claim_template,
    denial_message,
)
from dra_driver.controller.metrics import ControllerMetrics

DENIED_CODE: Final = 422  # what the API server answers for an invalid object

# Handler id (= URL path segment and webhook name prefix) -> (group, version, plural).
HANDLERS: Final = {
    "resourceclaims": ("resource.k8s.io", "v1", "resourceclaims"),
    "resourceclaimtemplates": ("resource.k8s.io", "v1", "resourceclaimtemplates"),
    "deviceclasses": ("resource.k8s.io", "v1", "deviceclasses"),
}

Check = Callable[..., list[Problem]]
_CHECKS: Final[Mapping[str, Check]] = {
    "resourceclaims": check_resource_claim,
    "resourceclaimtemplates": check_resource_claim_template,
    "deviceclasses": check_device_class,
}


@dataclass(frozen=True)
class WebhookSettings:
    port: int = 9443
    addr: str = "0.0.0.0"  # noqa: S104 - the API server calls in from outside the pod
    # Serving certificate and key (PEM). Both empty: kopf generates a self-signed one (needs kopf[dev]).
    certfile: str = ""
    keyfile: str = ""
    # CA that signed the certificate, advertised as caBundle in a kopf-managed configuration.
    cafile: str = ""
    # Hostname in the URL of a kopf-managed configuration (default: addr).
    host: str = ""
    # Non-empty: kopf creates/patches a ValidatingWebhookConfiguration of this name (url clientConfig).
    managed_configuration: str = ""
    failure_policy: Literal["Ignore", "Fail"] = "Ignore"  # of a kopf-managed configuration


def register(
    registry: kopf.OperatorRegistry,
    options: WebhookSettings,
    *,
    driver: str,
    cel: DraCelEnvironment,
    metrics: ControllerMetrics | None = None,
) -> None:
    """The validation handlers and the server settings, added to an operator's registry."""
    for handler_id, (group, version, plural) in HANDLERS.items():
        _register_one(
            registry,
            handler_id,
            (group, version, plural),
            _CHECKS[handler_id],
            options,
            driver=driver,
            cel=cel,
            metrics=metrics,
        )

    @kopf.on.startup(registry=registry)
    def configure_admission(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.admission.server = server(options)
        settings.admission.managed = options.managed_configuration or None


def _register_one(
    registry: kopf.OperatorRegistry,
    handler_id: str,
    resource: tuple[str, str, str],
    check: Check,
    options: WebhookSettings,
    *,
    driver: str,
    cel: DraCelEnvironment,
    metrics: ControllerMetrics | None,
) -> None:
    @kopf.on.validate(
        *resource,
        id=handler_id,
        operations=["CREATE", "UPDATE"],
        registry=registry,
        ignore_failures=options.failure_policy == "Ignore",
    )
    def validate(body: kopf.Body, **_: Any) -> None:
        problems = check(body, driver=driver, cel=cel)
        if metrics is not None:
            metrics.observe_admission(handler_id, allowed=not problems)
        if problems:
            raise kopf.AdmissionError(denial_message(problems), code=DENIED_CODE)


def server(options: WebhookSettings) -> kopf.WebhookServer:
    """kopf's HTTPS server for the handlers. Certificate files are re-read when they change (cert-manager
    renewals), every minute."""
    return kopf.WebhookServer(
        addr=options.addr,
        port=options.port,
        host=options.host or None,
        certfile=options.certfile or None,
        pkeyfile=options.keyfile or None,
        cafile=options.cafile or None,
    )
