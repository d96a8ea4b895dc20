"""Hostile input at the controller's admission webhook: a real controller serving its webhook over HTTPS (a test CA)
against the sandbox API server, and raw requests on the wire, as anyone who can reach the port could send them.

What must hold (docs/webhook.md "What is refused"): an unknown path is 404, never an answer that allows; a body
that is no AdmissionReview is an HTTP 4xx with a `Status` naming the problem; an AdmissionReview the checks cannot
read is answered `allowed: false`, `status.code` 400, with the message, echoing `request.uid`; nothing is a bare
500; the body limit fits an UPDATE of two objects at the API server's request limit."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import http.client
import json
import re
import ssl
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_driver import defaults
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.operator import ControllerSettings, run
from dra_driver.controller.review import MAX_DEPTH
from dra_driver.controller.webhook import AdmissionServer, WebhookSettings
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.cluster import free_tcp_port, make_test_certs, tcp_accepts
from tests.polling import wait_for

DRIVER = "gpu.dra.dev"
TIMEOUT = 20.0
MIB = 1024 * 1024


@dataclass(frozen=True)
class Webhook:
    port: int
    context: ssl.SSLContext
    metrics: ControllerMetrics


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any

    @property
    def message(self) -> str:
        """The Status message of an HTTP error answer."""
        assert self.body["kind"] == "Status" and self.body["status"] == "Failure", self.body
        assert self.body["code"] == self.status
        return str(self.body["message"])

    def denied(self, uid: str = "u-1") -> tuple[int, str]:
        """An AdmissionReview answer that refuses: (status.code, status.message); checks the echo."""
        assert self.status == 200, self.body
        assert self.body["apiVersion"] == "admission.k8s.io/v1" and self.body["kind"] == "AdmissionReview"
        response = self.body["response"]
        assert response["uid"] == uid
        assert response["allowed"] is False, response
        return response["status"]["code"], response["status"]["message"]


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    certs = tmp_path_factory.mktemp("certs")
    make_test_certs(certs)
    port = free_tcp_port()
    metrics = ControllerMetrics()
    with ApiServer() as srv:
        kubeconfig = srv.write_kubeconfig(certs / "kubeconfig")
        settings = WebhookSettings(port=port, addr="127.0.0.1", certfile=str(certs / "tls.crt"),
                                   keyfile=str(certs / "tls.key"))
        options = ControllerSettings(driver_name=DRIVER, kubeconfig=str(kubeconfig), healthz_port=-1,
                                     resync_seconds=1.0, watch_timeout_seconds=10, webhook=settings)
        stop, ready = threading.Event(), threading.Event()
        thread = threading.Thread(target=run, args=(options,),
                                  kwargs={"stop_flag": stop, "ready_flag": ready, "metrics": metrics}, daemon=True)
        thread.start()
        try:
            assert ready.wait(TIMEOUT), "the controller did not become ready"
            wait_for(lambda: tcp_accepts(port), TIMEOUT, "the webhook server listening")
            context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
            yield Webhook(port, context, metrics)
        finally:
            stop.set()
            thread.join(TIMEOUT)
        assert not thread.is_alive(), "the controller did not stop"


def send(hook: Webhook, path: str, body: bytes | Iterable[bytes] | None, *, method: str = "POST",
         content_type: str | None = "application/json") -> Answer:
    conn = http.client.HTTPSConnection("127.0.0.1", hook.port, context=hook.context, timeout=TIMEOUT)
    try:
        headers = {"Content-Type": content_type} if content_type is not None else {}
        chunked = body is not None and not isinstance(body, bytes)
        conn.request(method, path, body=body, headers=headers, encode_chunked=chunked)
        answer = conn.getresponse()
        raw = answer.read()
        assert answer.getheader("Content-Type", "").startswith("application/json"), (answer.status, raw[:200])
        return Answer(answer.status, json.loads(raw))
    finally:
        conn.close()


def claim(parameters: Any = None) -> dict[str, Any]:
    params = parameters if parameters is not None else {
        "apiVersion": "gpu.dra.dev/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dra.dev"}}],
                                 "config": [{"requests": ["gpu"], "opaque": {"driver": DRIVER,
                                                                             "parameters": params}}]}}}


def review(obj: Any = None, *, operation: str = "CREATE", old: Any = None, **request: Any) -> dict[str, Any]:
    """An AdmissionReview as the API server sends it for a ResourceClaim."""
    body = {"uid": "u-1",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
            "requestKind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "requestResource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
            "name": "c", "namespace": "default", "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": claim() if obj is None else obj, "oldObject": old, "dryRun": False}
    body.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}


NESTED = re.compile(r'"<nested (\d+)>"')


def nested(depth: int) -> str:
    """A placeholder for a JSON object `depth` objects deep, {"a": {"a": ... {} }}, written out by `encode` (Python's
    own encoder would recurse as deep, near the test's recursion limit)."""
    return f"<nested {depth}>"


def encode(doc: Any) -> bytes:
    def deep(match: re.Match[str]) -> str:
        levels = int(match.group(1))
        return '{"a":' * (levels - 1) + "{}" + "}" * (levels - 1)

    return NESTED.sub(deep, json.dumps(doc)).encode()


def post(hook: Webhook, doc: Any, path: str = "/resourceclaims") -> Answer:
    return send(hook, path, encode(doc))


# --- what a well-formed review gets (so that the refusals below are refusals of the input, not of everything) ---

def test_a_valid_review_is_allowed_and_a_bad_config_denied_echoing_uid_and_version(webhook: Webhook) -> None:
    ok = post(webhook, review())
    assert ok.status == 200
    assert ok.body["apiVersion"] == "admission.k8s.io/v1" and ok.body["kind"] == "AdmissionReview"
    assert ok.body["response"]["uid"] == "u-1" and ok.body["response"]["allowed"] is True

    bad = claim({"apiVersion": "gpu.dra.dev/v1beta1", "kind": "GpuConfig",
                 "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}})
    code, message = post(webhook, review(bad, uid="u-2")).denied("u-2")
    assert code == 422
    assert message == ("spec.devices.config[0].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage: "
                       "must be a whole number between 1 and 100, got 101")


# --- paths and methods: fail closed ---

@pytest.mark.parametrize("path", ["/nonexistent", "/", "/resourceclaims/extra", "/ResourceClaims",
                                  "/resourceclaims%2F..%2Fdeviceclasses"])
def test_an_unknown_path_is_404_never_allowed(webhook: Webhook, path: str) -> None:
    answer = post(webhook, review(), path=path)
    assert answer.status == 404
    assert answer.message.startswith("no admission webhook at ")
    assert "this server checks /resourceclaims, /resourceclaimtemplates, /deviceclasses" in answer.message
    assert "response" not in answer.body


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_only_post_is_served(webhook: Webhook, method: str) -> None:
    answer = send(webhook, "/resourceclaims", json.dumps(review()).encode() if method == "PUT" else None,
                  method=method)
    assert answer.status == 405
    assert answer.message == f"{method} /resourceclaims: an AdmissionReview is sent with POST"


@pytest.mark.parametrize("content_type", ["text/plain", None, "application/json; charset=latin-1",
                                          "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_json_by_its_content_type_is_415(webhook: Webhook, content_type: str | None) -> None:
    answer = send(webhook, "/resourceclaims", json.dumps(review()).encode(), content_type=content_type)
    assert answer.status == 415
    assert answer.message.endswith("an AdmissionReview is sent as application/json (UTF-8)")
    assert answer.message.startswith(f"Content-Type {content_type or '(none)'!r}")


# --- bodies that are no AdmissionReview: HTTP 400 with a Status naming the problem ---

NOT_A_REVIEW = [
    pytest.param(b"", "the request body is empty; expected an AdmissionReview (admission.k8s.io/v1)", id="empty"),
    pytest.param(b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "x": "\xff\xfe"}',
                 "the request body is not UTF-8 (byte 71: invalid start byte); expected an AdmissionReview "
                 "(admission.k8s.io/v1) in JSON", id="non-utf8"),
    pytest.param(b"\xef\xbb\xbf{}", "the request body is not valid JSON: JSON is malformed: invalid character "
                                     "(byte 0)", id="bom"),
    pytest.param(b"not json", "the request body is not valid JSON: JSON is malformed: invalid character (byte 4)",
                 id="not-json"),
    pytest.param(b'{"apiVersion": "admission.k8s.io/v1"', "the request body is not valid JSON: Input data was "
                                                           "truncated", id="truncated"),
    pytest.param(b'{"a": NaN}', "the request body is not valid JSON: JSON is malformed: invalid character "
                                "(byte 6)", id="nan"),
    pytest.param(b'{"a": 1' + b"0" * 5000 + b"}", "the request body is not valid JSON: Integer value out of range",
                 id="huge-integer"),
    pytest.param(b"[]", "the request body must be a JSON object (an AdmissionReview), got array", id="list"),
    pytest.param(b"null", "the request body must be a JSON object (an AdmissionReview), got null", id="null"),
    pytest.param(b'"review"', "the request body must be a JSON object (an AdmissionReview), got string",
                 id="string"),
    pytest.param(b"[" * 1000 + b"]" * 1000, "the request body nests JSON arrays and objects too deeply to decode; "
                                            f"at most {MAX_DEPTH} levels are accepted", id="nested-1000"),
    pytest.param(b'{"a":' * 100_000 + b"{}" + b"}" * 100_000, "the request body nests JSON arrays and objects too "
                 f"deeply to decode; at most {MAX_DEPTH} levels are accepted", id="nested-100000"),
]


@pytest.mark.parametrize("body,message", NOT_A_REVIEW)
def test_a_body_that_is_no_json_object_is_400_with_the_reason(webhook: Webhook, body: bytes, message: str) -> None:
    answer = send(webhook, "/resourceclaims", body)
    assert answer.status == 400
    assert answer.message.startswith(message), answer.message


def _without(doc: dict[str, Any], *path: str) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return doc


def _with(doc: dict[str, Any], value: Any, *path: str) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


UNANSWERABLE = [
    pytest.param(_with(review(), "admission.k8s.io/v1beta1", "apiVersion"),
                 "expected apiVersion admission.k8s.io/v1 kind AdmissionReview, got apiVersion "
                 "'admission.k8s.io/v1beta1' kind 'AdmissionReview' (the webhook configuration must list "
                 "admissionReviewVersions [v1])", id="v1beta1"),
    pytest.param(_without(review(), "apiVersion"), "expected apiVersion admission.k8s.io/v1 kind AdmissionReview, "
                 "got apiVersion None kind 'AdmissionReview'", id="no-apiVersion"),
    pytest.param(_with(review(), "ConversionReview", "kind"), "expected apiVersion admission.k8s.io/v1 kind "
                 "AdmissionReview, got apiVersion 'admission.k8s.io/v1' kind 'ConversionReview'", id="wrong-kind"),
    pytest.param(_without(review(), "request"), "request must be a JSON object, got null", id="no-request"),
    pytest.param(_with(review(), [review()["request"]], "request"), "request must be a JSON object, got array",
                 id="request-list"),
    pytest.param(_with(review(), "x", "request"), "request must be a JSON object, got string", id="request-string"),
    pytest.param(_without(review(), "request", "uid"), "request.uid must be a non-empty string, got null; an "
                 "answer must echo it", id="no-uid"),
    pytest.param(_with(review(), "", "request", "uid"), "request.uid must be a non-empty string, got string "
                 "(empty); an answer must echo it", id="empty-uid"),
    pytest.param(_with(review(), 7, "request", "uid"), "request.uid must be a non-empty string, got number",
                 id="number-uid"),
]


@pytest.mark.parametrize("doc,message", UNANSWERABLE)
def test_a_review_that_cannot_be_answered_is_400_with_the_reason(webhook: Webhook, doc: Any, message: str) -> None:
    answer = post(webhook, doc)
    assert answer.status == 400
    assert answer.message.startswith(message), answer.message


# --- AdmissionReviews the checks cannot read: answered allowed: false, code 400, the uid echoed ---

PARAMS_900_DEEP = claim(nested(900))
DENIED = [
    pytest.param(review([claim()]), "request.object must be a JSON object, got array", id="object-list"),
    pytest.param(review("claim"), "request.object must be a JSON object, got string", id="object-string"),
    pytest.param(review(7), "request.object must be a JSON object, got number", id="object-number"),
    pytest.param(_with(review(), None, "request", "object"),
                 "request.object is missing; a CREATE review carries the object to check", id="create-no-object"),
    pytest.param(review(operation="UPDATE"), "request.oldObject is missing; an UPDATE review carries the stored "
                 "object too", id="update-no-old"),
    pytest.param(review(operation="UPDATE", old=[1]), "request.oldObject must be a JSON object, got array",
                 id="old-list"),
    pytest.param(_with(review(), ["x"], "request", "object", "metadata"),
                 "request.object.metadata must be a JSON object, got array", id="metadata-list"),
    pytest.param(_without(review(), "request", "operation"), "request.operation must be one of CREATE, UPDATE, "
                 "DELETE, CONNECT, got None", id="no-operation"),
    pytest.param(review(operation="create"), "request.operation must be one of CREATE, UPDATE, DELETE, CONNECT, "
                 "got 'create'", id="lowercase-operation"),
    pytest.param(_without(review(), "request", "userInfo"), "request.userInfo must be a JSON object, got null",
                 id="no-userInfo"),
    pytest.param(_without(review(), "request", "resource"), "request.resource is null; the handler at "
                 "/resourceclaims checks resource.k8s.io/v1 resourceclaims", id="no-resource"),
    pytest.param(_with(review(), {"group": "resource.k8s.io", "version": "v1", "resource": "deviceclasses"},
                       "request", "resource"),
                 "request.resource is 'resource.k8s.io'/'v1' 'deviceclasses'; the handler at /resourceclaims checks "
                 "resource.k8s.io/v1 resourceclaims", id="other-resource"),
    pytest.param(review(dryRun="yes"), "request.dryRun must be a boolean, got string", id="dryRun-string"),
    pytest.param(review(subResource=["status"]), "request.subResource must be a string, got array",
                 id="subResource-list"),
    pytest.param(review(PARAMS_900_DEEP),
                 "request.object.spec.devices.config[0].opaque.parameters.a.a.a", id="parameters-900-deep"),
    # parameters is depth 9 (review 1, request 2, object 3, spec 4, devices 5, config 6, [0] 7, opaque 8).
    pytest.param(review(claim(nested(MAX_DEPTH - 7))),
                 "request.object.spec.devices.config[0].opaque.parameters.a.a.a", id="one-past-the-limit"),
    pytest.param(review(operation="UPDATE", old=PARAMS_900_DEEP),
                 "request.oldObject.spec.devices.config[0].opaque.parameters.a.a.a", id="old-900-deep"),
    pytest.param(review(options={"x": nested(300)}), "request.options.x.a.a", id="options-deep"),
    pytest.param(review(userInfo={"username": "u", "extra": {"k": [nested(200)]}}),
                 "request.userInfo.extra.k[0].a.a", id="userInfo-deep"),
]


@pytest.mark.parametrize("doc,message", DENIED)
def test_a_review_the_checks_cannot_read_is_denied_with_the_reason(webhook: Webhook, doc: Any, message: str) -> None:
    code, said = post(webhook, doc).denied()
    assert code == 400
    assert said.startswith(message), said


def test_the_message_of_too_deep_names_the_limit(webhook: Webhook) -> None:
    code, message = post(webhook, review(claim(nested(MAX_DEPTH - 7)))).denied()
    assert code == 400
    assert message.endswith(f"... is nested more than {MAX_DEPTH} levels deep (counted from the AdmissionReview); "
                            "this webhook refuses deeper documents"), message
    assert len(message) < 400


def test_nesting_at_the_limit_is_checked_normally(webhook: Webhook) -> None:
    """Depth MAX_DEPTH is still read: the decoder refuses the unknown field, not the depth."""
    code, message = post(webhook, review(claim(nested(MAX_DEPTH - 8)))).denied()
    assert code == 422
    assert message.startswith("spec.devices.config[0].opaque.parameters")
    assert "nested" not in message


def test_a_delete_review_is_not_checked(webhook: Webhook) -> None:
    """DELETE carries only oldObject; nothing to check (the chart never sends one; kopf's handlers are for CREATE
    and UPDATE), so it is allowed rather than refused for a missing object."""
    answer = post(webhook, review(operation="DELETE", object=None, old=claim()))
    assert answer.status == 200 and answer.body["response"]["allowed"] is True


# --- the body limit ---

def test_an_update_of_two_objects_at_the_api_servers_request_limit_fits(webhook: Webhook) -> None:
    """kube-apiserver accepts request bodies up to 3 MiB (MaxRequestBodyBytes); an UPDATE review carries the new
    object and the stored one."""
    big = claim()
    big["metadata"]["annotations"] = {"example.com/blob": ""}
    big["metadata"]["annotations"]["example.com/blob"] = "x" * (3 * MIB - len(json.dumps(big)))
    assert len(json.dumps(big)) == 3 * MIB
    body = json.dumps(review(big, operation="UPDATE", old=big)).encode()
    assert 6 * MIB < len(body) <= defaults.CONTROLLER_WEBHOOK_MAX_REQUEST_BYTES
    answer = send(webhook, "/resourceclaims", body)
    assert answer.status == 200 and answer.body["response"]["allowed"] is True


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_over_the_limit_is_413(webhook: Webhook, chunked: bool) -> None:
    limit = defaults.CONTROLLER_WEBHOOK_MAX_REQUEST_BYTES
    body = b"x" * (limit + 1)
    answer = send(webhook, "/resourceclaims", (body[i:i + MIB] for i in range(0, len(body), MIB)) if chunked
                  else body)
    assert answer.status == 413
    assert answer.message == (f"the request body is larger than {limit} bytes, this webhook's limit "
                              "(--webhook-max-request-bytes, docs/webhook.md)")


def test_refusals_are_counted_as_malformed(webhook: Webhook) -> None:
    labels = {"resource": "deviceclasses", "result": "malformed"}
    before = webhook.metrics.value("dra_driver_controller_admissions_total", labels)
    send(webhook, "/deviceclasses", b"[]")
    post(webhook, _with(review(), {"group": "x", "version": "v1", "resource": "y"}, "request", "resource"),
         path="/deviceclasses")
    assert webhook.metrics.value("dra_driver_controller_admissions_total", labels) == before + 2


# --- a server started alone: failures behind the front door, a sender that trickles ---

@contextlib.contextmanager
def alone(certs: Path, fn: Any, **settings: Any) -> Iterator[Webhook]:
    """An AdmissionServer serving `fn` (kopf's admission function in the controller) on its own event loop."""
    make_test_certs(certs)
    port = free_tcp_port()
    server = AdmissionServer(addr="127.0.0.1", port=port, certfile=str(certs / "tls.crt"),
                             pkeyfile=str(certs / "tls.key"), max_request_bytes=MIB, metrics=None, **settings)
    loop = asyncio.new_event_loop()
    served = threading.Event()

    async def serve() -> None:
        async for _ in server(fn):
            served.set()

    task = loop.create_task(serve())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        assert served.wait(TIMEOUT)
        yield Webhook(port, ssl.create_default_context(cafile=str(certs / "ca.crt")), ControllerMetrics())
    finally:
        async def stop() -> None:
            # The server and whatever connection handlers aiohttp still runs: all of them end before the loop does.
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for other in others:
                other.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), loop).result(TIMEOUT)
        assert task.done()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(TIMEOUT)
        loop.close()


async def allow(request: Any, **_: Any) -> Any:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": request["request"]["uid"], "allowed": True}}


def test_a_failure_in_the_checks_is_denied_with_code_500(tmp_path: Path) -> None:
    """kopf's admission function raising (a bug, not an input the front door knows)."""
    async def broken(request: Any, **_: Any) -> Any:
        raise KeyError("spec")

    with alone(tmp_path, broken) as hook:
        code, message = post(hook, review()).denied()
    assert code == 500
    assert message == "the webhook could not check this request: KeyError: 'spec'"


def test_a_body_that_does_not_arrive_in_time_is_408(tmp_path: Path) -> None:
    with alone(tmp_path, allow, body_timeout_s=0.5) as hook:
        conn = http.client.HTTPSConnection("127.0.0.1", hook.port, context=hook.context, timeout=TIMEOUT)
        try:
            conn.putrequest("POST", "/resourceclaims")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", "1000")
            conn.endheaders(b'{"apiVersion": ')  # and nothing more
            answer = conn.getresponse()
            assert answer.status == 408
            assert json.loads(answer.read())["message"] == "the request body did not arrive within 0.5 s"
        finally:
            conn.close()
        assert post(hook, review()).body["response"]["allowed"] is True  # others are still served
