"""Validating admission webhooks: the sandbox calls them as the kube-apiserver does, minimally.

For a create or update of any kind except the admissionregistration ones, every webhook of every stored
ValidatingWebhookConfiguration whose rules match (apiGroups, apiVersions, resources, operations; "*"
wildcards) is sent an AdmissionReview v1 by HTTPS POST, after the built-in validation and before storage:

* `clientConfig.url`, or `clientConfig.service` resolved through `Settings.webhook_service_urls`
  ("<namespace>/<name>" -> base URL; the service's `path` is appended);
* the server certificate is verified against `clientConfig.caBundle` (else the system CAs);
* `timeoutSeconds` (default 10) bounds the call; `failurePolicy` (default Fail) decides what a failed call
  does: Ignore admits, Fail answers 500 `failed calling webhook`;
* a denial is answered with the webhook's status code (at least 400) and the message
  `admission webhook "<name>" denied the request: <message>`, as `ToStatusErr` in the apiserver.

Not modelled: namespaceSelector/objectSelector/matchConditions, scope, matchPolicy Equivalent (rules are
matched on the version served), reinvocation, and concurrency: webhooks are called one after another
and the call blocks the sandbox's event loop, so a webhook must not call back into the sandbox.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from typing import Any, Final

from . import errors
from .registry import ResourceType
from .store import Store

LOG = logging.getLogger(__name__)

CONFIG_KEY: Final = ("admissionregistration.k8s.io", "validatingwebhookconfigurations")
DEFAULT_TIMEOUT: Final = 10


class WebhookCallError(Exception):
    """The webhook could not be called, or did not answer a usable AdmissionReview."""


def _matches(values: Any, wanted: str) -> bool:
    return isinstance(values, list) and ("*" in values or wanted in values)


def rule_matches(rule: Mapping[str, Any], rt: ResourceType, version: str, operation: str) -> bool:
    resources = rule.get("resources") or []
    return (_matches(rule.get("apiGroups"), rt.group) and _matches(rule.get("apiVersions"), version)
            and _matches(rule.get("operations"), operation)
            and ("*" in resources or "*/*" in resources or rt.plural in resources))


class ValidatingWebhooks:
    def __init__(self, store: Store, service_urls: Mapping[str, str]) -> None:
        self._store = store
        self._service_urls = dict(service_urls)

    def admit(self, rt: ResourceType, version: str, operation: str, obj: Mapping[str, Any],
              old: Mapping[str, Any] | None, *, dry_run: bool) -> None:
        """Raises an ApiError when a webhook denies the request (or fails with failurePolicy Fail)."""
        if rt.group == CONFIG_KEY[0]:
            return
        for config in self._store.objects(CONFIG_KEY):
            for hook in config.get("webhooks") or []:
                if any(rule_matches(r, rt, version, operation) for r in hook.get("rules") or []):
                    self._call(hook, rt, version, operation, obj, old, dry_run=dry_run)

    def _call(self, hook: Mapping[str, Any], rt: ResourceType, version: str, operation: str,
              obj: Mapping[str, Any], old: Mapping[str, Any] | None, *, dry_run: bool) -> None:
        name = str(hook.get("name") or "")
        meta = obj.get("metadata") or {}
        request = {
            "uid": str(uuid.uuid4()),
            "kind": {"group": rt.group, "version": version, "kind": rt.kind},
            "resource": {"group": rt.group, "version": version, "resource": rt.plural},
            "requestKind": {"group": rt.group, "version": version, "kind": rt.kind},
            "requestResource": {"group": rt.group, "version": version, "resource": rt.plural},
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""),
            "operation": operation,
            "userInfo": {"username": "sandbox"},
            "object": obj,
            "oldObject": old,
            "dryRun": dry_run,
        }
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        try:
            response = self._post(hook, review)
        except WebhookCallError as exc:
            if hook.get("failurePolicy", "Fail") == "Ignore":
                LOG.info("webhook %s failed, ignored (failurePolicy Ignore): %s", name, exc)
                return
            raise errors.ApiError(500, "InternalError",
                                  f'Internal error occurred: failed calling webhook "{name}": {exc}') from exc
        if response.get("allowed") is True:
            return
        status = response.get("status") or {}
        code = int(status.get("code") or 0)
        message = str(status.get("message") or status.get("reason") or "")
        denied = f'admission webhook "{name}" denied the request'
        raise errors.ApiError(max(code, 400), str(status.get("reason") or ""),
                              f"{denied}: {message}" if message else f"{denied} without explanation")

    def _url(self, client: Mapping[str, Any]) -> str:
        if client.get("url"):
            return str(client["url"])
        service = client.get("service") or {}
        key = f"{service.get('namespace')}/{service.get('name')}"
        base = self._service_urls.get(key)
        if base is None:
            raise WebhookCallError(f"failed to call webhook: service {key} is not known to the sandbox "
                                   "(Settings.webhook_service_urls)")
        return base.rstrip("/") + str(service.get("path") or "")

    def _post(self, hook: Mapping[str, Any], review: Mapping[str, Any]) -> Mapping[str, Any]:
        client = hook.get("clientConfig") or {}
        url = self._url(client)
        context = ssl.create_default_context()
        if client.get("caBundle"):
            try:
                context = ssl.create_default_context(cadata=base64.b64decode(client["caBundle"]).decode())
            except (ValueError, ssl.SSLError) as exc:
                raise WebhookCallError(f"failed to call webhook: bad caBundle: {exc}") from exc
        timeout = int(hook.get("timeoutSeconds") or DEFAULT_TIMEOUT)
        req = urllib.request.Request(url, data=json.dumps(review).encode(), method="POST",  # noqa: S310
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=context) as answer:  # noqa: S310
                body = json.loads(answer.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise WebhookCallError(f'failed to call webhook: Post "{url}": {exc}') from exc
        response = body.get("response") if isinstance(body, dict) else None
        if not isinstance(response, dict):
            raise WebhookCallError("received invalid webhook response: no response in AdmissionReview")
        return response
