"""The parts of a ResourceSlice read as protobuf (k8s/sliceproto.py) that `dra-driver status` shows, built straight
from its message as the JSON object status's typed view makes of the same slice (commands/status.py `status_slice`).
A module of its own, apart from explain's (commands/protoviews.py): status loads none of the allocator."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from dra_driver.k8s import sliceproto

_ATTRIBUTES = operator.attrgetter("attributes")

# The attributes status shows (commands/status.py's typed JSON view names the same), under their bare names.
STATUS_ATTRIBUTES = ("uuid", "parentUUID", "type", "profile", "productName", "minor")
_STATUS_GETTERS = tuple(operator.methodcaller("get", name) for name in STATUS_ATTRIBUTES)
_NAME = operator.attrgetter("name")
_TAINTS = operator.attrgetter("taints")
_CAPACITY = operator.attrgetter("capacity")
_MEMORY = operator.methodcaller("get", "memory")


class StatusSlices:
    """Slices read as protobuf, each as the JSON object status's typed view makes of the same slice (status.py
    `status_slice`): metadata, spec.driver, nodeName and pool, and per device its name, the STATUS_ATTRIBUTES,
    its taints and its memory capacity. Attribute and capacity values are decoded once per distinct encoding and
    shared between devices (status only reads them)."""

    def __init__(self) -> None:
        self._attributes: dict[bytes, dict[str, Any]] = {}
        self._capacities: dict[bytes, dict[str, Any]] = {}
        # The shown attributes and capacity of a device by their encodings: a fleet's devices share most of them
        # (a GPU's MIG devices differ only in what status does not show), so one dict serves them all (read-only).
        self._shown: dict[tuple[bytes | None, ...], dict[str, Any]] = {}
        self._memory: dict[bytes | None, dict[str, Any]] = {}

    def slice(self, item: bytes) -> dict[str, Any]:
        """Raises sliceproto.NotProtobuf for bytes that do not decode."""
        message = sliceproto.status_slice_message(item)
        out: dict[str, Any] = {}
        if message.HasField("metadata"):
            out["metadata"] = sliceproto.message_object(message.metadata)
        if not message.HasField("spec"):
            return out
        spec = message.spec
        shown: dict[str, Any] = {}
        for field in ("driver", "nodeName"):
            if spec.HasField(field):
                shown[field] = getattr(spec, field)
        if spec.HasField("pool"):
            shown["pool"] = sliceproto.message_object(spec.pool)
        devices = spec.devices
        if devices:  # as JSON leaves an empty list out
            shown["devices"] = self._devices(devices)
        out["spec"] = shown
        return out

    def _devices(self, devices: Any) -> list[dict[str, Any]]:
        """Each device's view. The fields are read column by column at C level (map over the messages, no Python
        frame per device and field): a fleet's 100k devices cost one short loop each."""
        attributes = list(map(_ATTRIBUTES, devices))
        # Per device: its shown attributes' encodings (None where absent), one tuple each (zip of the columns).
        keys = zip(*(map(getter, attributes) for getter in _STATUS_GETTERS), strict=True)
        capacities = list(map(_CAPACITY, devices))
        memories = map(_MEMORY, capacities)
        shown_of, memory_of = self._shown, self._memory
        out = []
        for device, name, attrs, key, taints, capacity, memory in zip(
                devices, map(_NAME, devices), attributes, keys, map(_TAINTS, devices), capacities, memories,
                strict=True):
            view: dict[str, Any] = {"name": name} if name or device.HasField("name") else {}
            if attrs:  # an empty map is not on the wire, as JSON leaves an empty map out
                shown = shown_of.get(key)
                if shown is None:
                    shown = shown_of[key] = {
                        shown_name: self._decoded(self._attributes, value, sliceproto.attribute)
                        for shown_name, value in zip(STATUS_ATTRIBUTES, key, strict=True) if value is not None}
                view["attributes"] = shown
            if taints:
                view["taints"] = [sliceproto.message_object(taint) for taint in taints]
            if capacity:
                found = memory_of.get(memory)
                if found is None:
                    found = memory_of[memory] = {} if memory is None else {
                        "memory": self._decoded(self._capacities, memory, sliceproto.capacity)}
                view["capacity"] = found
            out.append(view)
        return out

    @staticmethod
    def _decoded(memo: dict[bytes, dict[str, Any]], encoded: bytes,
                 decode: Callable[[bytes], dict[str, Any]]) -> dict[str, Any]:
        found = memo.get(encoded)
        if found is None:
            found = memo[encoded] = decode(encoded)
        return found
