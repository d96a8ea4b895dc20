"""dra_driver.k8s.names: the Kubernetes name formats at their boundaries, with the apiserver's wording."""

from __future__ import annotations

import pytest

from dra_driver.k8s import names


def label_of(length: int) -> str:
    return "a" * length


def subdomain_of(length: int) -> str:
    """A valid-looking subdomain of exactly `length` characters: 63-character labels joined by dots."""
    text = ".".join([label_of(63)] * (length // 64 + 1))[:length]
    return text[:-2] + ".b" if text.endswith(".") else text


# ---- DNS-1123 labels ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["a", "0", "a-b", "a--b", "123-abc", "my-name", label_of(63), "9" * 63])
def test_dns_label_accepts(value: str) -> None:
    assert names.dns_label_problems(value) == []
    assert names.is_dns_label(value)


@pytest.mark.parametrize(
    "value",
    ["", "-a", "a-", "-", "A", "aB", "a.b", "a_b", "a b", "ä", "a\n", label_of(64)],
)
def test_dns_label_rejects(value: str) -> None:
    assert names.dns_label_problems(value)
    assert not names.is_dns_label(value)


def test_dns_label_messages() -> None:
    assert names.dns_label_problems("My-Name") == [
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
        "and end with an alphanumeric character (e.g. 'my-name', or '123-abc')"
    ]
    # Too long but well-formed: only the length problem; too long and malformed: both, length first.
    assert names.dns_label_problems(label_of(64)) == ["must be no more than 63 characters"]
    assert names.dns_label_problems(label_of(63) + "-") == ["must be no more than 63 characters", names.DNS_LABEL_MSG]


# ---- DNS-1123 subdomains --------------------------------------------------------------------------


def test_subdomain_helper_builds_exact_lengths() -> None:
    for length in (1, 63, 64, 65, 127, 128, 252, 253, 254):
        text = subdomain_of(length)
        assert len(text) == length
        assert not text.startswith(".") and not text.endswith(".")


@pytest.mark.parametrize(
    "value", ["a", "example.com", "gpu.dra.dev", "a-b.c-d", "1.2.3", "a" * 64, subdomain_of(253)]
)
def test_dns_subdomain_accepts(value: str) -> None:
    assert names.dns_subdomain_problems(value) == []
    assert names.is_dns_subdomain(value)


@pytest.mark.parametrize(
    "value",
    ["", ".", ".a", "a.", "a..b", "-a.b", "a-.b", "a.-b", "a.b-", "Example.com", "gpu.DRA.dev", "a_b.c", "a/b",
     subdomain_of(254)],
)
def test_dns_subdomain_rejects(value: str) -> None:
    assert names.dns_subdomain_problems(value)
    assert not names.is_dns_subdomain(value)


def test_dns_subdomain_max_len_and_messages() -> None:
    assert names.dns_subdomain_problems(subdomain_of(254)) == ["must be no more than 253 characters"]
    assert names.dns_subdomain_problems("A.b") == [
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
        "must start and end with an alphanumeric character (e.g. 'example.com')"
    ]
    # A DRA driver name is a subdomain of at most 63 characters.
    assert names.is_dns_subdomain(subdomain_of(63), max_len=63)
    assert names.dns_subdomain_problems(subdomain_of(64), max_len=63) == ["must be no more than 63 characters"]


# ---- qualified names (label keys, finalizers, taint keys) ----------------------------------------


@pytest.mark.parametrize(
    "value",
    ["a", "MyName", "my.name", "my_name", "123-abc", "A" * 63, "example.com/MyName", "gpu.dra.dev/model",
     f"{subdomain_of(253)}/{'x' * 63}"],
)
def test_qualified_name_accepts(value: str) -> None:
    assert names.qualified_name_problems(value) == []
    assert names.is_qualified_name(value)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "name part must be non-empty"),
        ("example.com/", "name part must be non-empty"),
        ("/name", "prefix part must be non-empty"),
        ("a" * 64, "name part must be no more than 63 characters"),
        ("example.com/" + "a" * 64, "name part must be no more than 63 characters"),
        ("-name", names.QUALIFIED_NAME_MSG),
        ("name-", names.QUALIFIED_NAME_MSG),
        (".name", names.QUALIFIED_NAME_MSG),
        ("na me", names.QUALIFIED_NAME_MSG),
        ("a/b/c", names.QUALIFIED_NAME_MSG),
        ("Example.com/name", "prefix part " + names.DNS_SUBDOMAIN_MSG),
        (f"{subdomain_of(254)}/name", "prefix part must be no more than 253 characters"),
    ],
)
def test_qualified_name_rejects(value: str, problem: str) -> None:
    assert problem in names.qualified_name_problems(value)
    assert not names.is_qualified_name(value)


# ---- label values -------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["", "a", "A", "a.b", "a_b", "a-b", "1.0", "x" * 63])
def test_label_value_accepts(value: str) -> None:
    assert names.label_value_problems(value) == []
    assert names.is_label_value(value)


@pytest.mark.parametrize(
    ("value", "problems"),
    [
        ("x" * 64, ["must be no more than 63 characters"]),
        ("-bad", [names.LABEL_VALUE_MSG]),
        ("bad.", [names.LABEL_VALUE_MSG]),
        ("a/b", [names.LABEL_VALUE_MSG]),
        ("-" + "x" * 63, ["must be no more than 63 characters", names.LABEL_VALUE_MSG]),
    ],
)
def test_label_value_rejects(value: str, problems: list[str]) -> None:
    assert names.label_value_problems(value) == problems
    assert not names.is_label_value(value)


# ---- C identifiers and path segments ---------------------------------------------------------------


@pytest.mark.parametrize(("value", "ok"), [("model", True), ("_x9", True), ("MY_NAME", True), ("9lives", False),
                                           ("copy-engines", False), ("a.b", False), ("", False)])
def test_c_identifier(value: str, ok: bool) -> None:
    assert names.is_c_identifier(value) is ok


@pytest.mark.parametrize(
    ("value", "problems"),
    [("Any_Name.x", []), (".", ["may not be '.'"]), ("..", ["may not be '..'"]), ("a/b", ["may not contain '/'"]),
     ("a%b", ["may not contain '%'"])],
)
def test_path_segment_names(value: str, problems: list[str]) -> None:
    assert names.path_segment_name_problems(value) == problems
