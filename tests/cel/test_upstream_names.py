"""Differential tables for dra_driver/k8s/names.py: the good and bad values of apimachinery
pkg/util/validation/validation_test.go (v0.34.0: TestIsDNS1123Label, TestIsDNS1123Subdomain, TestIsCIdentifier,
TestIsQualifiedName, TestIsValidLabelValue), facts only. DRA uses them for driver names and attribute domains
(subdomains), device and pool names (labels), attribute ids (C identifiers) and qualified names."""

from __future__ import annotations

import pytest

from dra_driver.k8s.names import is_c_identifier, is_dns_label, is_dns_subdomain, is_label_value, is_qualified_name

LABEL_GOOD = ["a", "ab", "abc", "a1", "a-1", "a--1--2--b", "0", "01", "012", "1a", "1-a", "1--a--b--2", "a" * 63]
LABEL_BAD = [
    "", "A", "ABC", "aBc", "A1", "A-1", "1-A", "-", "a-", "-a", "1-", "-1", "_", "a_", "_a", "a_b", "1_", "_1", "1_2",
    ".", "a.", ".a", "a.b", "1.", ".1", "1.2", " ", "a ", " a", "a b", "1 ", " 1", "1 2", "a" * 64,
]
SUBDOMAIN_GOOD = [
    "a", "ab", "abc", "a1", "a-1", "a--1--2--b", "0", "01", "012", "1a", "1-a", "1--a--b--2",
    "a.a", "ab.a", "abc.a", "a1.a", "a-1.a", "a--1--2--b.a", "a.1", "ab.1", "abc.1", "a1.1", "a-1.1", "a--1--2--b.1",
    "0.a", "01.a", "012.a", "1a.a", "1-a.a", "1--a--b--2", "0.1", "01.1", "012.1", "1a.1", "1-a.1", "1--a--b--2.1",
    "a.b.c.d.e", "aa.bb.cc.dd.ee", "1.2.3.4.5", "11.22.33.44.55", "a" * 253,
]
SUBDOMAIN_BAD = [
    "", "A", "ABC", "aBc", "A1", "A-1", "1-A", "-", "a-", "-a", "1-", "-1", "_", "a_", "_a", "a_b", "1_", "_1", "1_2",
    ".", "a.", ".a", "a..b", "1.", ".1", "1..2", " ", "a ", " a", "a b", "1 ", " 1", "1 2",
    "A.a", "aB.a", "ab.A", "A1.a", "a1.A", "A.1", "aB.1", "A1.1", "1A.1", "0.A", "01.A", "012.A", "1A.a", "1a.A",
    "A.B.C.D.E", "AA.BB.CC.DD.EE", "a.B.c.d.e", "aa.bB.cc.dd.ee", "a@b", "a,b", "a_b", "a;b", "a:b", "a%b", "a?b",
    "a$b", "a" * 254,
]
C_IDENTIFIER_GOOD = [
    "a", "ab", "abc", "a1", "_a", "a_", "a_b", "a_1", "a__1__2__b", "__abc_123",
    "A", "AB", "AbC", "A1", "_A", "A_", "A_B", "A_1", "A__1__2__B", "__123_ABC",
]
C_IDENTIFIER_BAD = [
    "", "1", "123", "1a", "-", "a-", "-a", "1-", "-1", "1_", "1_2", ".", "a.", ".a", "a.b", "1.", ".1", "1.2",
    " ", "a ", " a", "a b", "1 ", " 1", "1 2", "#a#",
]
QUALIFIED_GOOD = [
    "simple", "now-with-dashes", "1-starts-with-num", "1234", "simple/simple", "now-with-dashes/simple",
    "now-with-dashes/now-with-dashes", "now.with.dots/simple", "now-with.dashes-and.dots/simple", "1-num.2-num/3-num",
    "1234/5678", "1.2.3.4/5678", "Uppercase_Is_OK_123", "example.com/Uppercase_Is_OK_123", "requests.storage-foo",
    "a" * 63, "a" * 253 + "/" + "b" * 63,
]
QUALIFIED_BAD = [
    "nospecialchars%^=@", "cantendwithadash-", "-cantstartwithadash-", "only/one/slash", "Example.com/abc",
    "example_com/abc", "example.com/", "/simple", "a" * 64, "a" * 254 + "/abc",
]
LABEL_VALUE_GOOD = ["simple", "now-with-dashes", "1-starts-with-num", "end-with-num-1", "1234", "a" * 63, ""]
LABEL_VALUE_BAD = [
    "nospecialchars%^=@", "Tama-nui-te-r\u0101.is.M\u0101ori.sun", "\\backslashes\\are\\bad", "-starts-with-dash",
    "ends-with-dash-", ".starts.with.dot", "ends.with.dot.", "a" * 64,
]


@pytest.mark.parametrize(
    ("check", "good", "bad"),
    [
        (is_dns_label, LABEL_GOOD, LABEL_BAD),
        (is_dns_subdomain, SUBDOMAIN_GOOD, SUBDOMAIN_BAD),
        (is_c_identifier, C_IDENTIFIER_GOOD, C_IDENTIFIER_BAD),
        (is_qualified_name, QUALIFIED_GOOD, QUALIFIED_BAD),
        (is_label_value, LABEL_VALUE_GOOD, LABEL_VALUE_BAD),
    ],
    ids=["dns1123-label", "dns1123-subdomain", "c-identifier", "qualified-name", "label-value"],
)
def test_same_verdicts_as_apimachinery(check: object, good: list[str], bad: list[str]) -> None:
    assert callable(check)
    assert [v for v in good if not check(v)] == []
    assert [v for v in bad if check(v)] == []
