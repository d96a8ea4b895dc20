"""The one HTTP endpoint for Prometheus and the probes (dra_driver/observability/endpoint.py): paths, status
codes, bodies and content negotiation on a real socket."""

from __future__ import annotations

import gzip
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from dra_driver.observability.endpoint import HttpEndpoint


class Switch:
    def __init__(self) -> None:
        self.ok, self.reason = True, "ok: both sockets answer"

    def __call__(self) -> tuple[bool, str]:
        return self.ok, self.reason


@pytest.fixture
def served() -> Iterator[tuple[HttpEndpoint, Switch, Counter]]:
    registry = CollectorRegistry()
    counter = Counter("dra_driver_test_things", "things", registry=registry)
    counter.inc(3)
    probe = Switch()
    endpoint = HttpEndpoint(registry=registry, probe=probe, host="127.0.0.1")
    endpoint.start()
    try:
        yield endpoint, probe, counter
    finally:
        endpoint.stop()


def get(endpoint: HttpEndpoint, path: str, headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{endpoint.port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read()


@pytest.mark.parametrize("path", ["/healthz", "/livez", "/readyz", "/healthz?verbose=1"])
def test_probe_paths_answer_the_probe(served: tuple[HttpEndpoint, Switch, Counter], path: str) -> None:
    endpoint, probe, _ = served
    assert get(endpoint, path) == (200, "text/plain; charset=utf-8", b"ok: both sockets answer\n")
    probe.ok, probe.reason = False, "registration socket does not answer"
    assert get(endpoint, path) == (503, "text/plain; charset=utf-8", b"registration socket does not answer\n")


def test_metrics_are_prometheus_clients_exposition(served: tuple[HttpEndpoint, Switch, Counter]) -> None:
    endpoint, _, counter = served
    code, kind, body = get(endpoint, "/metrics")
    assert code == 200 and kind.startswith("text/plain")
    assert b"dra_driver_test_things_total 3.0" in body
    counter.inc()
    code, kind, body = get(endpoint, "/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})
    assert code == 200 and kind.startswith("application/openmetrics-text")
    assert b"dra_driver_test_things_total 4.0" in body and body.endswith(b"# EOF\n")
    code, _, body = get(endpoint, "/metrics", {"Accept-Encoding": "gzip"})
    assert code == 200 and b"dra_driver_test_things_total 4.0" in gzip.decompress(body)


def test_other_paths_are_not_found(served: tuple[HttpEndpoint, Switch, Counter]) -> None:
    endpoint, _, _ = served
    assert get(endpoint, "/") == (404, "text/plain; charset=utf-8", b"no such path: /\n")
    assert get(endpoint, "/metricsx")[0] == 404


def test_a_metrics_only_endpoint_has_no_probe_and_a_probe_only_one_no_metrics() -> None:
    registry = CollectorRegistry()
    Counter("dra_driver_test_other", "other", registry=registry)
    metrics_only = HttpEndpoint(registry=registry, host="127.0.0.1")
    probe_only = HttpEndpoint(probe=Switch(), host="127.0.0.1")
    metrics_only.start()
    probe_only.start()
    try:
        assert get(metrics_only, "/healthz")[0] == 404
        assert b"dra_driver_test_other_total 0.0" in get(metrics_only, "/metrics")[2]
        assert get(probe_only, "/metrics")[0] == 404
        assert get(probe_only, "/healthz")[0] == 200
    finally:
        metrics_only.stop()
        probe_only.stop()


def test_a_taken_port_fails_in_the_constructor(served: tuple[HttpEndpoint, Switch, Counter]) -> None:
    endpoint, _, _ = served
    with pytest.raises(OSError):
        HttpEndpoint(probe=Switch(), host="127.0.0.1", port=endpoint.port)


def test_an_endpoint_that_never_started_stops_at_once() -> None:
    endpoint = HttpEndpoint(probe=Switch(), host="127.0.0.1")
    stopper = threading.Thread(target=endpoint.stop, daemon=True)
    stopper.start()
    stopper.join(timeout=10)
    assert not stopper.is_alive(), "stop() of a never-started endpoint hangs"
