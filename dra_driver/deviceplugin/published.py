"""What the API shows of the GPUs the device plugin holds: the annotation on the node's own ResourceSlices.

A GPU the device plugin allocated is left out of the slices (docs/device-plugin.md "One GPU, one world"), so a
reader of the API alone (`dra-driver status`, `explain`) would see it vanish with no reason. The plugin therefore
writes, on every slice of its pool, the annotation `gpu.dra.dev/device-plugin`: which GPUs the device plugin holds
and, once the kubelet's PodResources lists them, for which pods. It goes in the same write as the slices that
leave the GPU out (no second object, no new permission: docs/device-plugin.md "What the API shows").

Pure: values in, values out. The reader treats the annotation as untrusted (anyone who may write the slices may
write it): size-limited, every field checked, the error naming the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ANNOTATION = "gpu.dra.dev/device-plugin"
FORMAT_VERSION = 1
# 72 GPUs (a GB200 NVL72 rack is 72 nodes of 4; no node has more than 16) of a few hundred bytes each fit many times.
MAX_BYTES = 64 << 10
MAX_GPUS = 256
MAX_PODS = 16  # containers of one pod share a GPU; more pods on one GPU is not the kubelet's doing

# A pod's "namespace/name": a DNS-1123 label and a DNS-1123 subdomain (Kubernetes' object name rules).
_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_SUBDOMAIN = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"
_POD = re.compile(rf"{_LABEL}/{_SUBDOMAIN}")
_DEVICE = re.compile(r"gpu-[0-9]{1,4}")
_UUID = re.compile(r"[A-Za-z0-9-]{1,64}")


@dataclass(frozen=True)
class HeldGpu:
    """A whole GPU the device plugin holds (the kubelet allocated it to a container as `nvidia.com/gpu`)."""

    device: str  # its device name in the slices when it was there: gpu-<minor>
    uuid: str
    product: str = ""
    pods: tuple[str, ...] = ()  # "namespace/name"; empty until the kubelet's PodResources lists it for a pod


def pod_ref(namespace: str, name: str) -> str | None:
    """`namespace/name` of a pod PodResources named, or None when they are not Kubernetes names (the answer is
    untrusted: nothing else is published)."""
    ref = f"{namespace}/{name}"
    return ref if _POD.fullmatch(ref) else None


def encode_held(gpus: Iterable[HeldGpu]) -> str:
    items = [
        {"device": g.device, "uuid": g.uuid, **({"productName": g.product} if g.product else {}),
         "pods": sorted(set(g.pods))}
        for g in sorted(gpus, key=lambda g: (len(g.device), g.device))
    ]  # fmt: skip
    return json.dumps({"version": FORMAT_VERSION, "gpus": items}, sort_keys=True, separators=(",", ":"))


def _text(entry: Mapping[str, Any], key: str, where: str, pattern: re.Pattern[str] | None, limit: int = 256) -> str:
    value = entry.get(key, "")
    if not isinstance(value, str) or len(value) > limit or (pattern is not None and not pattern.fullmatch(value)):
        raise ValueError(f"{where}.{key}: {repr(value)[:80]} is not valid")
    return value


def decode_held(value: str) -> tuple[HeldGpu, ...]:
    """The annotation's GPUs, or ValueError naming the field that is wrong."""
    if len(value.encode()) > MAX_BYTES:
        raise ValueError(f"(the annotation): larger than {MAX_BYTES} bytes")
    doc = json.loads(value)  # json.JSONDecodeError is a ValueError
    if not isinstance(doc, dict):
        raise ValueError("(the annotation): must be a JSON object")
    if doc.get("version") != FORMAT_VERSION:
        raise ValueError(f"version: {doc.get('version')!r} is not {FORMAT_VERSION}, the format this release reads")
    items = doc.get("gpus")
    if not isinstance(items, list) or len(items) > MAX_GPUS:
        raise ValueError(f"gpus: must be a list of at most {MAX_GPUS} GPUs")
    held = []
    for i, entry in enumerate(items):
        where = f"gpus[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: must be an object")
        pods = entry.get("pods", [])
        if not isinstance(pods, list) or len(pods) > MAX_PODS:
            raise ValueError(f"{where}.pods: must be a list of at most {MAX_PODS} pods")
        for j, pod in enumerate(pods):
            if not isinstance(pod, str) or not _POD.fullmatch(pod):
                raise ValueError(f"{where}.pods[{j}]: {repr(pod)[:80]} is not a pod's namespace/name")
        held.append(HeldGpu(_text(entry, "device", where, _DEVICE), _text(entry, "uuid", where, _UUID),
                            _text(entry, "productName", where, None), tuple(pods)))  # fmt: skip
    return tuple(held)


