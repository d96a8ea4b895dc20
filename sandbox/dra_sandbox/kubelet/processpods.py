"""Which pods the sandbox kubelet runs as host processes, how their argv and env are made, and their status.

The rule: a pod runs as host processes when every one of its containers (init containers included) has
`command[0] == "dra-driver"`: the product's own binary is the one thing the sandbox can truly run (the IMEX daemon
pods: `dra-driver compute-domain-daemon run --config-dir /imexd`). A pod that mixes such containers with others is
refused (phase Failed, naming the container), since half of it could not run. Every other pod keeps the
container runtime the kubelet was given (podman or the CDI check).

What a container gets, as the kubelet and a container runtime would give it:
- env: the container's `env` in order, `$(VAR)` references to earlier entries expanded (`$$` escapes; kubelet
  `makeEnvironmentVariables` + `third_party/forked/golang/expansion`), `valueFrom.fieldRef` resolved as the
  kubelet's downward API does (`podFieldSelectorRuntimeValue`: spec.nodeName, spec.serviceAccountName,
  status.hostIP(s), status.podIP(s); `fieldpath.ExtractFieldPathAsString`: metadata.name/namespace/uid,
  metadata.labels['k'], metadata.annotations['k']), then the CDI edits' env (CDI's `Apply` replaces a variable
  of the same name); `HOSTNAME` is the pod name. Secret/ConfigMap/resource references are refused with a clear
  error (the sandbox does not read them for a process).
- argv: `command` + `args`, `$(VAR)` expanded; then every container path a CDI mount names is replaced by the
  mount's host source, in argv and env values (whole value, or after `=`), since a host process sees the host's
  filesystem; `dra-driver` becomes this environment's `python -m dra_driver.cli`.
- `/etc/hosts`: a host process has no per-pod copy, so `DRA_DRIVER_SYSTEM_HOSTS_FILE` is set empty (the IMEX
  daemon runner then writes its peers only into its config dir's hosts file, which the stand-in reads).
- PATH: the stand-in binaries' directory first (nvidia-imex, nvidia-imex-ctl), then this Python's bin dir, then
  the host's PATH; the API server is reached through the sandbox's kubeconfig (`KUBECONFIG`,
  `DRA_DRIVER_KUBECONFIG`), standing in for the pod's service-account token.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from dra_sandbox.runtime.cdi import ContainerConfig
from dra_sandbox.runtime.hostprocess import (
    ContainerSnapshot,
    ExecProbe,
    PodSnapshot,
    ProcessContainer,
    ProcessPodRequest,
    RestartBackoff,
    Termination,
)

PROCESS_COMMAND: Final = "dra-driver"
DEFAULT_GRACE_S: Final = 30.0


class ProcessPodError(ValueError):
    """The pod cannot run as host processes; the message names the field and the fix."""


@dataclass(frozen=True)
class ProcessPodSettings:
    """How this kubelet runs process pods: executables for command[0], the stand-ins' bin dir, extra env."""

    log_root: Path
    bin_dirs: tuple[Path, ...] = ()
    executables: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: {PROCESS_COMMAND: (sys.executable, "-m", "dra_driver.cli")})
    extra_env: Mapping[str, str] = field(default_factory=dict)
    # Where the plugins write their CDI specs (the edits of a process container's claims are read from there).
    cdi_dirs: tuple[Path, ...] = ()
    # The kubelet's crash-loop back-off; tests may shorten it.
    backoff: RestartBackoff = field(default_factory=RestartBackoff)


SYSTEM_HOSTS_FILE_ENV = "DRA_DRIVER_SYSTEM_HOSTS_FILE"  # the runner's --system-hosts-file

