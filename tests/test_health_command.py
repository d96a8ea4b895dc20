"""`dra-driver health taint|clear|show|migrate`: DeviceTaintRules in the version each release serves, found by
discovery; deterministic names; flags checked before any request; the legacy Node annotation converted once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_driver.cli import main
from dra_driver.commands.health import problems_of, rule_name, taint_rule
from dra_driver.defaults import DRIVER_NAME
from dra_driver.k8s.client import JsonObject, KubeRest
from dra_driver.k8s.taintrules import TaintRulesUnavailable, taint_rules_path
from dra_sandbox.apiserver import ApiServer

D = DRIVER_NAME


def test_names_are_deterministic_valid_and_bounded() -> None:
    assert rule_name(D, "node-h100", "gpu-3") == f"{D}.admin.node-h100.gpu-3"
    long = rule_name(D, "n" * 250, "gpu-0-mig-1g10gb-19-0")
    assert len(long) <= 253 and long.endswith(".gpu-0-mig-1g10gb-19-0") and long == rule_name(D, "n" * 250,
                                                                                              "gpu-0-mig-1g10gb-19-0")
    assert rule_name(D, "n" * 250, "gpu-1") != rule_name(D, "n" * 249 + "m", "gpu-1")


def test_flags_are_checked_before_any_request() -> None:
    assert problems_of("taint", "", "", f"{D}/admin", "unhealthy") == [
        "--node is required for taint", "--device is required for taint"]
    found = problems_of("taint", "n", "GPU_3", "bad key", "-no-")
    assert any(p.startswith("--device 'GPU_3':") for p in found)
    assert any(p.startswith("--key 'bad key':") for p in found) and any(p.startswith("--value '-no-':") for p in found)
    assert problems_of("migrate", "", "", f"{D}/admin", "unhealthy") == []


def test_the_rule_selects_driver_pool_and_device() -> None:
    rule = taint_rule("resource.k8s.io/v1beta2", D, "n1", "gpu-3", effect="NoExecute", key="", value="unhealthy",
                      reason="fan")
    assert rule["apiVersion"] == "resource.k8s.io/v1beta2"
    assert rule["spec"] == {"deviceSelector": {"driver": D, "pool": "n1", "device": "gpu-3"},
                            "taint": {"key": f"{D}/admin", "value": "unhealthy", "effect": "NoExecute"}}
    assert rule["metadata"]["annotations"] == {f"{D}/reason": "fan"}


class NoTaintRules(KubeRest):
    """A server whose resource.k8s.io serves v1 without devicetaintrules (a 1.36 with the gate off)."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def request(self, method: str, path: str, **kwargs: Any) -> JsonObject:
        self.paths.append(path)
        if path == "/apis/resource.k8s.io":
            return {"versions": [{"version": "v1"}, {"version": "v1beta2"}]}
        return {"resources": [{"name": "resourceslices"}]}

    def get(self, path: str, **kwargs: Any) -> JsonObject | None:
        return self.request("GET", path)


def test_a_cluster_without_the_kind_gets_a_clear_error_and_no_request_to_it() -> None:
    rest = NoTaintRules()
    with pytest.raises(TaintRulesUnavailable, match="DRADeviceTaintRules=true"):
        taint_rules_path(rest)
    assert rest.paths == ["/apis/resource.k8s.io", "/apis/resource.k8s.io/v1", "/apis/resource.k8s.io/v1beta2"]


def health(kubeconfig: Path, *args: str) -> int:
    return main(["health", *args, "--kubeconfig", str(kubeconfig)])


@pytest.mark.parametrize(("version", "api"), [("1.34.0", "v1alpha3"), ("1.35.0", "v1alpha3"),
                                              ("1.36.0", "v1beta2"), ("1.37.0", "v1")])
def test_taint_show_and_clear_on_every_supported_release(tmp_path: Path, version: str, api: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    with ApiServer(kube_version=version) as srv:
        srv.write_kubeconfig(kubeconfig)
        rest = srv.rest()
        path = f"/apis/resource.k8s.io/{api}/devicetaintrules"
        name = rule_name(D, "node-h100", "gpu-3")
        assert health(kubeconfig, "taint", "--node", "node-h100", "--device", "gpu-3", "--effect", "NoExecute",
                      "--reason", "fan failure") == 0
        rule = rest.get(f"{path}/{name}") or {}
        assert rule["spec"]["taint"]["effect"] == "NoExecute" and rule["spec"]["taint"]["timeAdded"]
        assert rule["spec"]["deviceSelector"] == {"driver": D, "pool": "node-h100", "device": "gpu-3"}
        # Again with another effect: the same rule, replaced.
        assert health(kubeconfig, "taint", "--node", "node-h100", "--device", "gpu-3", "--effect", "None") == 0
        rules = rest.request("GET", path)["items"]
        assert [(r["metadata"]["name"], r["spec"]["taint"]["effect"]) for r in rules] == [(name, "None")]
        capsys.readouterr()
        assert health(kubeconfig, "show", "--node", "node-h100") == 0
        assert f"{name}: {D}/node-h100/gpu-3 {D}/admin=unhealthy:None" in capsys.readouterr().out
        assert health(kubeconfig, "clear", "--node", "node-h100", "--device", "gpu-3") == 0
        assert rest.get(f"{path}/{name}") is None
        assert health(kubeconfig, "clear", "--node", "node-h100", "--device", "gpu-3") == 0  # nothing left: fine
        assert "has no admin taint" in capsys.readouterr().out


def test_migrate_converts_the_legacy_annotation_once(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    key = f"{D}/device-health"
    with ApiServer(kube_version="1.37.0") as srv:
        srv.write_kubeconfig(kubeconfig)
        rest = srv.rest()
        for node, value in (("n1", "gpu-3=unhealthy,gpu-4=healthy@17"), ("n2", ""), ("n3", "gpu-0=unhealthy")):
            meta: JsonObject = {"name": node}
            if value:
                meta["annotations"] = {key: value}
            rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": meta})
        assert health(kubeconfig, "migrate") == 0
        rules = rest.request("GET", "/apis/resource.k8s.io/v1/devicetaintrules")["items"]
        assert sorted((r["metadata"]["name"], r["spec"]["taint"]["effect"]) for r in rules) == [
            (rule_name(D, "n1", "gpu-3"), "NoSchedule"), (rule_name(D, "n3", "gpu-0"), "NoSchedule")]
        for node in ("n1", "n2", "n3"):
            assert key not in ((rest.get(f"/api/v1/nodes/{node}") or {})["metadata"].get("annotations") or {})
        assert health(kubeconfig, "migrate") == 0  # idempotent: nothing left to convert
        assert len(rest.request("GET", "/apis/resource.k8s.io/v1/devicetaintrules")["items"]) == 2
