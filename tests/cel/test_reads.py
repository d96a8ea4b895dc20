"""Selector result caching: what a selector reads, and that cached verdicts equal fresh evaluations."""

from __future__ import annotations

import pytest

from dra_driver.cel import CelRuntimeError, DeviceInput, DeviceView, DraCelEnvironment
from dra_driver.cel.reads import selector_reads
from dra_driver.cel.syntax import parse
from dra_driver.k8s.quantity import parse_quantity
from dra_driver.k8s.semver import parse_semver


@pytest.mark.parametrize(
    ("expression", "reads"),
    [
        (
            "device.driver == 'd' && device.attributes['d'].type == 'gpu'",
            (("attributes", "d", "type"), ("driver",)),
        ),
        ("device.capacity['d'].memory.compareTo(quantity('1Gi')) > 0", (("capacity", "d", "memory"),)),
        ("has(device.attributes['d'].b)", (("attributes", "d", "b"),)),
        ("'a' in device.attributes['d']", (("attributes", "d"),)),
        ("device.attributes['d'].exists(k, k == 'a')", (("attributes", "d"),)),
        ("device.attributes.d.y == 1", (("attributes", "d", "y"),)),
        ("device.allowMultipleAllocations", (("allowMultipleAllocations",),)),
        ("device.attributes[device.driver].type == 'a'", None),  # computed index
        ("[1].exists(device, device > 0)", None),  # rebinds `device`
        ("device == device", None),
        ("dyn(device).driver == 'd'", None),
        ('device.attributes[r"d"].y == 1', (("attributes", "d", "y"),)),  # a raw string is a constant too
        ("cel.bind(device, 1, device > 0)", None),  # rebinds `device`
        ("device.attributes[?'d'].?y.orValue(0) == 1", (("attributes", "d", "y"),)),
        ("device.attributes.size() > 0", None),
    ],
)
def test_reads(expression: str, reads: tuple[tuple[str, ...], ...] | None) -> None:
    assert selector_reads(parse(expression)) == reads


def _device(index: int, **attrs: object) -> DeviceInput:
    base: dict[str, object] = {"type": "gpu", "uuid": f"GPU-{index}", "index": index, "gpu.nvidia.com/brand": "Nvidia"}
    base.update(attrs)
    return DeviceInput(
        driver="gpu.nvidia.com",
        attributes=base,  # type: ignore[arg-type]
        capacity={"memory": parse_quantity("40Gi")},
    )


EXPRESSIONS = [
    "device.attributes['gpu.nvidia.com'].type == 'gpu'",
    "device.attributes['gpu.nvidia.com'].index == 1",
    "device.attributes['gpu.nvidia.com'].brand == 'Nvidia'",
    "device.attributes['gpu.nvidia.com'].missing == 1",
    "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) == 0",
    "device.attributes['gpu.nvidia.com'].version.isGreaterThan(semver('1.0.0'))",
    "device.attributes['gpu.nvidia.com'].flag",
    "'uuid' in device.attributes['gpu.nvidia.com']",
]
DEVICES = [
    _device(0),
    _device(1),
    _device(2, type="mig"),
    _device(3, version=parse_semver("1.2.3")),
    _device(4, version=parse_semver("0.9.0")),
    _device(5, flag=True),
    _device(6, flag=1),  # an int is not a bool: must not share the bool's verdict
    _device(7, **{"gpu.nvidia.com/type": "mig"}),
]


def _fresh(env: DraCelEnvironment, expression: str, device: DeviceInput) -> bool | str:
    try:
        return env.compile(expression).matches(env.activate(device))
    except CelRuntimeError as err:
        return str(err)


def _cached(env: DraCelEnvironment, expression: str, device: DeviceInput) -> bool | str:
    try:
        return env.matches_view(env.compile(expression), DeviceView(device, declare_allow_multiple=True))
    except CelRuntimeError as err:
        return str(err)


def test_cached_verdicts_equal_fresh_evaluations_in_any_order() -> None:
    fresh_env, cached_env = DraCelEnvironment(), DraCelEnvironment()
    for _ in range(2):  # the second round is served from the cache
        for expression in EXPRESSIONS:
            for device in DEVICES:
                assert _cached(cached_env, expression, device) == _fresh(fresh_env, expression, device), (
                    expression,
                    device.attributes,
                )
