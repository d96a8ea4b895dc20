"""kopf, unchanged, runs an operator against the sandbox API server: it discovers a CRD, watches it,
handles a create event and patches status and annotations back."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import kopf
import kubernetes.client as k
import pytest

from dra_sandbox.apiserver import ApiServer
from tests.polling import wait_for

pytestmark = pytest.mark.apiserver(fresh=True)  # kopf leaves watches and finalizers behind

GROUP = "kopf.example.com"
CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"gpusharingpolicies.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": "gpusharingpolicies", "singular": "gpusharingpolicy", "kind": "GpuSharingPolicy"},
        "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                      "schema": {"openAPIV3Schema": {"type": "object",
                                                     "x-kubernetes-preserve-unknown-fields": True}}}],
    },
}


def run_operator(server: ApiServer, registry: kopf.OperatorRegistry, stop: threading.Event,
                 ready: threading.Event) -> None:
    async def main() -> None:
        stop_flag: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ready_flag: asyncio.Event = asyncio.Event()

        async def watch_stop() -> None:
            await asyncio.to_thread(stop.wait)
            stop_flag.set_result(None)

        async def report_ready() -> None:
            await ready_flag.wait()
            ready.set()

        helpers = [asyncio.create_task(watch_stop()), asyncio.create_task(report_ready())]
        try:
            await kopf.operator(registry=registry, standalone=True, clusterwide=True, stop_flag=stop_flag,
                                ready_flag=ready_flag)
        finally:
            for task in helpers:
                task.cancel()

    asyncio.run(main())


def test_kopf_operator_handles_create_and_patches_status(server: ApiServer) -> None:
    with server.api_client() as api:
        k.ApiextensionsV1Api(api).create_custom_resource_definition(k.V1CustomResourceDefinition.model_validate(CRD))
    registry = kopf.OperatorRegistry()
    seen: list[str] = []

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=server.url, token="sandbox")

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.watching.server_timeout = 10
        settings.watching.client_timeout = 15
        settings.persistence.finalizer = f"{GROUP}/kopf-finalizer"

    @kopf.on.create(GROUP, "v1", "gpusharingpolicies", id="created", registry=registry)
    def created(spec: kopf.Spec, name: str, **_: Any) -> dict[str, Any]:
        seen.append(name)
        return {"classes": [f"{name}-{spec.get('mode', 'exclusive')}"]}

    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=run_operator, args=(server, registry, stop, ready), daemon=True)
    thread.start()
    try:
        assert ready.wait(20), "kopf did not become ready"
        with server.api_client() as api:
            custom = k.CustomObjectsApi(api)
            custom.create_namespaced_custom_object(GROUP, "v1", "default", "gpusharingpolicies", {
                "apiVersion": f"{GROUP}/v1", "kind": "GpuSharingPolicy", "metadata": {"name": "shared"},
                "spec": {"mode": "timeslice"}})

            def handled() -> dict[str, Any] | None:
                obj = custom.get_namespaced_custom_object(GROUP, "v1", "default", "gpusharingpolicies", "shared")
                assert isinstance(obj, dict)  # the client returns custom objects as decoded JSON
                return obj if (obj.get("status") or {}).get("created") else None

            obj = wait_for(handled, 20, "kopf to record its handler's result in the status", interval=0.05)
            assert seen == ["shared"]
            assert obj["status"]["created"] == {"classes": ["shared-timeslice"]}
            assert "kopf.zalando.org/last-handled-configuration" in obj["metadata"]["annotations"]
            assert server.request_log.count(verb="watch", resource="gpusharingpolicies") >= 1
            assert server.request_log.count(verb="patch", resource="gpusharingpolicies/status") >= 1
    finally:
        stop.set()
        thread.join(20)
    assert not thread.is_alive(), "kopf did not stop"
