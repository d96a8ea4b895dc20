"""What explain takes of a ResourceSlice read as protobuf (k8s/sliceproto.py), built straight from its message: the
pool-sieve view (allocation/prune.py's light view) of the attributes one claim reads, without the JSON in between.
(Status's view of the same messages: commands/statusproto.py.)

The light view of a JSON slice leaves each attribute's value encoded and decodes it only for a set of values not
judged before; here the values are the DeviceAttribute's protobuf bytes, turned into the same encoded JSON once per
distinct value. Devices whose read attributes are byte-for-byte the same share one view (a fleet's GPUs of one model
differ only in attributes no claim of a product reads), so most devices cost a few map lookups.
"""

from __future__ import annotations

import functools
import operator
from collections import Counter
from typing import Any

import msgspec

from dra_driver.allocation.prune import UNBOUNDED, ClaimReach, LightDevice, PoolSieve
from dra_driver.k8s import sliceproto

_ATTRIBUTES = operator.attrgetter("attributes")
# A device's allowMultipleAllocations read as the sieve reads it (`is True`): the field's default, False, where
# it is not on the wire.
_MULTIPLE = operator.attrgetter("allowMultipleAllocations")


class ProtoSieveFeed:
    """Hands protobuf slices to a PoolSieve as their light view (`add`), for the attribute names `reach` reads."""

    def __init__(self, sieve: PoolSieve, reach: ClaimReach) -> None:
        self._sieve = sieve
        # Every name a read may be found under: qualified, and bare for the driver's own domain (the sieve looks
        # up both, as it does in a JSON slice's attributes).
        self._names = tuple(sorted({name for domain, ident in reach.attribute_reads
                                    for name in (domain + "/" + ident, ident)}))
        self._values: dict[bytes, msgspec.Raw] = {}
        self._reach = reach
        self._getters = tuple(operator.methodcaller("get", name) for name in self._names)
        # (driver, (allowMultipleAllocations, each name's encoded value or None)) -> per alternative, may it accept
        self._verdicts: dict[tuple[str, tuple[Any, ...]], tuple[bool, ...]] = {}

    def add(self, item: bytes) -> None:
        """One slice's message bytes; decoded whole (`sliceproto.resource_slice`) only if the sieve keeps its pool.
        Raises sliceproto.NotProtobuf for bytes that do not decode.

        The same verdicts as `PoolSieve.add_light` of the slice's JSON light view, without a view per device: the
        slice's devices are grouped by the values the claim reads (C-level map/zip/Counter over the messages, no
        Python frame per device; a fleet's 100k devices fall into a few dozen groups), each group judged once."""
        whole = functools.partial(sliceproto.resource_slice, item)
        spec = sliceproto.light_slice(item).spec
        driver = spec.driver if spec.HasField("driver") else None
        pool = (driver or "?", (spec.pool.name if spec.pool.HasField("name") else None) or "?")
        node = spec.nodeName if spec.HasField("nodeName") else None
        devices = spec.devices
        sieve = self._sieve
        if not sieve.judging(pool):
            sieve.add_judged(pool, node, len(devices), None, whole)
            return
        sieve.add_judged(pool, node, len(devices), self.accepted(driver, devices), whole)

    def accepted(self, driver: str | None, devices: Any) -> list[int]:
        """Per request alternative, how many of `devices` (a light slice message's) its selectors may accept
        (UNBOUNDED: any number), as `ClaimReach.accepted_light` counts the JSON light view's devices."""
        alternatives = len(self._reach.alternatives)
        if driver is None:
            return [UNBOUNDED] * alternatives
        found = [0] * alternatives
        if not devices:
            return found
        maps = list(map(_ATTRIBUTES, devices))
        columns = [map(getter, maps) for getter in self._getters]
        groups = Counter(zip(map(_MULTIPLE, devices), *columns, strict=True))
        for group, count in groups.items():
            verdicts = self._verdicts.get((driver, group))
            if verdicts is None:
                verdicts = self._verdicts[(driver, group)] = self._reach.light_verdicts(driver, self._device(group))
            multiple = group[0]
            for i, accepted in enumerate(verdicts):
                if accepted:
                    found[i] = UNBOUNDED if multiple or found[i] >= UNBOUNDED else found[i] + count
        return found

    def _device(self, group: tuple[Any, ...]) -> LightDevice:
        """The light view of a device with the group's values (allowMultipleAllocations, then one per name)."""
        return LightDevice({name: self._value(value) for name, value in zip(self._names, group[1:], strict=True)
                            if value is not None}, True if group[0] else None)

    def _value(self, encoded: bytes) -> msgspec.Raw:
        found = self._values.get(encoded)
        if found is None:
            found = self._values[encoded] = msgspec.Raw(msgspec.json.encode(sliceproto.attribute(encoded)))
        return found
