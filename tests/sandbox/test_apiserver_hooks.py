"""Test hooks: the request log counts what clients really sent; injected faults fail, conflict or hang
the next matching requests without touching state."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import kubernetes.client as k
import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from dra_driver.defaults import DRIVER_NAME
from dra_sandbox.apiserver import ApiServer
from tests.kube_models import meta
from tests.narrow import present
from tests.polling import wait_for

pytestmark = pytest.mark.apiserver(fresh=True, max_hang_seconds=5.0)  # counts requests, injects faults


def a_slice(name: str) -> k.V1ResourceSlice:
    return k.V1ResourceSlice.model_validate({"metadata": {"name": name}, "spec": {
        "driver": DRIVER_NAME, "nodeName": "n1", "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1}}})


def test_request_log_counts_verbs_and_resources(server: ApiServer, api: k.ApiClient) -> None:
    res = k.ResourceV1Api(api)
    res.create_resource_slice(a_slice("a"))
    res.create_resource_slice(a_slice("b"))
    res.list_resource_slice()
    res.read_resource_slice("a")
    res.patch_resource_slice("a", {"metadata": {"labels": {"x": "y"}}})
    res.replace_resource_slice("b", res.read_resource_slice("b"))
    res.delete_resource_slice("b")
    res.delete_collection_resource_slice()
    with pytest.raises(ApiException):
        res.read_resource_slice("missing")
    log = server.request_log
    assert log.count(verb="create", resource="resourceslices") == 2
    assert log.count(verb="get", resource="resourceslices") == 3  # failed requests are logged too
    assert log.count(verb="get", resource="resourceslices", name="missing") == 1
    assert (log.count(verb="list"), log.count(verb="patch"), log.count(verb="update")) == (1, 1, 1)
    assert (log.count(verb="delete"), log.count(verb="deletecollection")) == (1, 1)
    assert log.count(resource="resourceslices") == 10
    assert log.count(group="resource.k8s.io") == 10
    assert [r.code for r in log.records() if r.name == "missing"] == [404]
    assert log.summary()[("create", "resourceslices")] == 2
    log.reset()
    assert log.count() == 0
    with pytest.raises(ValueError, match="unknown verb"):
        log.count(verb="fetch")


def test_status_subresource_is_counted_separately(server: ApiServer, api: k.ApiClient) -> None:
    res = k.ResourceV1Api(api)
    res.create_namespaced_resource_claim("default", k.ResourceV1ResourceClaim.model_validate(
        {"metadata": {"name": "c"}, "spec": {"devices": {}}}))
    res.patch_namespaced_resource_claim_status("c", "default", {"status": {}})
    res.patch_namespaced_resource_claim("c", "default", {"metadata": {"labels": {"a": "b"}}})
    log = server.request_log
    assert log.count(verb="patch", resource="resourceclaims/status") == 1
    assert log.count(verb="patch", resource="resourceclaims") == 1
    assert log.count(verb="patch", resource="resourceclaims", namespace="default") == 1


def test_debug_requests_serves_the_counts_by_verb_resource_and_code(server: ApiServer, api: k.ApiClient) -> None:
    """What a bench in another process reads: counts since the start, reading them is not itself counted."""
    res = k.ResourceV1Api(api)
    res.create_resource_slice(a_slice("a"))
    res.list_resource_slice()
    res.list_resource_slice()
    with pytest.raises(ApiException):
        res.read_resource_slice("missing")

    def counts() -> list[dict[str, object]]:
        with urllib.request.urlopen(server.url + "/debug/requests", timeout=5) as resp:
            return list(json.loads(resp.read())["requests"])

    expected = [
        {"verb": "create", "resource": "resourceslices", "code": 201, "count": 1},
        {"verb": "get", "resource": "resourceslices", "code": 404, "count": 1},
        {"verb": "list", "resource": "resourceslices", "code": 200, "count": 2},
    ]
    assert counts() == expected
    assert counts() == expected  # the first read did not count itself
    server.request_log.reset()
    assert counts() == []


def test_injected_500s_fail_the_next_n_requests_without_side_effects(server: ApiServer, api: k.ApiClient) -> None:
    res = k.ResourceV1Api(api)
    created = res.create_resource_slice(a_slice("s"))
    server.faults.inject(verb="update", resource="resourceslices", status=500, count=2)
    assert server.faults.pending() == 2
    body = res.read_resource_slice("s")
    body.spec.pool.generation = 2
    for _ in range(2):
        with pytest.raises(ApiException) as err:
            res.replace_resource_slice("s", body)
        assert err.value.status == 500 and json.loads(present(err.value.body))["reason"] == "InternalError"
        assert meta(res.read_resource_slice("s")).resource_version == meta(created).resource_version
    updated = res.replace_resource_slice("s", body)
    assert updated.spec.pool.generation == 2
    assert server.request_log.count(verb="update", resource="resourceslices") == 3
    assert server.faults.pending() == 0


def test_injected_conflict_and_scoping(server: ApiServer, api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    core.create_namespaced_config_map("default", k.V1ConfigMap(metadata=k.V1ObjectMeta(name="a")))
    core.create_namespaced_config_map("default", k.V1ConfigMap(metadata=k.V1ObjectMeta(name="b")))
    server.faults.inject(verb="patch", resource="configmaps", status=409, name="b")
    core.patch_namespaced_config_map("a", "default", {"data": {"x": "1"}})  # other name: unaffected
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_config_map("b", "default", {"data": {"x": "1"}})
    status = json.loads(present(err.value.body))
    assert err.value.status == 409 and status["reason"] == "Conflict" and status["details"]["name"] == "b"
    assert core.read_namespaced_config_map("b", "default").data is None


def test_injected_fault_on_watch(server: ApiServer) -> None:
    server.faults.inject(verb="watch", resource="configmaps", status=503)
    url = server.url + "/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=1"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url, timeout=5)
    assert err.value.code == 503 and err.value.headers["Retry-After"] == "1"
    assert json.loads(err.value.read())["reason"] == "ServiceUnavailable"
    assert server.request_log.count(verb="watch", resource="configmaps") == 1


def test_timeout_fault_hangs_until_the_client_gives_up(server: ApiServer, api: k.ApiClient) -> None:
    # urllib3 would retry a timed-out read on its own; this client reports the first timeout.
    impatient = k.ApiClient(k.Configuration(host=server.url, retries=0))
    res = k.ResourceV1Api(impatient)
    server.faults.inject(verb="list", resource="resourceslices", status="timeout")
    outcome: list[BaseException] = []

    def hang() -> None:
        try:
            res.list_resource_slice(_request_timeout=0.5)
        except urllib3.exceptions.HTTPError as exc:
            outcome.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=hang)
    thread.start()
    wait_for(lambda: not server.faults.pending(), 5, "the request to hang in the server")
    assert len(k.CoreV1Api(api).list_namespace().items) == 4  # ...which keeps serving everyone else
    thread.join(5)
    elapsed = time.monotonic() - started
    assert len(outcome) == 1 and 0.4 < elapsed < 4
    assert len(res.list_resource_slice().items) == 0  # the fault was used up
    impatient.close()  # type: ignore[no-untyped-call]  # ApiClient.close is unannotated
    # the abandoned request is logged once the server notices
    wait_for(lambda: 499 in [r.code for r in server.request_log.records()], 5, "the abandoned request in the log")
    assert sorted(r.code for r in server.request_log.records() if r.resource == "resourceslices") == [200, 499]


def test_timeout_fault_is_bounded() -> None:
    with ApiServer(max_hang_seconds=0.3) as srv, srv.api_client() as client:
        srv.faults.inject(verb="get", resource="namespaces", status="timeout")
        started = time.monotonic()
        with pytest.raises(ApiException) as err:
            k.CoreV1Api(client).read_namespace("default", _request_timeout=10)
        assert err.value.status == 504 and json.loads(present(err.value.body))["reason"] == "Timeout"
        assert time.monotonic() - started < 5


def test_hanging_request_does_not_block_stop() -> None:
    srv = ApiServer(max_hang_seconds=30).start()
    srv.faults.inject(verb="list", resource="namespaces", status="timeout")
    results: list[int] = []

    def call() -> None:
        with srv.api_client() as client:
            try:
                k.CoreV1Api(client).list_namespace(_request_timeout=20)
            except ApiException as exc:
                results.append(exc.status)
            except urllib3.exceptions.HTTPError:
                results.append(0)

    thread = threading.Thread(target=call)
    thread.start()
    wait_for(lambda: not srv.faults.pending(), 5, "the request to hang in the server")
    started = time.monotonic()
    srv.stop()
    thread.join(10)
    assert time.monotonic() - started < 5 and results and results[0] in (0, 504)


def test_bad_fault_arguments_are_refused(server: ApiServer) -> None:
    with pytest.raises(ValueError, match="HTTP code"):
        server.faults.inject(verb="get", resource="pods", status="slow")
    with pytest.raises(ValueError, match="unknown verb"):
        server.faults.inject(verb="read", resource="pods")
    with pytest.raises(ValueError, match="400-599"):
        server.faults.inject(verb="get", resource="pods", status=200)
    server.faults.inject(verb="get", resource="pods", count=3)
    server.faults.clear()
    assert server.faults.pending() == 0
