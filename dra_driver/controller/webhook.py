"""The controller's validating admission webhook, served by kopf (only with `--webhook`).

The checks are `dra_driver.controller.admission`; this module registers them as kopf validation handlers
(one per resource, each at `/<handler id>` on the webhook server) and configures the HTTPS server.

Who writes the ValidatingWebhookConfiguration: by default the chart (a `service:` clientConfig, the same
handler paths, `failurePolicy` from its values), so the controller needs no RBAC on it. With
`managed_configuration` set, kopf creates and patches one of that name itself, with a `url:` clientConfig
built from `host` and `port` (for development outside the chart).

The HTTPS server is kopf's `WebhookServer` with this project's front door (`AdmissionServer`): only the handler
paths are served (anything else is 404, never an answer that allows), the body is bounded
(`max_request_bytes`), and a body that is not a well-formed AdmissionReview is refused with a message before
kopf or a check sees it (`dra_driver.controller.review`; docs/webhook.md "What is refused").
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import kopf
from aiohttp import web

from dra_driver import defaults
from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.controller.admission import (
    Problem,
    check_device_class,
    check_resource_claim,
    check_resource_claim_template,
    denial_message,
)
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.review import BAD_REQUEST, Accepted, Denied, denial, read_review, status_body

log = logging.getLogger(__name__)

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
    port: int = defaults.CONTROLLER_WEBHOOK_PORT
    # The address to listen on (`--webhook-bind-address`); the chart passes the pod's IP.
    addr: str = defaults.CONTROLLER_WEBHOOK_BIND_ADDRESS
    # Larger bodies are answered 413 unread (`--webhook-max-request-bytes`; docs/webhook.md "Body limit").
    max_request_bytes: int = defaults.CONTROLLER_WEBHOOK_MAX_REQUEST_BYTES
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


class _DenialsAreInfo(logging.Filter):
    """kopf logs every AdmissionError our handlers raise as `Webhook '<id>' failed permanently: <message>` at
    error level. A denial is the webhook doing its job, not a failure (issue 38: an error line means something is
    wrong): one info line in this module's words instead. Stateless: one instance serves every operator."""

    _PREFIXES: Final = tuple(f"Webhook {handler_id!r} failed permanently: " for handler_id in HANDLERS)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.ERROR:
            return True
        message = record.getMessage()
        for handler_id, prefix in zip(HANDLERS, self._PREFIXES, strict=True):
            if message.startswith(prefix):
                record.msg, record.args = "admission webhook /%s: denied the request: %s", (
                    handler_id, message[len(prefix):])
                record.levelno, record.levelname = logging.INFO, "INFO"
                return logging.getLogger(record.name).isEnabledFor(logging.INFO)
        return True


_DENIALS_ARE_INFO: Final = _DenialsAreInfo()
# The logger kopf's per-object messages go through (kopf._core.actions.loggers).
KOPF_OBJECTS_LOGGER: Final = "kopf.objects"


def register(
    registry: kopf.OperatorRegistry,
    options: WebhookSettings,
    *,
    driver: str,
    cel: DraCelEnvironment,
    metrics: ControllerMetrics | None = None,
) -> None:
    """The validation handlers and the server settings, added to an operator's registry."""
    objects = logging.getLogger(KOPF_OBJECTS_LOGGER)
    if _DENIALS_ARE_INFO not in objects.filters:
        objects.addFilter(_DENIALS_ARE_INFO)
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
        settings.admission.server = server(options, metrics)
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


def server(options: WebhookSettings, metrics: ControllerMetrics | None = None) -> AdmissionServer:
    """The HTTPS server for the handlers. Certificate files are re-read when they change (cert-manager
    renewals), every minute."""
    return AdmissionServer(
        addr=options.addr,
        port=options.port,
        host=options.host or None,
        certfile=options.certfile or None,
        pkeyfile=options.keyfile or None,
        cafile=options.cafile or None,
        max_request_bytes=options.max_request_bytes,
        metrics=metrics,
    )


CHUNK: Final = 64 * 1024
# The whole body must arrive within this: the API server sends it at once and waits at most 30 s (timeoutSeconds);
# a sender trickling bytes must not hold a connection and its buffer for ever.
BODY_TIMEOUT_S: Final = 30.0


