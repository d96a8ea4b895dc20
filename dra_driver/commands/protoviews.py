"""What the read-only commands take of a ResourceSlice read as protobuf (k8s/sliceproto.py), built straight from its
message: explain's pool-sieve view (allocation/prune.py's light view) of the attributes one claim reads, and the
parts of a slice `dra-driver status` shows (`StatusSlices`), without the JSON in between.

The light view of a JSON slice leaves each attribute's value encoded and decodes it only for a set of values not
judged before; here the values are the DeviceAttribute's protobuf bytes, turned into the same encoded JSON once per
distinct value. Devices whose read attributes are byte-for-byte the same share one view (a fleet's GPUs of one model
differ only in attributes no claim of a product reads), so most devices cost a few map lookups.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import msgspec

from dra_driver.allocation.prune import ClaimReach, LightDevice, LightPool, LightSpec, PoolSieve
from dra_driver.k8s import sliceproto


class ProtoSieveFeed:
    """Hands protobuf slices to a PoolSieve as their light view (`add`), for the attribute names `reach` reads."""

    def __init__(self, sieve: PoolSieve, reach: ClaimReach) -> None:
        self._sieve = sieve
        # Every name a read may be found under: qualified, and bare for the driver's own domain (the sieve looks
        # up both, as it does in a JSON slice's attributes).
        self._names = tuple(sorted({name for domain, ident in reach.attribute_reads
                                    for name in (domain + "/" + ident, ident)}))
        self._values: dict[bytes, msgspec.Raw] = {}
        self._devices: dict[tuple[tuple[bytes | None, ...], bool | None], LightDevice] = {}

    def add(self, item: bytes) -> None:
        """One slice's message bytes; decoded whole (`sliceproto.resource_slice`) only if the sieve keeps its pool.
        Raises sliceproto.NotProtobuf for bytes that do not decode."""
        whole = functools.partial(sliceproto.resource_slice, item)
        self._sieve.add_light(self.light(item), whole)

    def light(self, item: bytes) -> LightSpec:
        spec = sliceproto.light_slice(item).spec
        names = self._names
        devices = []
        for device in spec.devices:
            attributes = device.attributes
            values = tuple(attributes.get(name) for name in names)
            multiple = device.allowMultipleAllocations if device.HasField("allowMultipleAllocations") else None
            light = self._devices.get((values, multiple))
            if light is None:
                light = self._devices[(values, multiple)] = LightDevice(
                    {name: self._value(value) for name, value in zip(names, values, strict=True) if value is not None},
                    multiple,
                )
            devices.append(light)
        return LightSpec(
            driver=_present(spec, "driver"),
            pool=LightPool(_present(spec.pool, "name")) if spec.HasField("pool") else None,
            nodeName=_present(spec, "nodeName"),
            devices=devices,
        )

    def _value(self, encoded: bytes) -> msgspec.Raw:
        found = self._values.get(encoded)
        if found is None:
            found = self._values[encoded] = msgspec.Raw(msgspec.json.encode(sliceproto.attribute(encoded)))
        return found


def _present(message: Any, field: str) -> Any:
    """The field's value where it is on the wire, else None (as the JSON view leaves an absent field None)."""
    return getattr(message, field) if message.HasField(field) else None


# The attributes status shows (commands/status.py's typed JSON view names the same), under their bare names.
STATUS_ATTRIBUTES = ("uuid", "parentUUID", "type", "profile", "productName", "minor")


class StatusSlices:
    """Slices read as protobuf, each as the JSON object status's typed view makes of the same slice (status.py
    `status_slice`): metadata, spec.driver, nodeName and pool, and per device its name, the STATUS_ATTRIBUTES,
    its taints and its memory capacity. Attribute and capacity values are decoded once per distinct encoding and
    shared between devices (status only reads them)."""

    def __init__(self) -> None:
        self._attributes: dict[bytes, dict[str, Any]] = {}
        self._capacities: dict[bytes, dict[str, Any]] = {}

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
        if spec.devices:  # as JSON leaves an empty list out
            shown["devices"] = [self._device(device) for device in spec.devices]
        out["spec"] = shown
        return out

    def _device(self, device: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if device.HasField("name"):
            out["name"] = device.name
        attributes = device.attributes
        if attributes:  # an empty map is not on the wire, as JSON leaves an empty map out
            shown = {}
            for name in STATUS_ATTRIBUTES:
                value = attributes.get(name)
                if value is not None:
                    shown[name] = self._decoded(self._attributes, value, sliceproto.attribute)
            out["attributes"] = shown
        if device.taints:
            out["taints"] = [sliceproto.message_object(taint) for taint in device.taints]
        capacity = device.capacity
        if capacity:
            memory = capacity.get("memory")
            out["capacity"] = {} if memory is None else {
                "memory": self._decoded(self._capacities, memory, sliceproto.capacity)}
        return out

    @staticmethod
    def _decoded(memo: dict[bytes, dict[str, Any]], encoded: bytes,
                 decode: Callable[[bytes], dict[str, Any]]) -> dict[str, Any]:
        found = memo.get(encoded)
        if found is None:
            found = memo[encoded] = decode(encoded)
        return found
