"""The controller converges once API errors stop: a policy applied while the sandbox API server fails the
controller's requests (500 everywhere, or 409 on its DeviceClass writes) ends with the right DeviceClass and
Ready=True, through the reconcile's retry backoff (the resync timer is 60 s here, too slow to be what helps)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.controller_bench import inject
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.operator import ControllerSettings, retry_delay, run
from dra_driver.k8s.client import KubeRest
from dra_sandbox.apiserver import ApiServer, ChaosFaults
from tests.controller.test_controller_sandbox import CHART_CRD, CLASSES, DRIVER, POLICIES, policy, wait_ready
from tests.polling import wait_for

TIMEOUT = 20.0


@pytest.fixture
def chaos(tmp_path: Path) -> Iterator[tuple[ApiServer, KubeRest, ChaosFaults, ControllerMetrics]]:
    faults = ChaosFaults(seed=3)
    with ApiServer(faults=faults) as srv, srv.rest() as rest:
        rest.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                     body=yaml.safe_load(CHART_CRD.read_text()))
        kubeconfig = tmp_path / "kubeconfig"
        srv.write_kubeconfig(kubeconfig)
        metrics = ControllerMetrics()
        stop, ready = threading.Event(), threading.Event()
        options = ControllerSettings(driver_name=DRIVER, kubeconfig=str(kubeconfig), healthz_port=-1,
                                    resync_seconds=60.0, watch_timeout_seconds=10)
        thread = threading.Thread(target=run, args=(options,), daemon=True,
                                  kwargs={"stop_flag": stop, "ready_flag": ready, "metrics": metrics})
        thread.start()
        try:
            assert ready.wait(TIMEOUT), "the controller did not become ready"
            yield srv, rest, faults, metrics
        finally:
            stop.set()
            thread.join(TIMEOUT)
        assert not thread.is_alive()


def mps(pct: int) -> dict[str, Any]:
    return {"devices": {"type": "gpu", "productNames": ["NVIDIA H100 80GB HBM3"]},
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": pct}}}


@pytest.mark.parametrize("status", [500, 409])
def test_a_policy_applied_during_api_errors_converges_once_they_stop(
    chaos: tuple[ApiServer, KubeRest, ChaosFaults, ControllerMetrics], status: int,
) -> None:
    srv, rest, faults, metrics = chaos
    inject(faults, 1.0, status)
    rest.request("POST", POLICIES, body=policy("during-errors", mps(40)))
    # The errors last until the controller has failed (and retried) at least twice.
    wait_for(lambda: faults.random_failures >= 2, TIMEOUT, "the controller to hit the errors twice", interval=0.02)
    # (Read from the store: this client's own GET of a DeviceClass would be faulted too.)
    assert not [c for c in srv.snapshot("resource.k8s.io", "deviceclasses")
                if c["metadata"]["name"] == "during-errors"]
    failed = [r for r in srv.request_log.records() if r.code == status]
    assert failed and {r.resource for r in failed} <= {"deviceclasses", "gpusharingpolicies"}
    faults.clear()

    obj = wait_ready(rest, "during-errors", "True")
    assert obj["status"]["deviceClassName"] == "during-errors"
    cls = rest.get(f"{CLASSES}/during-errors")
    assert cls is not None
    assert cls["spec"]["config"][0]["opaque"]["parameters"]["sharing"] == mps(40)["sharing"]
    assert cls["metadata"]["ownerReferences"][0]["name"] == "during-errors"
    assert metrics.value("dra_driver_controller_reconciles_total", {"outcome": "ready"}) >= 1
    if status == 409:  # the class write failed and was retried by the handler (500s on patches: kopf retries)
        assert metrics.value("dra_driver_controller_reconciles_total", {"outcome": "retry"}) >= 1


def test_retry_delay_backs_off_and_is_capped() -> None:
    assert [retry_delay(n, 60.0) for n in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert retry_delay(3, 5.0) == 5.0
    assert retry_delay(100, 60.0) == 30.0