class AdmissionServer(kopf.WebhookServer):
    """kopf's webhook server (its TLS set-up, `kopf.WebhookServer._build_ssl`, and its URL for a managed
    configuration) with a serving loop of our own. kopf's loop passes every path to its handlers (an unknown path
    was allowed), reads at most 1 MiB (aiohttp's default) and answers a body it cannot parse with a bare 500;
    here every request passes `_answer` first."""

    def __init__(self, *, max_request_bytes: int, metrics: ControllerMetrics | None,
                 body_timeout_s: float = BODY_TIMEOUT_S, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_request_bytes = max_request_bytes
        self.metrics = metrics
        self.body_timeout_s = body_timeout_s

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        async def serve(request: web.Request) -> web.StreamResponse:
            return await self._answer(fn, request)

        while True:
            cadata, context = self._build_ssl()
            app = web.Application(client_max_size=self.max_request_bytes)
            app.router.add_route("*", "/{path:.*}", serve)
            runner = web.AppRunner(app, handle_signals=False, access_log=None)
            await runner.setup()
            try:
                # No SO_REUSEPORT (kopf sets it for its tests): another process could bind the same port and
                # take a share of the API server's connections.
                port = self.port or self._allocate_free_port()
                site = web.TCPSite(runner, self.addr, port, ssl_context=context, reuse_address=True)
                await site.start()
                scheme = "http" if context is None else "https"
                host = self.host or self._get_accessible_addr(self.addr)
                config = kopf.WebhookClientConfig(url=self._build_url(scheme, host, port, ""))
                if cadata is not None:
                    config["caBundle"] = base64.b64encode(cadata).decode("ascii")
                log.info("admission webhook listening on %s", self._build_url(scheme, self.addr or "*", port, ""))
                yield config
                await self._until_files_change()
                log.info("admission webhook: certificate files changed, serving them")
            finally:
                await runner.cleanup()

    async def _until_files_change(self) -> None:
        """Return when the certificate, key or CA file changes (mounted Secrets send no events: re-read them)."""
        paths = [Path(p) for p in (self.certfile, self.pkeyfile, self.cafile) if p is not None]

        def digest() -> str:
            h = hashlib.sha256()
            for path in paths:
                h.update(path.read_bytes())
            return h.hexdigest()

        first = digest()
        while digest() == first:
            await asyncio.sleep(self.file_check_interval)

    async def _answer(self, fn: kopf.WebhookFn, request: web.Request) -> web.StreamResponse:
        handler = request.match_info["path"]
        if handler not in HANDLERS:
            known = ", ".join(f"/{h}" for h in HANDLERS)
            return _error(404, f"no admission webhook at {request.path!r}; this server checks {known} "
                               "(the webhook configuration's clientConfig path)")
        if request.method != "POST":
            return _error(405, f"{request.method} {request.path}: an AdmissionReview is sent with POST",
                          headers={"Allow": "POST"})
        if request.content_type != "application/json" or (request.charset or "utf-8").lower() not in (
                "utf-8", "utf8"):
            return self._malformed(handler, _error(
                415, f"Content-Type {request.headers.get('Content-Type', '(none)')!r}: an AdmissionReview is "
                     "sent as application/json (UTF-8)"))
        try:
            async with asyncio.timeout(self.body_timeout_s):
                raw = await self._read_body(request)
        except TimeoutError:
            return self._malformed(handler, _error(
                408, f"the request body did not arrive within {self.body_timeout_s:g} s",
                headers={"Connection": "close"}))
        if raw is None:
            return self._malformed(handler, _error(
                413, f"the request body is larger than {self.max_request_bytes} bytes, this webhook's limit "
                     "(--webhook-max-request-bytes, docs/webhook.md)", headers={"Connection": "close"}))
        judged = read_review(raw, handler=handler, resource=HANDLERS[handler])
        if isinstance(judged, Denied):
            log.info("admission webhook /%s: refused review %s: %s", handler, judged.uid, judged.message)
            return self._malformed(handler, web.json_response(denial(judged.uid, judged.message)))
        if not isinstance(judged, Accepted):
            log.info("admission webhook /%s: refused a request that is no AdmissionReview: %s", handler,
                     judged.message)
            return self._malformed(handler, _error(BAD_REQUEST, judged.message))
        sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
        try:
            # kopf's request type (a TypedDict) is not public; read_review checked the fields kopf reads.
            review: Any = judged.review
            response = await fn(review, webhook=handler, headers=dict(request.headers), sslpeer=sslpeer)
        except Exception as exc:
            # A review that passed read_review but broke kopf or a check: refused with the reason, never allowed
            # and never a bare 500 (docs/webhook.md).
            log.exception("admission webhook /%s: review %s could not be checked", handler, judged.uid)
            message = f"the webhook could not check this request: {type(exc).__name__}: {exc}"
            return web.json_response(denial(judged.uid, message, 500))
        return web.json_response(response)

    async def _read_body(self, request: web.Request) -> bytes | None:
        """The body, or None when it is larger than the limit (unread past it)."""
        if request.content_length is not None and request.content_length > self.max_request_bytes:
            return None
        body = bytearray()
        async for chunk in request.content.iter_chunked(CHUNK):
            body += chunk
            if len(body) > self.max_request_bytes:
                return None
        return bytes(body)

    def _malformed(self, handler: str, answer: web.Response) -> web.Response:
        if self.metrics is not None:
            self.metrics.observe_malformed_review(handler)
        return answer


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response(status_body(status, message), status=status, headers=headers)
