"""CEL's standard timestamp and duration values, with Go's semantics as cel-go v0.26/v0.27 has them (pure).

Sources (facts, not code): cel-go `common/types/timestamp.go`, `duration.go`, `overflow.go`, `string.go`,
`int.go` and `common/stdlib/standard.go`; Go's `time.Parse(time.RFC3339, ...)` (its RFC 3339 fast path),
`time.ParseDuration`, `Time.Format(time.RFC3339Nano)` and `strconv.FormatFloat(x, 'f', -1, 64)`.

A timestamp keeps the UTC offset it was written with (cel-go keeps Go's `time.Location`): `string()` prints it
back in that offset, while the getters read UTC unless given a time zone (Kubernetes sets
`cel.DefaultUTCTimeZone(true)`). Timestamps range over 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999999Z,
durations over Go's int64 nanoseconds.
"""

from __future__ import annotations

import datetime as _dt
import re
import zoneinfo
from dataclasses import dataclass
from decimal import Decimal
from typing import ClassVar, Final

from dra_driver.cel.runtime import INT_MAX, INT_MIN, CelEvalError

__all__ = [
    "Duration",
    "Timestamp",
    "parse_duration",
    "parse_timestamp",
    "timestamp_from_unix",
]

MIN_UNIX: Final = -62135596800  # 0001-01-01T00:00:00Z
MAX_UNIX: Final = 253402300799  # 9999-12-31T23:59:59Z
_NANOS: Final = 1_000_000_000
_EPOCH: Final = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)

TIMESTAMP_OVERFLOW: Final = "timestamp overflow"
INTEGER_OVERFLOW: Final = "integer overflow"


@dataclass(frozen=True, eq=False)
class Timestamp:
    """An instant: `seconds` since the Unix epoch (floor), `nanos` in [0, 1e9), shown at `offset` seconds east."""

    seconds: int
    nanos: int = 0
    offset: int = 0
    cel_type_name: ClassVar[str] = "google.protobuf.Timestamp"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Timestamp):
            return NotImplemented
        return self.seconds == other.seconds and self.nanos == other.nanos

    def __hash__(self) -> int:
        return hash((self.seconds, self.nanos))

    def compare(self, other: Timestamp) -> int:
        a, b = (self.seconds, self.nanos), (other.seconds, other.nanos)
        return (a > b) - (a < b)

    def __str__(self) -> str:
        """Go's RFC3339Nano in the timestamp's own offset."""
        try:
            local = _EPOCH + _dt.timedelta(seconds=self.seconds + self.offset)
        except OverflowError:  # an offset past year 1 or 9999; Go would print year 0 or 10000
            raise CelEvalError(TIMESTAMP_OVERFLOW) from None
        text = f"{local.year:04d}-{local.month:02d}-{local.day:02d}T{local:%H:%M:%S}"
        if self.nanos:
            text += "." + f"{self.nanos:09d}".rstrip("0")
        if self.offset == 0:
            return text + "Z"
        sign = "-" if self.offset < 0 else "+"
        minutes = abs(self.offset) // 60
        return text + f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"

    def add(self, d: Duration) -> Timestamp:
        total = self.nanos + d.nanos
        seconds = self.seconds + total // _NANOS  # Python's floor division normalises as Go's time.Unix
        if seconds < MIN_UNIX or seconds > MAX_UNIX:
            raise CelEvalError(TIMESTAMP_OVERFLOW)
        return Timestamp(seconds, total % _NANOS, self.offset)

    def subtract(self, other: Timestamp | Duration) -> Timestamp | Duration:
        if isinstance(other, Duration):
            return self.add(other.negate())
        return Duration.checked((self.seconds - other.seconds) * _NANOS + self.nanos - other.nanos)

    def in_zone(self, zone: str) -> _dt.datetime:
        """The wall clock in `zone` (an IANA name, or `[+-]HH:MM`, as cel-go's inTimeZone reads it)."""
        instant = _EPOCH + _dt.timedelta(seconds=self.seconds)
        colon = zone.find(":")
        if colon == -1:
            location = _load_location(zone)
            try:
                return instant.astimezone(location)
            except (ValueError, OverflowError):
                raise CelEvalError(TIMESTAMP_OVERFLOW) from None
        hours = _go_atoi(zone[:colon])
        minutes = _go_atoi(zone[colon + 1 :])
        offset = hours * 60 - minutes if zone[:1] == "-" else hours * 60 + minutes
        try:
            return instant.astimezone(_dt.timezone(_dt.timedelta(minutes=offset)))
        except (ValueError, OverflowError):
            raise CelEvalError(f"timezone offset out of range: {zone}") from None


