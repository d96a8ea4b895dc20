"""The kubectl backend against a fake `kubectl` on PATH: the exact command lines, stdin, env parsing, errors,
and a whole scenario run through it (the fake keeps objects as files and answers like kubectl does)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dra_sandbox.e2e.backend import BackendError
from dra_sandbox.e2e.kubectl import KubectlBackend, KubectlConfig, parse_env_output
from dra_sandbox.e2e.loader import load_scenario
from dra_sandbox.e2e.runner import FAIL, PASS, Runner, RunnerConfig
from dra_sandbox.e2e.scenario import ObjectRef

SCENARIOS = Path(__file__).resolve().parents[2] / "e2e" / "scenarios"

# A tiny kubectl: objects live as JSON files under $FAKE_KUBE_DIR/objects; every call is logged.
# Pods are "scheduled" at once onto the node whose e2e.dra.dev/node label matches their nodeSelector (Running,
# or Succeeded for restartPolicy Never), else they stay Pending with kube-scheduler's message. Container logs
# come from $FAKE_KUBE_DIR/logs/<pod>.<container>.
FAKE_KUBECTL = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    state = Path(os.environ["FAKE_KUBE_DIR"])
    argv = sys.argv[1:]
    stdin = sys.stdin.read() if "-" in argv else None
    with open(state / "calls.jsonl", "a") as log:
        log.write(json.dumps({"argv": argv, "stdin": stdin}) + "\\n")
    def opt(name):
        return argv[argv.index(name) + 1] if name in argv else None
    while argv and argv[0] in ("--kubeconfig", "--context"):
        argv = argv[2:]
    verb, rest = argv[0], argv[1:]
    objects = state / "objects"
    objects.mkdir(exist_ok=True)
    def path(resource, name, namespace):
        return objects / f"{resource}.{namespace or '-'}.{name}.json"
    plural = {"Pod": "pods", "ResourceClaim": "resourceclaims.resource.k8s.io", "Namespace": "namespaces",
              "ResourceClaimTemplate": "resourceclaimtemplates.resource.k8s.io",
              "DeviceClass": "deviceclasses.resource.k8s.io"}
    nodes = json.loads((state / "nodes.json").read_text())
    if verb == "apply":
        obj = json.loads(stdin)
        meta = obj["metadata"]
        refusals = state / "sa-refusals"
        if obj["kind"] == "Pod" and refusals.exists() and int(refusals.read_text()) > 0:
            refusals.write_text(str(int(refusals.read_text()) - 1))
            print(f'Error from server (Forbidden): error when creating "STDIN": pods "{meta["name"]}" is forbidden: '
                  f'error looking up service account {meta["namespace"]}/default: serviceaccount "default" not found',
                  file=sys.stderr)
            sys.exit(1)
        if obj["kind"] == "Pod":
            wanted = (obj["spec"].get("nodeSelector") or {}).get("e2e.dra.dev/node")
            node = next((n["metadata"]["name"] for n in nodes["items"]
                         if n["metadata"]["labels"].get("e2e.dra.dev/node") == wanted), None)
            unschedulable = (state / "unschedulable").read_text().split() if (state / "unschedulable").exists() else []
            if node and meta["name"] not in unschedulable:
                obj["spec"]["nodeName"] = node
                obj["status"] = {"phase": "Running" if obj["spec"]["restartPolicy"] == "Always" else "Succeeded"}
            else:
                obj["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                    "reason": "Unschedulable", "message": "0/3 nodes are available: 3 cannot allocate all claims."}]}
        path(plural[obj["kind"]], meta["name"], meta.get("namespace")).write_text(json.dumps(obj))
        print(f"{obj['kind'].lower()}/{meta['name']} configured")
    elif verb == "get" and rest[0] == "nodes":
        print(json.dumps(nodes))
    elif verb == "get" and rest[0] == "events":
        events = state / "events.json"
        print(events.read_text() if events.exists() else json.dumps({"items": []}))
    elif verb == "get":
        p = path(rest[0], rest[1], opt("--namespace"))
        if p.exists():
            print(p.read_text())
    elif verb == "delete":
        if rest[0] == "namespaces":
            for p in objects.glob(f"*.{rest[1]}.*.json"):
                p.unlink()
        path(rest[0], rest[1], opt("--namespace")).unlink(missing_ok=True)
    elif verb == "logs":
        log = state / "logs" / f"{rest[0]}.{opt('--container')}"
        if not log.exists():
            print(f'Error from server (BadRequest): container "{opt("--container")}" is waiting to start',
                  file=sys.stderr)
            sys.exit(1)
        print(log.read_text(), end="")
    else:
        print(f"error: unknown command {verb!r}", file=sys.stderr)
        sys.exit(1)
    """
)


