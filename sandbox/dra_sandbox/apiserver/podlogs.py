"""`GET /api/v1/namespaces/{ns}/pods/{name}/log` for the pods the sandbox's kubelets run as host processes (the IMEX
daemon pods: dra_sandbox/kubelet/processpods.py). Their output is kept as under /var/log/pods:
`<root>/<namespace>_<pod>_<uid>/<container>/<restart>.log` (dra_sandbox/runtime/hostprocess.py), one root per node.

Query as kube-apiserver's PodLogOptions: `container` (required when the pod has more than one, named as upstream
names them), `previous` (the restart before the current one), `tailLines`, `limitBytes`, `timestamps` (ignored: the
lines carry none). `follow` answers what is there now and ends: no stream. A pod the sandbox runs no process for
(containers are only CDI-checked or run by podman) has no log here: a 400 that says so, as kube-apiserver answers
for a container that has not started."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import errors
from .errors import ApiError


def _bad(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def _int(query: Mapping[str, str], key: str) -> int | None:
    if key not in query:
        return None
    try:
        value = int(query[key])
    except ValueError:
        raise _bad(f"PodLogOptions.{key}: not an integer: {query[key]!r}") from None
    if value < 0 or (key == "limitBytes" and value == 0):
        raise _bad(f"PodLogOptions.{key}: must be {'greater than 0' if key == 'limitBytes' else 'non-negative'}")
    return value


def _container(pod: Mapping[str, Any], query: Mapping[str, str]) -> str:
    name = pod["metadata"]["name"]
    containers = [str(c.get("name")) for c in (pod.get("spec") or {}).get("containers") or ()]
    chosen = query.get("container", "")
    if not chosen:
        if len(containers) != 1:
            raise _bad(f"a container name must be specified for pod {name}, choose one of: [{' '.join(containers)}]")
        return containers[0]
    every = containers + [str(c.get("name")) for c in (pod.get("spec") or {}).get("initContainers") or ()]
    if chosen not in every:
        raise _bad(f"container {chosen} is not valid for pod {name}")
    return chosen


def _log_file(roots: Sequence[Path], pod: Mapping[str, Any], container: str, previous: bool) -> Path:
    meta = pod["metadata"]
    folder = f"{meta.get('namespace', '')}_{meta['name']}_{meta.get('uid', '')}"
    for root in roots:
        directory = root / folder / container
        restarts = sorted((int(p.stem), p) for p in directory.glob("*.log") if p.stem.isdigit())
        if not restarts:
            continue
        if previous:
            if len(restarts) < 2:
                raise _bad(f'previous terminated container "{container}" in pod "{meta["name"]}" not found')
            return restarts[-2][1]
        return restarts[-1][1]
    raise _bad(f'container "{container}" in pod "{meta["name"]}" has no log here: the dra-sandbox kubelet keeps '
               "logs only of the pods it runs as host processes (the IMEX daemons); other pods' containers are "
               "CDI-checked or run by podman, whose output the sandbox does not keep")


def pod_log(pod: Mapping[str, Any], roots: Sequence[Path], query: Mapping[str, str]) -> bytes:
    """The container's log as kube-apiserver returns it (text), or an ApiError."""
    if pod.get("kind") not in (None, "Pod"):
        raise errors.path_not_found()
    container = _container(pod, query)
    tail, limit = _int(query, "tailLines"), _int(query, "limitBytes")
    data = _log_file(roots, pod, container, query.get("previous") in ("true", "1")).read_bytes()
    if tail is not None:
        lines = data.splitlines(keepends=True)
        data = b"".join(lines[len(lines) - tail:]) if tail else b""
    if limit is not None:
        data = data[:limit]
    return data