def _containers(pod: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    return [c for c in (pod.get("spec") or {}).get(key) or [] if isinstance(c, Mapping)]


def runs_as_process(pod: Mapping[str, Any]) -> bool:
    """True when the pod runs as host processes; ProcessPodError when it mixes (see the module's rule)."""
    every = [*_containers(pod, "initContainers"), *_containers(pod, "containers")]
    chosen = [c for c in every if (c.get("command") or [None])[0] == PROCESS_COMMAND]
    if not chosen:
        return False
    if len(chosen) != len(every):
        other = next(c for c in every if c not in chosen)
        raise ProcessPodError(
            f"container {other.get('name')!r} does not run `{PROCESS_COMMAND}`: the sandbox runs a pod as host "
            f"processes only when every container's command[0] is {PROCESS_COMMAND!r} (docs/sandbox.md, "
            "\"The host-process runtime\"); move the other containers to a pod of their own")
    return True


_VAR_REF: Final = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion: known names are replaced, unknown references stay as written, `$$` is `$`."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _VAR_REF.sub(sub, text)


_SUBSCRIPT: Final = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


@dataclass(frozen=True)
class PodAddresses:
    pod_ip: str
    host_ip: str


def field_ref_value(pod: Mapping[str, Any], path: str, addresses: PodAddresses) -> str:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple = {
        "metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": addresses.pod_ip, "status.podIPs": addresses.pod_ip,
        "status.hostIP": addresses.host_ip, "status.hostIPs": addresses.host_ip,
    }
    if path in simple:
        return str(simple[path] or "")
    m = _SUBSCRIPT.match(path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        values = meta.get(path.split(".")[1]) or {}
        return "\n".join(f"{k}={json.dumps(str(v))}" for k, v in sorted(values.items()))
    raise ProcessPodError(f"unsupported fieldPath {path!r} in a fieldRef (the downward API offers metadata.name, "
                          "metadata.namespace, metadata.uid, metadata.labels['k'], metadata.annotations['k'], "
                          "spec.nodeName, spec.serviceAccountName, status.hostIP, status.podIP)")


def container_env(pod: Mapping[str, Any], container: Mapping[str, Any], addresses: PodAddresses) -> dict[str, str]:
    env: dict[str, str] = {}
    for i, var in enumerate(container.get("env") or []):
        name = str(var.get("name"))
        if "value" in var or not var.get("valueFrom"):
            env[name] = expand(str(var.get("value") or ""), env)
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            env[name] = field_ref_value(pod, str(source["fieldRef"].get("fieldPath")), addresses)
            continue
        kind = next(iter(source), "?")
        raise ProcessPodError(f"containers[{container.get('name')}].env[{i}].valueFrom.{kind}: a process pod in the "
                              "sandbox takes literal values and fieldRefs only; put the value in `value`")
    return env


def _map_path(value: str, mounts: Sequence[tuple[str, str]]) -> str:
    for container_path, host_path in mounts:
        if value == container_path or value.startswith(container_path.rstrip("/") + "/"):
            return host_path + value[len(container_path):]
    return value


def map_paths(value: str, mounts: Sequence[tuple[str, str]]) -> str:
    """A container path (the whole value, or what follows `=`) that a CDI mount names -> the mount's host source."""
    mapped = _map_path(value, mounts)
    if mapped != value:
        return mapped
    head, sep, tail = value.partition("=")
    if sep and tail:
        return head + sep + _map_path(tail, mounts)
    return value


def _mounts(config: ContainerConfig) -> list[tuple[str, str]]:
    pairs = [(m.container_path, m.host_path) for m in config.mounts if m.container_path and m.host_path]
    return sorted(pairs, key=lambda p: len(p[0]), reverse=True)  # the deepest mount wins


def _probe(kind: str, raw: Mapping[str, Any] | None, argv_of: Any) -> ExecProbe | None:
    if not isinstance(raw, Mapping):
        return None
    exec_ = raw.get("exec")
    if not isinstance(exec_, Mapping) or not exec_.get("command"):
        kinds = ", ".join(k for k in ("httpGet", "tcpSocket", "grpc") if k in raw) or "none"
        raise ProcessPodError(f"{kind}Probe: only exec probes run for a process pod in the sandbox (got {kinds})")

    def num(key: str, default: float) -> float:
        value = raw.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 \
            else default

    # The API's defaults (pkg/apis/core/v1/defaults.go SetDefaults_Probe): 10 s, 1 s, 1, 3.
    return ExecProbe(kind, argv_of([str(a) for a in exec_["command"]]), period_s=num("periodSeconds", 10),
                     timeout_s=num("timeoutSeconds", 1), initial_delay_s=float(raw.get("initialDelaySeconds") or 0),
                     success_threshold=int(num("successThreshold", 1)),
                     failure_threshold=int(num("failureThreshold", 3)))


def process_container(pod: Mapping[str, Any], container: Mapping[str, Any], cdi: ContainerConfig,
                      addresses: PodAddresses, settings: ProcessPodSettings) -> ProcessContainer:
    """One container's argv, env and probes as a host process (see the module docstring)."""
    env = container_env(pod, container, addresses)
    env.update(cdi.env_map())
    mounts = _mounts(cdi)
    env = {k: map_paths(v, mounts) for k, v in env.items()}
    host_path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    own = [str(d) for d in settings.bin_dirs] + [str(Path(sys.executable).parent)]
    env["PATH"] = ":".join([*own, env.get("PATH") or host_path])
    env.setdefault("HOSTNAME", str((pod.get("metadata") or {}).get("name") or ""))
    # A container's /etc/hosts is its own (the kubelet's per-pod file); a host process's is the machine's, which the
    # IMEX daemon runner would otherwise edit: the runner keeps its peers in its config dir's hosts file only.
    env[SYSTEM_HOSTS_FILE_ENV] = ""
    for k, v in settings.extra_env.items():
        env.setdefault(k, v)

    def argv_of(words: list[str]) -> tuple[str, ...]:
        expanded = [map_paths(expand(w, env), mounts) for w in words]
        if not expanded:
            raise ProcessPodError(f"container {container.get('name')!r}: command is empty")
        head = settings.executables.get(expanded[0])
        return tuple([*head, *expanded[1:]] if head else expanded)

    words = [str(w) for w in (container.get("command") or [])] + [str(w) for w in (container.get("args") or [])]
    probes = tuple(p for p in (_probe(kind, container.get(f"{kind}Probe"), argv_of)
                               for kind in ("startup", "readiness", "liveness")) if p is not None)
    return ProcessContainer(str(container.get("name")), argv_of(words), env, probes)


def grace_period_s(pod: Mapping[str, Any]) -> float:
    """The kill's grace: the deletion's (`metadata.deletionGracePeriodSeconds`), else the pod's
    `terminationGracePeriodSeconds` (killPodWithSyncResult / killContainer)."""
    for value in ((pod.get("metadata") or {}).get("deletionGracePeriodSeconds"),
                  (pod.get("spec") or {}).get("terminationGracePeriodSeconds")):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return float(value)
    return DEFAULT_GRACE_S


def process_pod_request(pod: Mapping[str, Any], cdi: Mapping[str, ContainerConfig], addresses: PodAddresses,
                        settings: ProcessPodSettings) -> ProcessPodRequest:
    """`cdi`: container name -> the CDI edits applied for its claims."""
    meta = pod.get("metadata") or {}

    def one(c: Mapping[str, Any]) -> ProcessContainer:
        return process_container(pod, c, cdi.get(str(c.get("name")), ContainerConfig()), addresses, settings)

    return ProcessPodRequest(
        namespace=str(meta.get("namespace") or "default"), name=str(meta.get("name")), uid=str(meta.get("uid")),
        containers=tuple(one(c) for c in _containers(pod, "containers")),
        init_containers=tuple(one(c) for c in _containers(pod, "initContainers")),
        restart_policy=str((pod.get("spec") or {}).get("restartPolicy") or "Always"),
        grace_period_s=grace_period_s(pod))


# ---- status ---------------------------------------------------------------------------------------------------


def _time(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _terminated(t: Termination, container_id: str) -> dict[str, Any]:
    out: dict[str, Any] = {"exitCode": t.exit_code, "reason": t.reason, "startedAt": _time(t.started_at),
                           "finishedAt": _time(t.finished_at), "containerID": container_id}
    if t.message:
        out["message"] = t.message[:1024]
    return out


def container_status(pod_uid: str, image: str, snap: ContainerSnapshot) -> dict[str, Any]:
    cid = f"sandbox://{pod_uid}/{snap.name}"
    status: dict[str, Any] = {"name": snap.name, "image": image, "imageID": "", "containerID": cid,
                              "ready": snap.ready, "started": snap.started, "restartCount": snap.restart_count}
    if snap.state == "running":
        status["state"] = {"running": {"startedAt": _time(snap.started_at)}}
    elif snap.state == "terminated" and snap.terminated is not None:
        status["state"] = {"terminated": _terminated(snap.terminated, cid)}
    else:
        waiting: dict[str, Any] = {"reason": snap.reason or "ContainerCreating"}
        if snap.message:
            waiting["message"] = snap.message
        status["state"] = {"waiting": waiting}
    if snap.last_termination is not None and snap.state != "terminated":
        status["lastState"] = {"terminated": _terminated(snap.last_termination, cid)}
    return status


def process_pod_phase(snapshot: PodSnapshot, restart_policy: str) -> str:
    """getPhase (pkg/kubelet/kubelet_pods.go), for what a process pod's containers do."""
    if snapshot.failed_init is not None:
        return "Failed"
    if not snapshot.initialized:
        return "Pending"
    states = [c.state for c in snapshot.containers]
    if any(s == "running" for s in states):
        return "Running"
    if restart_policy == "Always" or any(s == "waiting" for s in states):
        return "Running" if any(c.restart_count or c.last_termination for c in snapshot.containers) else "Pending"
    codes = [c.terminated.exit_code for c in snapshot.containers if c.terminated is not None]
    return "Succeeded" if codes and all(code == 0 for code in codes) else "Failed"