@pytest.fixture
def fake_kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(f"#!{sys.executable}\n{FAKE_KUBECTL}")
    kubectl.chmod(0o755)
    state = tmp_path / "state"
    (state / "logs").mkdir(parents=True)
    nodes = [("kind-worker", "h100"), ("kind-worker2", "a100")]
    (state / "nodes.json").write_text(
        json.dumps({"items": [{"metadata": {"name": n, "labels": {"e2e.dra.dev/node": a}}} for n, a in nodes]})
    )
    monkeypatch.setenv("FAKE_KUBE_DIR", str(state))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return state


def calls(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]


def backend(**kw: Any) -> KubectlBackend:
    config = KubectlConfig(kubeconfig="/k/config", context="kind-dra", poll_interval=0.01, **kw)
    return KubectlBackend(config)


def test_command_lines(fake_kube: Path) -> None:
    kube = backend()
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c", "namespace": "ns"}}
    kube.apply(claim)
    assert kube.get(ObjectRef("ResourceClaim", "c", "ns")) == claim
    assert kube.get(ObjectRef("ResourceClaim", "missing", "ns")) is None
    kube.delete(ObjectRef("ResourceClaim", "c", "ns"))
    kube.delete(ObjectRef("DeviceClass", "x.gpu.dra.dev"))
    assert [n["metadata"]["name"] for n in kube.nodes()] == ["kind-worker", "kind-worker2"]
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "status": {}}
    assert kube.scheduling_message(pod) == ""
    base = ["--kubeconfig", "/k/config", "--context", "kind-dra"]
    recorded = calls(fake_kube)
    assert [c["argv"] for c in recorded] == [
        [*base, "apply", "--filename", "-", "--output", "name", "--validate=strict"],
        [
            *base,
            "get",
            "resourceclaims.resource.k8s.io",
            "c",
            "--namespace",
            "ns",
            "--output",
            "json",
            "--ignore-not-found",
        ],
        [
            *base,
            "get",
            "resourceclaims.resource.k8s.io",
            "missing",
            "--namespace",
            "ns",
            "--output",
            "json",
            "--ignore-not-found",
        ],
        [
            *base,
            "delete",
            "resourceclaims.resource.k8s.io",
            "c",
            "--namespace",
            "ns",
            "--ignore-not-found",
            "--wait=false",
        ],
        [*base, "delete", "deviceclasses.resource.k8s.io", "x.gpu.dra.dev", "--ignore-not-found", "--wait=false"],
        [*base, "get", "nodes", "--output", "json"],
        [
            *base,
            "get",
            "events",
            "--namespace",
            "ns",
            "--output",
            "json",
            "--field-selector",
            "involvedObject.kind=Pod,involvedObject.name=p",
        ],
    ]
    assert json.loads(str(recorded[0]["stdin"])) == claim  # the object travels on stdin, never in argv


def test_container_env_comes_from_the_log(fake_kube: Path) -> None:
    kube = backend()
    pod = {"metadata": {"name": "p", "namespace": "ns"}}
    assert kube.container(pod, "main") is None  # "waiting to start": not known yet
    (fake_kube / "logs" / "p.main").write_text(
        "HOSTNAME=p\nNVIDIA_VISIBLE_DEVICES=MIG-1,MIG-2\nMULTI=line one\nline two\nPATH=/bin\n"
    )
    view = kube.container(pod, "main")
    assert view is not None
    assert view.visible_devices == ("MIG-1", "MIG-2")
    assert view.env["MULTI"] == "line one\nline two"
    assert (view.runtime, view.executed) == ("cluster", True)
    assert calls(fake_kube)[-1]["argv"][-6:] == ["logs", "p", "--container", "main", "--namespace", "ns"]
    (fake_kube / "logs" / "p.main").write_text("")
    assert kube.container(pod, "main") is None  # started, nothing printed yet


def test_parse_env_output() -> None:
    assert parse_env_output("A=1\nB=x=y\n\nnot a var\nC=\n") == {"A": "1", "B": "x=y\n\nnot a var", "C": ""}
    assert parse_env_output("garbage first\nA=1") == {"A": "1"}


def test_errors_name_the_command_and_what_kubectl_said(fake_kube: Path, tmp_path: Path) -> None:
    with pytest.raises(
        BackendError, match=r"kubectl apply --filename - --output name --validate=strict failed \(exit 1\)"
    ):
        backend().apply({"kind": "Unknown", "metadata": {"name": "x"}})
    missing = KubectlBackend(KubectlConfig(kubectl=str(tmp_path / "no-kubectl")))
    with pytest.raises(BackendError, match="no-kubectl: not found; install kubectl or pass --kubectl PATH"):
        missing.nodes()


