"""The sandbox API server the sandbox tests talk to, and a kubernetes client of it.

A module configures its server with a marker: `pytestmark = pytest.mark.apiserver(kube_version="1.35.2")` passes
the keyword arguments to `ApiServer`; `fresh=True` starts a server for every test (for tests that count requests
or inject faults, which are server-wide) instead of one per module.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes.client as k
import pytest

from dra_driver.k8s.client import KubeRest
from dra_sandbox.apiserver import ApiServer


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "apiserver(fresh=False, **options): ApiServer options of the `server` fixture; fresh: one per test"
    )


def _apiserver_marker(request: pytest.FixtureRequest) -> tuple[bool, dict[str, Any]]:
    marker = request.node.get_closest_marker("apiserver")
    options = dict(marker.kwargs) if marker is not None else {}
    return bool(options.pop("fresh", False)), options


@pytest.fixture(scope="module")
def module_server(request: pytest.FixtureRequest) -> Iterator[ApiServer]:
    """The API server shared by the tests of one module (they make their object names unique)."""
    _, options = _apiserver_marker(request)
    with ApiServer(**options) as srv:
        yield srv


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[ApiServer]:
    """The module's API server, or a new one for this test where the module's marker says `fresh=True`."""
    fresh, options = _apiserver_marker(request)
    if not fresh:
        shared: ApiServer = request.getfixturevalue("module_server")
        yield shared
        return
    with ApiServer(**options) as srv:
        yield srv


@pytest.fixture
def api(server: ApiServer) -> Iterator[k.ApiClient]:
    """A kubernetes client of `server`, closed after the test."""
    with server.api_client() as client:
        yield client


def create_claim(rest: KubeRest, name: str, exactly: dict[str, Any]) -> None:
    """ResourceClaim `name` in `default` with one request `gpu` (`exactly` its ExactDeviceRequest), and pod
    `pod-<name>` that uses it."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
    rest.request("POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", body=body)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"pod-{name}", "namespace": "default"},
        "spec": {
            "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        },
    }
    rest.request("POST", "/api/v1/namespaces/default/pods", body=pod)
