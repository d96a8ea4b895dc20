from fractions import Fraction

import pytest

from dra_driver.k8s.quantity import Quantity, QuantityError, QuantityFormat, parse_quantity

GI = 2**30


@pytest.mark.parametrize(
    ("text", "value", "fmt"),
    [
        ("40Gi", Fraction(40 * GI), QuantityFormat.BINARY_SI),
        ("42949672960", Fraction(42949672960), QuantityFormat.DECIMAL_SI),
        ("1.5Gi", Fraction(3 * GI, 2), QuantityFormat.BINARY_SI),
        ("1Ki", Fraction(1024), QuantityFormat.BINARY_SI),
        ("1Ei", Fraction(2**60), QuantityFormat.BINARY_SI),
        ("500m", Fraction(1, 2), QuantityFormat.DECIMAL_SI),
        ("250u", Fraction(1, 4000), QuantityFormat.DECIMAL_SI),
        ("7n", Fraction(7, 10**9), QuantityFormat.DECIMAL_SI),
        ("1k", Fraction(1000), QuantityFormat.DECIMAL_SI),
        ("2M", Fraction(2 * 10**6), QuantityFormat.DECIMAL_SI),
        ("3G", Fraction(3 * 10**9), QuantityFormat.DECIMAL_SI),
        ("1T", Fraction(10**12), QuantityFormat.DECIMAL_SI),
        ("1P", Fraction(10**15), QuantityFormat.DECIMAL_SI),
        ("1E", Fraction(10**18), QuantityFormat.DECIMAL_SI),
        ("1e3", Fraction(1000), QuantityFormat.DECIMAL_EXPONENT),
        ("1E3", Fraction(1000), QuantityFormat.DECIMAL_EXPONENT),
        ("12e-3", Fraction(12, 1000), QuantityFormat.DECIMAL_EXPONENT),
        ("5e+2", Fraction(500), QuantityFormat.DECIMAL_EXPONENT),
        (".5", Fraction(1, 2), QuantityFormat.DECIMAL_SI),
        ("5.", Fraction(5), QuantityFormat.DECIMAL_SI),
        ("+3", Fraction(3), QuantityFormat.DECIMAL_SI),
        ("-1.5Ki", Fraction(-1536), QuantityFormat.BINARY_SI),
        ("0", Fraction(0), QuantityFormat.DECIMAL_SI),
        # Finer than 1n rounds up (away from zero), as ParseQuantity does.
        ("0.1n", Fraction(1, 10**9), QuantityFormat.DECIMAL_SI),
        ("-0.1n", Fraction(-1, 10**9), QuantityFormat.DECIMAL_SI),
    ],
)
def test_parse(text: str, value: Fraction, fmt: QuantityFormat) -> None:
    q = parse_quantity(text)
    assert q.as_fraction() == value
    assert q.format is fmt


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty quantity"),
        ("Gi", "no digits"),
        (".", "no digits"),
        ("1K", "unknown suffix 'K'"),
        ("1Gb", "unknown suffix 'Gb'"),
        ("1 Gi", "unknown suffix ' Gi'"),
        ("1.2.3", "unknown suffix '.3'"),
        ("--1", "no digits"),
        ("1e", "unknown suffix 'e'"),
        ("1e5000", "out of range"),
    ],
)
def test_parse_rejects(text: str, fragment: str) -> None:
    with pytest.raises(QuantityError, match=r"invalid quantity|empty quantity") as err:
        parse_quantity(text)
    assert fragment in str(err.value)


def test_parse_rejects_non_string() -> None:
    with pytest.raises(QuantityError, match="must be a string"):
        parse_quantity(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("1024Mi", "1Gi"),
        ("1.5Gi", "1536Mi"),
        ("40Gi", "40Gi"),
        ("0.5Ki", "512"),  # binary below 1024 falls back to decimal
        ("1000M", "1G"),
        ("1500", "1500"),
        ("0.5", "500m"),
        ("1e3", "1e3"),
        ("1500e3", "1500e3"),
        ("0", "0"),
        ("0Gi", "0"),
        ("42949672960", "42949672960"),
        ("-2Gi", "-2Gi"),
    ],
)
def test_canonical_string(text: str, canonical: str) -> None:
    assert str(parse_quantity(text)) == canonical


def test_mixed_units_compare_exactly() -> None:
    assert parse_quantity("40Gi") == parse_quantity("42949672960")
    assert parse_quantity("40Gi") > parse_quantity("42949672959")
    assert parse_quantity("1Gi").compare(parse_quantity("1G")) == 1
    assert hash(parse_quantity("1Ki")) == hash(parse_quantity("1024"))
    # 0.1 + 0.2 is exact here (no float rounding)
    assert parse_quantity("100m").add(parse_quantity("200m")) == parse_quantity("300m")


def test_integer_conversions() -> None:
    assert parse_quantity("1.5Gi").as_int64() == 1610612736
    assert parse_quantity("2").is_integer()
    assert not parse_quantity("1500m").is_integer()
    assert not parse_quantity("16Ei").is_integer()  # 2^64: outside int64
    with pytest.raises(QuantityError, match="fractional"):
        parse_quantity("1500m").as_int64()
    with pytest.raises(QuantityError, match="int64"):
        parse_quantity("16Ei").as_int64()
    assert parse_quantity("1500m").as_approximate_float() == 1.5


def test_arithmetic_keeps_receiver_format() -> None:
    q = parse_quantity("1Gi").add(1024**3)
    assert str(q) == "2Gi"
    assert q.format is QuantityFormat.BINARY_SI
    assert parse_quantity("1").sub(parse_quantity("2")).sign() == -1
    assert Quantity.from_int(0).sign() == 0