def test_a_scenario_runs_through_kubectl(fake_kube: Path) -> None:
    for pod_name in ("pod-a", "pod-b"):
        (fake_kube / "logs" / f"{pod_name}.main").write_text("NVIDIA_VISIBLE_DEVICES=GPU-1111\nHOME=/root\n")
    lines: list[str] = []
    runner = Runner(backend(), RunnerConfig(step_timeout=5, cleanup_timeout=5), write=lines.append)
    [result] = runner.run([load_scenario(SCENARIOS / "shared-claim")])
    assert result.status == PASS, result
    verbs = [c["argv"][4:6] for c in calls(fake_kube)]
    assert verbs[:4] == [["get", "nodes"], ["get", "namespaces"], ["apply", "--filename"], ["apply", "--filename"]]
    assert verbs[-2:] == [["delete", "namespaces"], ["get", "namespaces"]]
    assert not list((fake_kube / "objects").glob("*.e2e-shared-claim.*"))  # cleaned up
    assert any(line.startswith("PASS  shared-claim") for line in lines)

    # Different GPUs in the two logs: the runner says which expectation failed and what it saw.
    (fake_kube / "logs" / "pod-b.main").write_text("NVIDIA_VISIBLE_DEVICES=GPU-2222\n")
    [result] = Runner(backend(), RunnerConfig(step_timeout=0.2)).run([load_scenario(SCENARIOS / "shared-claim")])
    assert result.status == FAIL
    assert "sameDevices[0]: want identical device lists; saw pod-a/main: ['GPU-1111'], pod-b/main: ['GPU-2222']" in (
        result.detail
    )


def test_pending_pods_report_the_schedulers_message(fake_kube: Path) -> None:
    (fake_kube / "unschedulable").write_text("too-greedy")
    [result] = Runner(backend(), RunnerConfig(step_timeout=5)).run([load_scenario(SCENARIOS / "unsatisfiable")])
    assert result.status == PASS, result
    (fake_kube / "unschedulable").write_text("")  # now the fake schedules it: Pending was expected
    [result] = Runner(backend(), RunnerConfig(step_timeout=0.2)).run([load_scenario(SCENARIOS / "unsatisfiable")])
    assert result.status == FAIL
    assert "pods.too-greedy.phase: want Pending; saw phase Succeeded on kind-worker (alias h100)" in result.detail


def test_without_a_condition_the_latest_warning_event_explains(fake_kube: Path) -> None:
    events = [
        {"type": "Warning", "message": "old", "lastTimestamp": "2026-01-01T00:00:00Z"},
        {"type": "Normal", "message": "Scheduled", "lastTimestamp": "2026-01-01T00:00:09Z"},
        {"type": "Warning", "message": "FailedPrepareDynamicResources: boom", "lastTimestamp": "2026-01-01T00:00:05Z"},
    ]
    (fake_kube / "events.json").write_text(json.dumps({"items": events}))
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "status": {"phase": "Pending"}}
    assert backend().scheduling_message(pod) == "FailedPrepareDynamicResources: boom"


def test_pods_wait_for_the_new_namespaces_service_account(fake_kube: Path) -> None:
    (fake_kube / "sa-refusals").write_text("2")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}, "spec": {}}
    slept: list[float] = []
    kube = KubectlBackend(KubectlConfig(poll_interval=0.5), sleep=slept.append)
    kube.apply(pod)
    assert slept == [0.5, 0.5]
    assert (fake_kube / "sa-refusals").read_text() == "0"
    # Any other refusal is not retried.
    with pytest.raises(BackendError, match="failed"):
        kube.apply({"kind": "Unknown", "metadata": {"name": "x"}})
    assert slept == [0.5, 0.5]


def test_output_that_is_not_json_is_an_error_naming_what_was_read(fake_kube: Path) -> None:
    kube = backend()
    (fake_kube / "events.json").write_text("<html>a proxy's error page</html>")
    with pytest.raises(BackendError, match=r"^kubectl get events about .*: not JSON"):
        kube.events(ObjectRef("Pod", "p", "ns"))
    (fake_kube / "objects" / "pods.ns.p.json").write_text("{")  # the fake made the directory on its first call
    with pytest.raises(BackendError, match=r"^kubectl get .*\bp\b.*: not JSON"):
        kube.get(ObjectRef("Pod", "p", "ns"))
