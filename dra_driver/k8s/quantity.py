"""Kubernetes `resource.Quantity`: exact parsing, arithmetic and canonical formatting.

Pure and dependency-free so that the allocator (capacity, counters) and the CEL library share one
implementation. Values are held as an exact integer number of nano-units: the Kubernetes parser
rounds anything finer than 1n up (away from zero), so nano precision is exactly what the API can
express, and integer arithmetic never loses a byte when comparing "40Gi" with "42949672960".
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

from dra_driver.errors import DraDriverError

__all__ = ["Quantity", "QuantityError", "QuantityFormat", "parse_quantity"]

_NANO: Final = 10**9
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
# Guard against "1e999999999" turning into a gigantic integer. Kubernetes itself would accept such a
# value, but no device capacity or counter comes anywhere near 10^1000.
_MAX_DECIMAL_EXPONENT: Final = 1000


class QuantityError(DraDriverError, ValueError):
    """A string is not a valid Kubernetes quantity, or an operation has no defined result."""


class QuantityFormat(enum.Enum):
    """The three serialisation formats of resource.Quantity; the parsed suffix decides which one."""

    DECIMAL_SI = "DecimalSI"
    BINARY_SI = "BinarySI"
    DECIMAL_EXPONENT = "DecimalExponent"


_BINARY_SUFFIXES: Final[dict[str, int]] = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL_SUFFIXES: Final[dict[str, int]] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_DECIMAL_BY_EXPONENT: Final[dict[int, str]] = {exp: suffix for suffix, exp in _DECIMAL_SUFFIXES.items()}
_BINARY_BY_POWER: Final[dict[int, str]] = {power: suffix for suffix, power in _BINARY_SUFFIXES.items()}

# <sign>? <digits>[.<digits>] | <sign>? .<digits> ; then the suffix, validated separately so the error
# can say which part is wrong.
_NUMBER_RE: Final = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?(.*)", re.DOTALL)
_EXPONENT_RE: Final = re.compile(r"[eE]([+-]?[0-9]+)")

_GRAMMAR_HINT: Final = (
    "expected <number><suffix>, e.g. '40Gi', '1.5', '500m', '2e3'; "
    "suffixes: Ki Mi Gi Ti Pi Ei | n u m k M G T P E | e<exponent>"
)


def _round_away_from_zero(value: Fraction) -> int:
    if value < 0:
        return -_round_away_from_zero(-value)
    return -(-value.numerator // value.denominator)  # ceiling for a non-negative value


@dataclass(frozen=True, eq=False)
class Quantity:
    """An exact quantity. Equality, ordering and hashing follow the numeric value, never the format,
    exactly like resource.Quantity.Cmp (so quantity("1Gi") == quantity("1024Mi"))."""

    nanos: int
    format: QuantityFormat = QuantityFormat.DECIMAL_SI

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_int(cls, value: int, fmt: QuantityFormat = QuantityFormat.DECIMAL_SI) -> Quantity:
        return cls(value * _NANO, fmt)

    @classmethod
    def from_fraction(cls, value: Fraction, fmt: QuantityFormat = QuantityFormat.DECIMAL_SI) -> Quantity:
        return cls(_round_away_from_zero(value * _NANO), fmt)

    # -- value access ---------------------------------------------------------------------------
    def as_fraction(self) -> Fraction:
        return Fraction(self.nanos, _NANO)

    def sign(self) -> int:
        return (self.nanos > 0) - (self.nanos < 0)

    def is_integer(self) -> bool:
        """True when the value is whole and fits an int64 (resource.Quantity.AsInt64 succeeds)."""
        return self.nanos % _NANO == 0 and INT64_MIN <= self.nanos // _NANO <= INT64_MAX

    def as_int64(self) -> int:
        if self.nanos % _NANO != 0:
            raise QuantityError(f"cannot convert {self} to an integer: it has a fractional part")
        whole = self.nanos // _NANO
        if not INT64_MIN <= whole <= INT64_MAX:
            raise QuantityError(f"cannot convert {self} to an integer: it does not fit in int64")
        return whole

    def as_approximate_float(self) -> float:
        return float(self.as_fraction())

    # -- arithmetic (the receiver's format is kept, as Quantity.Add does) ------------------------
    def add(self, other: Quantity | int) -> Quantity:
        delta = other.nanos if isinstance(other, Quantity) else other * _NANO
        return Quantity(self.nanos + delta, self.format)

    def sub(self, other: Quantity | int) -> Quantity:
        delta = other.nanos if isinstance(other, Quantity) else other * _NANO
        return Quantity(self.nanos - delta, self.format)

    def compare(self, other: Quantity) -> int:
        return (self.nanos > other.nanos) - (self.nanos < other.nanos)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.nanos == other.nanos

    def __hash__(self) -> int:
        return hash(self.nanos)

    def __lt__(self, other: Quantity) -> bool:
        return self.nanos < other.nanos

    def __le__(self, other: Quantity) -> bool:
        return self.nanos <= other.nanos

    def __gt__(self, other: Quantity) -> bool:
        return self.nanos > other.nanos

    def __ge__(self, other: Quantity) -> bool:
        return self.nanos >= other.nanos

    # -- canonical string (what the API server would serialise) ---------------------------------
    def __str__(self) -> str:
        if self.nanos == 0:
            return "0"
        fmt = self.format
        if fmt is QuantityFormat.BINARY_SI:
            # Like CanonicalizeBytes: small or fractional values are shown in decimal so nothing is lost.
            if abs(self.nanos) < 1024 * _NANO or self.nanos % _NANO != 0:
                fmt = QuantityFormat.DECIMAL_SI
            else:
                return self._binary_string()
        return self._decimal_string(fmt)

    def __repr__(self) -> str:
        return f"Quantity({str(self)!r})"

    def _binary_string(self) -> str:
        mantissa = self.nanos // _NANO
        power = 0
        while power < max(_BINARY_BY_POWER) and mantissa % 1024 == 0:
            mantissa //= 1024
            power += 1
        return f"{mantissa}{_BINARY_BY_POWER.get(power, '')}"

    def _decimal_string(self, fmt: QuantityFormat) -> str:
        mantissa, exponent = self.nanos, -9
        # Move whole groups of three trailing zeros into the exponent; the exponent stays a multiple of 3.
        while mantissa % 1000 == 0:
            mantissa //= 1000
            exponent += 3
        if fmt is QuantityFormat.DECIMAL_SI and exponent in _DECIMAL_BY_EXPONENT:
            return f"{mantissa}{_DECIMAL_BY_EXPONENT[exponent]}"
        if exponent == 0:
            return str(mantissa)
        return f"{mantissa}e{exponent}"


def parse_quantity(text: str) -> Quantity:
    """Parse a quantity string with the grammar of k8s.io/apimachinery resource.ParseQuantity.

    Raises QuantityError naming the offending string and what the grammar expects. Quantities are immutable,
    so a string seen before (capacities and counters repeat across every device of a product) returns the
    same object from a bounded cache; plain digit strings take an integer fast path.
    """
    if not isinstance(text, str):
        raise QuantityError(f"quantity must be a string, got {type(text).__name__} {text!r}")
    cached = _CACHE.get(text)
    if cached is not None:
        return cached
    if text.isascii() and text.isdigit():
        value = Quantity(int(text) * _NANO, QuantityFormat.DECIMAL_SI)
    else:
        value = _parse_uncached(text)
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.clear()  # crude but bounded; real inputs hold a few hundred distinct strings
    _CACHE[text] = value
    return value


_CACHE_SIZE: Final = 8192
_CACHE: dict[str, Quantity] = {}


def _parse_uncached(text: str) -> Quantity:
    if text == "":
        raise QuantityError(f"empty quantity: {_GRAMMAR_HINT}")
    match = _NUMBER_RE.fullmatch(text)
    if match is None:  # pragma: no cover - the pattern accepts every string; kept for type narrowing
        raise QuantityError(f"invalid quantity {text!r}: {_GRAMMAR_HINT}")
    sign, whole, frac, suffix = match.group(1), match.group(2), match.group(3), match.group(4)
    if not whole and not frac:
        raise QuantityError(f"invalid quantity {text!r}: no digits in the number; {_GRAMMAR_HINT}")
    digits = (whole or "") + (frac or "")
    # value = numerator / denominator, exactly, in integers (no Fraction: this runs for every capacity string)
    numerator, denominator = int(digits), 10 ** len(frac or "")
    if suffix in _BINARY_SUFFIXES:
        numerator *= 1024 ** _BINARY_SUFFIXES[suffix]
        exponent = 0
        fmt = QuantityFormat.BINARY_SI
    elif suffix in _DECIMAL_SUFFIXES:
        exponent = _DECIMAL_SUFFIXES[suffix]
        fmt = QuantityFormat.DECIMAL_SI
    else:
        exp_match = _EXPONENT_RE.fullmatch(suffix)
        if exp_match is None:
            raise QuantityError(f"invalid quantity {text!r}: unknown suffix {suffix!r}; {_GRAMMAR_HINT}")
        exponent = int(exp_match.group(1))
        if abs(exponent) > _MAX_DECIMAL_EXPONENT:
            raise QuantityError(
                f"invalid quantity {text!r}: exponent {exponent} is out of range "
                f"(|exponent| <= {_MAX_DECIMAL_EXPONENT})"
            )
        fmt = QuantityFormat.DECIMAL_EXPONENT
    if exponent >= 0:
        numerator *= 10**exponent
    else:
        denominator *= 10**-exponent
    nanos = -(-(numerator * _NANO) // denominator)  # ceiling: Kubernetes rounds sub-nano values up
    if fmt is QuantityFormat.BINARY_SI and 0 < nanos < _NANO:
        fmt = QuantityFormat.DECIMAL_SI  # apimachinery ParseQuantity: a binary value below 1 is DecimalSI
    return Quantity(-nanos if sign == "-" else nanos, fmt)