def _go_atoi(text: str) -> int:
    """strconv.Atoi: optional sign, decimal digits only."""
    if re.fullmatch(r"[+-]?[0-9]+", text) is None:
        raise CelEvalError(f'strconv.Atoi: parsing "{text}": invalid syntax')
    return int(text)


def _load_location(name: str) -> _dt.tzinfo:
    """time.LoadLocation: "" and "UTC" are UTC; "Local" is the server's zone (UTC on Kubernetes' images)."""
    if name in ("", "UTC", "Local"):
        return _dt.UTC
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise CelEvalError(f"unknown time zone {name}") from None


@dataclass(frozen=True)
class Duration:
    """A span of time in nanoseconds (Go's time.Duration: int64)."""

    nanos: int
    cel_type_name: ClassVar[str] = "google.protobuf.Duration"

    @staticmethod
    def checked(nanos: int) -> Duration:
        if nanos > INT_MAX or nanos < INT_MIN:
            raise CelEvalError(INTEGER_OVERFLOW)
        return Duration(nanos)

    def compare(self, other: Duration) -> int:
        return (self.nanos > other.nanos) - (self.nanos < other.nanos)

    def negate(self) -> Duration:
        return Duration.checked(-self.nanos)

    def add(self, other: Duration) -> Duration:
        return Duration.checked(self.nanos + other.nanos)

    def subtract(self, other: Duration) -> Duration:
        return Duration.checked(self.nanos - other.nanos)

    def seconds_float(self) -> float:
        whole = int(self.nanos / _NANOS) if self.nanos >= 0 else -((-self.nanos) // _NANOS)
        return float(whole) + float(self.nanos - whole * _NANOS) / 1e9

    def __str__(self) -> str:
        """strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"."""
        text = format(Decimal(repr(self.seconds_float())), "f")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        return text + "s"

    def truncated(self, unit: int) -> int:
        """Whole `unit`s, truncated toward zero (Go's Hours()/Minutes()/Seconds() converted to int)."""
        q = abs(self.nanos) // unit
        return q if self.nanos >= 0 else -q


# -- parsing -------------------------------------------------------------------------------------

_DAYS_IN_MONTH: Final = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _days_in(month: int, year: int) -> int:
    if month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
        return 29
    return _DAYS_IN_MONTH[month - 1]


def _uint(text: str, lo: int, hi: int) -> int | None:
    if not text or not all("0" <= c <= "9" for c in text):
        return None
    value = int(text)
    return value if lo <= value <= hi else None


def _conversion_error(target: str) -> CelEvalError:
    return CelEvalError(f"type conversion error from 'string' to '{target}'")


def parse_timestamp(text: str) -> Timestamp:
    """timestamp(string): Go's time.Parse(time.RFC3339, s) (its strict RFC 3339 path), then the CEL range."""
    parsed = _parse_rfc3339(text)
    if parsed is None:
        raise _conversion_error("google.protobuf.Timestamp")
    if parsed.seconds < MIN_UNIX or parsed.seconds > MAX_UNIX:
        raise CelEvalError(TIMESTAMP_OVERFLOW)
    return parsed


def _parse_rfc3339(s: str) -> Timestamp | None:
    if len(s) < 19 or not s.isascii():
        return None
    year = _uint(s[0:4], 0, 9999)
    month = _uint(s[5:7], 1, 12)
    if year is None or month is None:
        return None
    day = _uint(s[8:10], 1, _days_in(month, year))
    hour = _uint(s[11:13], 0, 23)
    minute = _uint(s[14:16], 0, 59)
    second = _uint(s[17:19], 0, 59)
    if day is None or hour is None or minute is None or second is None:
        return None
    if not (s[4] == "-" and s[7] == "-" and s[10] == "T" and s[13] == ":" and s[16] == ":"):
        return None
    rest = s[19:]
    nanos = 0
    if len(rest) >= 2 and rest[0] == "." and rest[1].isdigit():
        n = 2
        while n < len(rest) and rest[n].isdigit():
            n += 1
        digits = rest[1:n][:9]
        nanos = int(digits.ljust(9, "0"))
        rest = rest[n:]
    offset = 0
    if rest != "Z":
        if len(rest) != 6:
            return None
        oh = _uint(rest[1:3], 0, 23)
        om = _uint(rest[4:6], 0, 59)
        if oh is None or om is None or rest[0] not in "+-" or rest[3] != ":":
            return None
        offset = (oh * 60 + om) * 60 * (-1 if rest[0] == "-" else 1)
    days = _days_from_civil(year, month, day)
    seconds = days * 86400 + hour * 3600 + minute * 60 + second - offset
    return Timestamp(seconds, nanos, offset)


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 in the proleptic Gregorian calendar (year 0 included, as Go's time.Date)."""
    y = year - (1 if month <= 2 else 0)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def timestamp_from_unix(seconds: int) -> Timestamp:
    """timestamp(int): Unix seconds, UTC."""
    if seconds < MIN_UNIX or seconds > MAX_UNIX:
        raise CelEvalError(TIMESTAMP_OVERFLOW)
    return Timestamp(seconds, 0, 0)


_UNITS: Final = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # U+00B5 micro sign
    "\u03bcs": 1_000,  # U+03BC Greek mu
    "ms": 1_000_000,
    "s": _NANOS,
    "m": 60 * _NANOS,
    "h": 3600 * _NANOS,
}
_NUMBER: Final = re.compile(r"([0-9]*)(?:\.([0-9]*))?")


def parse_duration(text: str) -> Duration:
    """duration(string): Go's time.ParseDuration (`[-+]?([0-9]*(\\.[0-9]*)?[a-z]+)+`)."""
    value = _go_parse_duration(text)
    if value is None:
        raise _conversion_error("google.protobuf.Duration")
    return Duration(value)


def _go_parse_duration(s: str) -> int | None:
    neg = False
    if s[:1] in ("-", "+"):
        neg = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if s == "":
        return None
    total = 0
    while s:
        if not (s[0] == "." or "0" <= s[0] <= "9"):
            return None
        m = _NUMBER.match(s)
        assert m is not None
        whole, frac = m.group(1), m.group(2)
        if not whole and not frac:
            return None
        s = s[m.end() :]
        i = 0
        while i < len(s) and not (s[i] == "." or "0" <= s[i] <= "9"):
            i += 1
        unit = _UNITS.get(s[:i])
        if unit is None:
            return None
        s = s[i:]
        v = int(whole) if whole else 0
        if v > (1 << 63) // unit:
            return None
        v *= unit
        if frac:
            # Go's leadingFraction stops accumulating digits once they would overflow; 18 digits stay exact.
            f = int(frac[:18])
            scale = 10 ** len(frac[:18])
            v += int(float(f) * (float(unit) / scale))
            if v > 1 << 63:
                return None
        total += v
        if total > 1 << 63:
            return None
    if neg:
        return -total
    if total > (1 << 63) - 1:
        return None
    return total

