"""Qualified-name, kind and device-name rules."""

from __future__ import annotations

import pytest

from dra_driver.cdi import CdiError, QualifiedName, parse_kind, parse_qualified_name, qualified_name


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nvidia.com/gpu=0", QualifiedName("nvidia.com", "gpu", "0")),
        ("k8s.gpu.dra.dev/gpu=claim-1234-gpu0", QualifiedName("k8s.gpu.dra.dev", "gpu", "claim-1234-gpu0")),
        ("vendor/class.sub=dev:a_b.c-d", QualifiedName("vendor", "class.sub", "dev:a_b.c-d")),
        ("a/b=c", QualifiedName("a", "b", "c")),
    ],
)
def test_parse_qualified_name_accepts(text: str, expected: QualifiedName) -> None:
    parsed = parse_qualified_name(text)
    assert parsed == expected
    assert str(parsed) == text


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("nvidia.com/gpu", "not a qualified CDI device name"),
        ("nvidia.com=gpu0", "exactly one '/'"),
        ("a/b/c=d", "exactly one '/'"),
        ("/gpu=0", "vendor is empty"),
        ("nvidia.com/=0", "class is empty"),
        ("nvidia.com/gpu=", "device name is empty"),
        ("1vendor/gpu=0", "invalid vendor"),
        ("vendor-/gpu=0", "invalid vendor"),
        ("vendor/9gpu=0", "invalid class"),
        ("vendor/gpu_=0", "invalid class"),
        ("vendor/g pu=0", "invalid class"),
        ("vendor/gpu=-dev", "invalid device name"),
        ("vendor/gpu=dev-", "invalid device name"),
        ("vendor/gpu=de/v", "invalid device name"),
        ("vendor/gpu=dev=x", "invalid device name"),
        ("vendor/" + "c" * 64 + "=d", "longer than 63"),
    ],
)
def test_parse_qualified_name_rejects(text: str, needle: str) -> None:
    with pytest.raises(CdiError) as err:
        parse_qualified_name(text)
    assert needle in str(err.value)


def test_parse_kind_and_builder() -> None:
    assert parse_kind("example.com/gpu") == ("example.com", "gpu")
    assert qualified_name("example.com", "gpu", "claim-1") == "example.com/gpu=claim-1"
    with pytest.raises(CdiError) as err:
        qualified_name("example.com", "gpu", "bad name")
    assert err.value.field == "name"
