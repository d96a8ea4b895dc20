"""Differential tables for dra_driver/k8s/quantity.py from apimachinery pkg/api/resource/quantity_test.go
(v0.34.0), facts only: TestQuantityParse (value and format of each input, also negated and with a '+'),
TestQuantityParseEmit (canonical form), TestQuantityCmp, and the inputs it must refuse."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dra_driver.k8s.quantity import QuantityError, QuantityFormat, parse_quantity

# input, value, scale (the quantity is value * 10**scale), format
PARSE: list[tuple[str, int, int, str]] = [
    ('0', 0, 0, 'DecimalSI'),
    ('0n', 0, 0, 'DecimalSI'),
    ('0u', 0, 0, 'DecimalSI'),
    ('0m', 0, 0, 'DecimalSI'),
    ('0Ki', 0, 0, 'BinarySI'),
    ('0k', 0, 0, 'DecimalSI'),
    ('0Mi', 0, 0, 'BinarySI'),
    ('0M', 0, 0, 'DecimalSI'),
    ('0Gi', 0, 0, 'BinarySI'),
    ('0G', 0, 0, 'DecimalSI'),
    ('0Ti', 0, 0, 'BinarySI'),
    ('0T', 0, 0, 'DecimalSI'),
    ('1', 1, 0, 'DecimalSI'),
    ('1Ki', 1024, 0, 'BinarySI'),
    ('8Ki', 8192, 0, 'BinarySI'),
    ('7Mi', 7340032, 0, 'BinarySI'),
    ('6Gi', 6442450944, 0, 'BinarySI'),
    ('5Ti', 5497558138880, 0, 'BinarySI'),
    ('4Pi', 4503599627370496, 0, 'BinarySI'),
    ('3Ei', 3458764513820540928, 0, 'BinarySI'),
    ('10Ti', 10995116277760, 0, 'BinarySI'),
    ('100Ti', 109951162777600, 0, 'BinarySI'),
    ('5n', 5, -9, 'DecimalSI'),
    ('4u', 4, -6, 'DecimalSI'),
    ('3m', 3, -3, 'DecimalSI'),
    ('9', 9, 0, 'DecimalSI'),
    ('8k', 8, 3, 'DecimalSI'),
    ('50k', 5, 4, 'DecimalSI'),
    ('7M', 7, 6, 'DecimalSI'),
    ('6G', 6, 9, 'DecimalSI'),
    ('5T', 5, 12, 'DecimalSI'),
    ('40T', 4, 13, 'DecimalSI'),
    ('300T', 3, 14, 'DecimalSI'),
    ('2P', 2, 15, 'DecimalSI'),
    ('1E', 1, 18, 'DecimalSI'),
    ('1E-3', 1, -3, 'DecimalExponent'),
    ('1e3', 1, 3, 'DecimalExponent'),
    ('1E6', 1, 6, 'DecimalExponent'),
    ('1e9', 1, 9, 'DecimalExponent'),
    ('1E12', 1, 12, 'DecimalExponent'),
    ('1e15', 1, 15, 'DecimalExponent'),
    ('1E18', 1, 18, 'DecimalExponent'),
    ('1e14', 1, 14, 'DecimalExponent'),
    ('1e13', 1, 13, 'DecimalExponent'),
    ('1e3', 1, 3, 'DecimalExponent'),
    ('100.035k', 100035, 0, 'DecimalSI'),
    ('0.001', 1, -3, 'DecimalSI'),
    ('0.0005k', 5, -1, 'DecimalSI'),
    ('0.005', 5, -3, 'DecimalSI'),
    ('0.05', 5, -2, 'DecimalSI'),
    ('0.5', 5, -1, 'DecimalSI'),
    ('0.00050k', 5, -1, 'DecimalSI'),
    ('0.00500', 5, -3, 'DecimalSI'),
    ('0.05000', 5, -2, 'DecimalSI'),
    ('0.50000', 5, -1, 'DecimalSI'),
    ('0.5e0', 5, -1, 'DecimalExponent'),
    ('0.5e-1', 5, -2, 'DecimalExponent'),
    ('0.5e-2', 5, -3, 'DecimalExponent'),
    ('0.5e0', 5, -1, 'DecimalExponent'),
    ('10.035M', 10035, 3, 'DecimalSI'),
    ('1.2e3', 12, 2, 'DecimalExponent'),
    ('1.3E+6', 13, 5, 'DecimalExponent'),
    ('1.40e9', 14, 8, 'DecimalExponent'),
    ('1.53E12', 153, 10, 'DecimalExponent'),
    ('1.6e15', 16, 14, 'DecimalExponent'),
    ('1.7E18', 17, 17, 'DecimalExponent'),
    ('9.01', 901, -2, 'DecimalSI'),
    ('8.1k', 81, 2, 'DecimalSI'),
    ('7.123456M', 7123456, 0, 'DecimalSI'),
    ('6.987654321G', 6987654321, 0, 'DecimalSI'),
    ('5.444T', 5444, 9, 'DecimalSI'),
    ('40.1T', 401, 11, 'DecimalSI'),
    ('300.2T', 3002, 11, 'DecimalSI'),
    ('2.5P', 25, 14, 'DecimalSI'),
    ('1.01E', 101, 16, 'DecimalSI'),
    ('3.001n', 4, -9, 'DecimalSI'),
    ('1.1E-9', 2, -9, 'DecimalExponent'),
    ('0.0000000001', 1, -9, 'DecimalSI'),
    ('0.0000000005', 1, -9, 'DecimalSI'),
    ('0.00000000050', 1, -9, 'DecimalSI'),
    ('0.5e-9', 1, -9, 'DecimalExponent'),
    ('0.9n', 1, -9, 'DecimalSI'),
    ('0.00000012345', 124, -9, 'DecimalSI'),
    ('0.00000012354', 124, -9, 'DecimalSI'),
    ('12E', 12, 18, 'DecimalSI'),
    ('100.035Ki', 10243584, -2, 'BinarySI'),
    ('0.05Gi', 536870912, -1, 'BinarySI'),
    ('0.025Ti', 274877906944, -1, 'BinarySI'),
    ('0.000000000001Ki', 2, -9, 'DecimalSI'),
    ('.001', 1, -3, 'DecimalSI'),
    ('.0001k', 100, -3, 'DecimalSI'),
    ('1.', 1, 0, 'DecimalSI'),
    ('1.G', 1, 9, 'DecimalSI'),
]
FORMATS = {"DecimalSI": QuantityFormat.DECIMAL_SI, "BinarySI": QuantityFormat.BINARY_SI,
           "DecimalExponent": QuantityFormat.DECIMAL_EXPONENT}


@pytest.mark.parametrize(("text", "value", "scale", "fmt"), PARSE)
def test_parse(text: str, value: int, scale: int, fmt: str) -> None:
    expected = Fraction(value) * Fraction(10) ** scale
    for sign, prefix in ((1, ""), (-1, "-"), (1, "+")):
        q = parse_quantity(prefix + text.lstrip())
        assert q.as_fraction() == sign * expected, prefix + text
        assert q.format is FORMATS[fmt], prefix + text


EMIT = [("1Ki", "1Ki"), ("1Mi", "1Mi"), ("1Gi", "1Gi"), ("1024Mi", "1Gi"), ("1000M", "1G"), (".001Ki", "1024m"),
        (".000001Ki", "1024u"), (".000000001Ki", "1024n"), (".000000000001Ki", "2n")]


@pytest.mark.parametrize(("text", "canonical"), EMIT)
def test_canonical_form(text: str, canonical: str) -> None:
    assert str(parse_quantity(text)) == canonical
    assert str(parse_quantity("-" + text)) == "-" + canonical


@pytest.mark.parametrize(("x", "y", "expected"), [("0", "0", 0), ("100m", "50m", 1), ("50m", "100m", -1),
                                                  ("10000T", "100Gi", 1)])
def test_compare(x: str, y: str, expected: int) -> None:
    assert parse_quantity(x).compare(parse_quantity(y)) == expected


@pytest.mark.parametrize("text", ["", "1.1.M", "1+1.0M", "0.1mi", "0.1am", "aoeu", ".5i", "1i", "-3.01i", "-3.01e-",
                                  " 1", "1 "])
def test_refused(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)