def holder_text(gpu: HeldGpu) -> str:
    """How status names the holder: `device-plugin: ns/pod` (the pod not known yet: the kubelet lists it within
    seconds of its admission)."""
    return f"device-plugin: {', '.join(gpu.pods) if gpu.pods else '(pod not listed by the kubelet yet)'}"


def held_text(gpu: HeldGpu) -> str:
    """How explain names it."""
    pods = f"pod {', '.join(gpu.pods)}" if gpu.pods else "its pod not listed by the kubelet yet"
    return f"{gpu.device} ({gpu.uuid}): held by the device plugin ({pods})"


@dataclass(frozen=True)
class HeldByPool:
    """Per pool of the driver, the GPUs its newest generation's annotation names; `problems`: annotations that do
    not decode, each naming its slice and field."""

    gpus: Mapping[str, tuple[HeldGpu, ...]]  # pool name -> GPUs
    problems: tuple[str, ...] = ()
    nodes: Mapping[str, str] = field(default_factory=dict)  # pool name -> its slices' spec.nodeName

    def by_node(self) -> dict[str, tuple[HeldGpu, ...]]:
        return {self.nodes[pool]: gpus for pool, gpus in self.gpus.items() if pool in self.nodes}


def _generation(spec: Mapping[str, Any]) -> int:
    pool = spec.get("pool")
    value = pool.get("generation") if isinstance(pool, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def held_in_slices(slices: Iterable[Mapping[str, Any]], driver: str | None) -> HeldByPool:
    """The GPUs the device plugin holds, per pool of `driver` (None: of any driver), from the annotation of the
    pool's newest generation (a pool's older slices are what it published before; the slices of one generation
    carry the same annotation, the first readable one counts)."""
    newest: dict[str, int] = {}
    found: dict[tuple[str, int], tuple[HeldGpu, ...]] = {}
    nodes: dict[tuple[str, int], str] = {}
    problems: list[str] = []
    for s in slices:
        spec = s.get("spec")
        if not isinstance(spec, dict) or (driver is not None and spec.get("driver") != driver):
            continue
        pool = spec.get("pool")
        name = pool.get("name") if isinstance(pool, dict) else None
        if not isinstance(name, str):
            continue
        generation = _generation(spec)
        newest[name] = max(newest.get(name, generation), generation)
        meta = s.get("metadata")
        annotations = meta.get("annotations") if isinstance(meta, dict) else None
        value = annotations.get(ANNOTATION) if isinstance(annotations, dict) else None
        if value is None or (name, generation) in found:
            continue
        node = spec.get("nodeName")
        if isinstance(node, str) and node:
            nodes[(name, generation)] = node
        try:
            if not isinstance(value, str):
                raise ValueError("(the annotation): must be a string")
            found[(name, generation)] = decode_held(value)
        except ValueError as exc:
            slice_name = meta.get("name") if isinstance(meta, dict) else None
            problems.append(f"ResourceSlice {slice_name}: annotation {ANNOTATION}: {exc}")
    current = [(pool, g) for pool, g in newest.items() if (pool, g) in found]
    return HeldByPool({pool: found[(pool, g)] for pool, g in current}, tuple(dict.fromkeys(problems)),
                      {pool: nodes[(pool, g)] for pool, g in current if (pool, g) in nodes})  # fmt: skip
