"""The Kubernetes URL, IP, CIDR and format CEL libraries' values, with Go's parsing rules (pure).

Sources (facts, not code): k8s.io/apiserver/pkg/cel/library `urls.go`, `ip.go`, `cidr.go`, `format.go` and
`k8s.io/apiserver/pkg/cel` `url.go`, `ip.go`, `cidr.go`, `format.go`; Go's `net/netip` (ParseAddr,
ParsePrefix, Addr.String and the Is* predicates), `net/url` (ParseRequestURI, Parse, EscapedPath, Query,
Hostname, Port), `strconv.Quote`; k8s.io/apimachinery `util/validation` (IsDNS1123Label ... RegexError) and
kube-openapi `strfmt` (uuid, byte, date, datetime).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Final

from dra_driver.cel.runtime import CelEvalError

__all__ = [
    "CIDR",
    "FORMATS",
    "IP",
    "URL",
    "NamedFormat",
    "is_request_uri",
    "parse_cidr",
    "parse_ip",
    "parse_url",
]


def go_quote(s: str) -> str:
    """strconv.Quote."""
    out = ['"']
    for c in s:
        o = ord(c)
        if c == '"':
            out.append('\\"')
        elif c == "\\":
            out.append("\\\\")
        elif c in "\a\b\f\n\r\t\v":
            out.append({"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}[c])
        elif c.isprintable() or c == " ":
            out.append(c)
        elif o < 0x80:
            out.append(f"\\x{o:02x}")
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    out.append('"')
    return "".join(out)


# -- IP addresses (net/netip) --------------------------------------------------------------------


class _AddrError(Exception):
    def __init__(self, text: str, msg: str, at: str = "") -> None:
        where = f" (at {go_quote(at)})" if at else ""
        super().__init__(f"ParseAddr({go_quote(text)}): {msg}{where}")


@dataclass(frozen=True)
class IP:
    """An IPv4 or IPv6 address (never IPv4-mapped, never zoned: the library refuses both)."""

    value: int
    version: int  # 4 or 6
    cel_type_name: ClassVar[str] = "net.IP"

    def __str__(self) -> str:
        if self.version == 4:
            return ".".join(str((self.value >> s) & 0xFF) for s in (24, 16, 8, 0))
        groups = [(self.value >> (112 - 16 * i)) & 0xFFFF for i in range(8)]
        # RFC 5952: the longest run of two or more zero groups (the first of equals) becomes "::".
        best, best_len, i = -1, 1, 0
        while i < 8:
            if groups[i] == 0:
                j = i
                while j < 8 and groups[j] == 0:
                    j += 1
                if j - i > best_len:
                    best, best_len = i, j - i
                i = j
            else:
                i += 1
        hexes = [f"{g:x}" for g in groups]
        if best < 0:
            return ":".join(hexes)
        return ":".join(hexes[:best]) + "::" + ":".join(hexes[best + best_len :])

    @property
    def bits(self) -> int:
        return 32 if self.version == 4 else 128

    def _top(self, n: int) -> int:
        return self.value >> (self.bits - n)

    def is_unspecified(self) -> bool:
        return self.value == 0

    def is_loopback(self) -> bool:
        return self._top(8) == 127 if self.version == 4 else self.value == 1

    def is_multicast(self) -> bool:
        return self._top(4) == 0xE if self.version == 4 else self._top(8) == 0xFF

    def is_link_local_multicast(self) -> bool:
        if self.version == 4:
            return self._top(24) == 0xE00000  # 224.0.0.0/24
        return self._top(16) & 0xFF0F == 0xFF02  # ff02::/16, any flags

    def is_link_local_unicast(self) -> bool:
        if self.version == 4:
            return self._top(16) == 0xA9FE  # 169.254.0.0/16
        return self._top(10) == 0x3FA  # fe80::/10

    def is_global_unicast(self) -> bool:
        if self.version == 4 and self.value in (0, 0xFFFFFFFF):
            return False
        return not (self.value == 0 or self.is_loopback() or self.is_multicast() or self.is_link_local_unicast())


def _parse_ipv4_fields(text: str, s: str) -> list[int]:
    fields: list[int] = []
    val, digits = 0, 0
    for i, c in enumerate(s):
        if "0" <= c <= "9":
            if digits == 1 and val == 0:
                raise _AddrError(text, "IPv4 field has octet with leading zero")
            val = val * 10 + ord(c) - 48
            digits += 1
            if val > 255:
                raise _AddrError(text, "IPv4 field has value >255")
        elif c == ".":
            if i == 0 or i == len(s) - 1 or s[i - 1] == ".":
                raise _AddrError(text, "IPv4 field must have at least one digit", s[i:])
            if len(fields) == 3:
                raise _AddrError(text, "IPv4 address too long")
            fields.append(val)
            val, digits = 0, 0
        else:
            raise _AddrError(text, "unexpected character", s[i:])
    if len(fields) < 3:
        raise _AddrError(text, "IPv4 address too short")
    fields.append(val)
    return fields


def _parse_ipv6(text: str) -> tuple[int, str]:
    s = text
    zone = ""
    pct = s.find("%")
    if pct != -1:
        s, zone = s[:pct], s[pct + 1 :]
        if zone == "":
            raise _AddrError(text, "zone must be a non-empty string")
    ip = [0] * 16
    ellipsis = -1
    if len(s) >= 2 and s[0] == ":" and s[1] == ":":
        ellipsis = 0
        s = s[2:]
        if s == "":
            return 0, zone
    i = 0
    while i < 16:
        off, acc = 0, 0
        while off < len(s):
            c = s[off]
            if "0" <= c <= "9" or "a" <= c <= "f" or "A" <= c <= "F":
                acc = (acc << 4) + int(c, 16)
            else:
                break
            if off > 3:
                raise _AddrError(text, "each group must have 4 or less digits", s)
            off += 1
        if off == 0:
            raise _AddrError(text, "each colon-separated field must have at least one digit", s)
        if off < len(s) and s[off] == ".":
            if ellipsis < 0 and i != 12:
                raise _AddrError(text, "embedded IPv4 address must replace the final 2 fields of the address", s)
            if i + 4 > 16:
                raise _AddrError(text, "too many hex fields to fit an embedded IPv4 at the end of the address", s)
            ip[i : i + 4] = _parse_ipv4_fields(text, s)
            s = ""
            i += 4
            break
        ip[i], ip[i + 1] = acc >> 8, acc & 0xFF
        i += 2
        s = s[off:]
        if s == "":
            break
        if s[0] != ":":
            raise _AddrError(text, "unexpected character, want colon", s)
        if len(s) == 1:
            raise _AddrError(text, "colon must be followed by more characters", s)
        s = s[1:]
        if s[0] == ":":
            if ellipsis >= 0:
                raise _AddrError(text, "multiple :: in address", s)
            ellipsis = i
            s = s[1:]
            if s == "":
                break
    if s:
        raise _AddrError(text, "trailing garbage after address", s)
    if i < 16:
        if ellipsis < 0:
            raise _AddrError(text, "address string too short")
        n = 16 - i
        ip = ip[:ellipsis] + [0] * n + ip[ellipsis:i]
    elif ellipsis >= 0:
        raise _AddrError(text, "the :: must expand to at least one field of zeros")
    return int.from_bytes(bytes(ip), "big"), zone


def _go_parse_addr(text: str) -> tuple[IP, str]:
    """netip.ParseAddr -> (address, zone); raises _AddrError."""
    for c in text:
        if c == ".":
            fields = _parse_ipv4_fields(text, text)
            return IP(int.from_bytes(bytes(fields), "big"), 4), ""
        if c == ":":
            value, zone = _parse_ipv6(text)
            return IP(value, 6), zone
        if c == "%":
            raise _AddrError(text, "missing IPv6 address")
    raise _AddrError(text, "unable to parse IP")


def _is_4in6(ip: IP) -> bool:
    return ip.version == 6 and ip.value >> 32 == 0xFFFF


def _checked_addr(text: str) -> IP:
    """The IP library's parseIPAddr: netip.ParseAddr, no zone, no IPv4-mapped IPv6."""
    try:
        ip, zone = _go_parse_addr(text)
    except _AddrError as err:
        raise CelEvalError(f"IP Address {go_quote(text)} parse error during conversion from string: {err}") from None
    if zone:
        raise CelEvalError(f"IP address {go_quote(text)} with zone value is not allowed")
    if _is_4in6(ip):
        raise CelEvalError(f"IPv4-mapped IPv6 address {go_quote(text)} is not allowed")
    return ip


def parse_ip(text: str) -> IP:
    return _checked_addr(text)


def _takes(parse: Callable[[str], object]) -> Callable[[str], bool]:
    """isIP, isCIDR: whether `parse` takes the text."""
    def check(text: str) -> bool:
        try:
            parse(text)
        except CelEvalError:
            return False
        return True

    return check


is_ip: Final = _takes(_checked_addr)


def ip_is_canonical(text: str) -> bool:
    return str(_checked_addr(text)) == text


# -- CIDR prefixes (netip.ParsePrefix) -----------------------------------------------------------


@dataclass(frozen=True)
class CIDR:
    ip: IP
    prefix_length: int
    cel_type_name: ClassVar[str] = "net.CIDR"

    def __str__(self) -> str:
        return f"{self.ip}/{self.prefix_length}"

    def _mask(self, value: int, bits: int) -> int:
        total = self.ip.bits
        return value >> (total - bits) << (total - bits) if bits else 0

    def masked(self) -> CIDR:
        return CIDR(IP(self._mask(self.ip.value, self.prefix_length), self.ip.version), self.prefix_length)

    def contains_ip(self, ip: IP) -> bool:
        return ip.version == self.ip.version and (
            self._mask(ip.value, self.prefix_length) == self._mask(self.ip.value, self.prefix_length)
        )

    def contains_cidr(self, other: CIDR) -> bool:
        # cidr.go: Masked() == PrefixFrom(other.Addr(), bits) (PrefixFrom does not mask), and bits <= other's.
        return (
            other.ip.version == self.ip.version
            and self.masked().ip.value == other.ip.value
            and self.prefix_length <= other.prefix_length
        )


def _go_parse_prefix(text: str) -> CIDR:
    def error(msg: str) -> CelEvalError:
        return CelEvalError(
            "network address parse error during conversion from string: "
            f"netip.ParsePrefix({go_quote(text)}): {msg}"
        )

    slash = text.rfind("/")
    if slash < 0:
        raise error("no '/'")
    try:
        ip, zone = _go_parse_addr(text[:slash])
    except _AddrError as err:
        raise error(str(err)) from None
    if ip.version == 6 and zone:
        raise error("IPv6 zones cannot be present in a prefix")
    bits_text = text[slash + 1 :]
    if (len(bits_text) > 1 and not ("1" <= bits_text[0] <= "9")) or re.fullmatch(r"[+-]?[0-9]+", bits_text) is None:
        raise error(f"bad bits after slash: {go_quote(bits_text)}")
    bits = int(bits_text)
    if bits < 0 or bits > ip.bits:
        raise error("prefix length out of range")
    if _is_4in6(ip):
        raise CelEvalError(
            "network address parse error during conversion from string: "
            f"IPv4-mapped IPv6 address {go_quote(text)} is not allowed"
        )
    return CIDR(ip, bits)


def parse_cidr(text: str) -> CIDR:
    try:
        return _go_parse_prefix(text)
    except CelEvalError as err:
        raise CelEvalError(f"network address parse error during conversion from string: {err}") from None


is_cidr: Final = _takes(_go_parse_prefix)


# -- URLs (net/url) ------------------------------------------------------------------------------

_ENCODE_PATH: Final = "path"
_ENCODE_HOST: Final = "host"
_ENCODE_USER: Final = "user"
_ENCODE_QUERY: Final = "query"


class _URLError(Exception):
    pass


def _should_escape(c: str, mode: str) -> bool:
    if c.isascii() and c.isalnum():
        return False
    if mode == _ENCODE_HOST and c in "!$&'()*+,;=:[]<>\"":
        return False
    if c in "-_.~":
        return False
    if c in "$&+,/:;=?@":
        if mode == _ENCODE_PATH:
            return c == "?"
        if mode == _ENCODE_USER:
            return c in "@/?:"
        if mode == _ENCODE_QUERY:
            return True
    return True


def _is_hex(c: str) -> bool:
    return c in "0123456789abcdefABCDEF"


def _unescape(s: str, mode: str) -> str:
    raw = s.encode("utf-8")
    out = bytearray()
    i = 0
    while i < len(raw):
        b = raw[i]
        if b == 0x25:  # %
            if i + 2 >= len(raw) or not _is_hex(chr(raw[i + 1])) or not _is_hex(chr(raw[i + 2])):
                bad = raw[i : i + 3].decode("utf-8", errors="replace")
                raise _URLError(f"invalid URL escape {go_quote(bad)}")
            if mode == _ENCODE_HOST and int(chr(raw[i + 1]), 16) < 8 and raw[i : i + 3] != b"%25":
                raise _URLError(f"invalid URL escape {go_quote(raw[i : i + 3].decode())}")
            out.append(int(raw[i + 1 : i + 3].decode(), 16))
            i += 3
        elif b == 0x2B and mode == _ENCODE_QUERY:  # +
            out.append(0x20)
            i += 1
        else:
            if mode == _ENCODE_HOST and b < 0x80 and _should_escape(chr(b), mode):
                raise _URLError(f"invalid character {go_quote(chr(b))} in host name")
            out.append(b)
            i += 1
    return out.decode("utf-8", errors="replace")


def _escape(s: str, mode: str) -> str:
    out = []
    for b in s.encode("utf-8"):
        c = chr(b)
        if b < 0x80 and not _should_escape(c, mode):
            out.append(c)
        else:
            out.append(f"%{b:02X}")
    return "".join(out)


def _valid_encoded(s: str) -> bool:
    for c in s:
        if c in "!$&'()*+,;=:@[]%":
            continue
        if _should_escape(c, _ENCODE_PATH):
            return False
    return True


def _valid_optional_port(port: str) -> bool:
    if port == "":
        return True
    return port[0] == ":" and all("0" <= c <= "9" for c in port[1:])


def _valid_userinfo(s: str) -> bool:
    return all((c.isascii() and c.isalnum()) or c in "-._:~!$&'()*+,;=%@" for c in s)


@dataclass(frozen=True)
class URL:
    scheme: str
    opaque: str
    userinfo: str | None
    host: str
    path: str
    raw_path: str
    raw_query: str
    fragment: str
    cel_type_name: ClassVar[str] = "kubernetes.URL"

    def hostname(self) -> str:
        return _split_host_port(self.host)[0]

    def port(self) -> str:
        return _split_host_port(self.host)[1]

    def escaped_path(self) -> str:
        if self.raw_path and _valid_encoded(self.raw_path):
            try:
                if _unescape(self.raw_path, _ENCODE_PATH) == self.path:
                    return self.raw_path
            except _URLError:
                pass
        if self.path == "*":
            return "*"
        return _escape(self.path, _ENCODE_PATH)

    def query(self) -> dict[str, list[str]]:
        """url.Values from the raw query (ParseQuery, errors dropped as Query() drops them)."""
        out: dict[str, list[str]] = {}
        remainder = self.raw_query
        while remainder:
            key, _, remainder = remainder.partition("&")
            if ";" in key or key == "":
                continue
            k, _, v = key.partition("=")
            try:
                k, v = _unescape(k, _ENCODE_QUERY), _unescape(v, _ENCODE_QUERY)
            except _URLError:
                continue
            out.setdefault(k, []).append(v)
        return out


def _split_host_port(host_port: str) -> tuple[str, str]:
    host, port = host_port, ""
    colon = host.rfind(":")
    if colon != -1 and _valid_optional_port(host[colon:]):
        host, port = host[:colon], host[colon + 1 :]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def _get_scheme(raw: str) -> tuple[str, str]:
    for i, c in enumerate(raw):
        if c.isascii() and c.isalpha():
            continue
        if c.isascii() and (c.isdigit() or c in "+-."):
            if i == 0:
                return "", raw
            continue
        if c == ":":
            if i == 0:
                raise _URLError("missing protocol scheme")
            return raw[:i], raw[i + 1 :]
        return "", raw
    return "", raw


def _parse_host(host: str) -> str:
    if host.startswith("["):
        i = host.rfind("]")
        if i < 0:
            raise _URLError("missing ']' in host")
        colon_port = host[i + 1 :]
        if not _valid_optional_port(colon_port):
            raise _URLError(f"invalid port {go_quote(colon_port)} after host")
        zone = host[:i].find("%25")
        if zone >= 0:
            return _unescape(host[:zone], _ENCODE_HOST) + _unescape(host[zone:i], "zone") + _unescape(
                host[i:], _ENCODE_HOST
            )
    else:
        i = host.rfind(":")
        if i != -1:
            colon_port = host[i:]
            if not _valid_optional_port(colon_port):
                raise _URLError(f"invalid port {go_quote(colon_port)} after host")
    return _unescape(host, _ENCODE_HOST)


def _go_parse(raw: str, via_request: bool) -> URL:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        raise _URLError("net/url: invalid control character in URL")
    if raw == "" and via_request:
        raise _URLError("empty url")
    if raw == "*":
        return URL("", "", None, "", "*", "", "", "")
    scheme, remainder = _get_scheme(raw)
    scheme = scheme.lower()
    raw_query = ""
    if remainder.endswith("?") and remainder.count("?") == 1:
        remainder = remainder[:-1]
    else:
        remainder, _, raw_query = remainder.partition("?")
    if not remainder.startswith("/"):
        if scheme:
            return URL(scheme, remainder, None, "", "", "", raw_query, "")
        if via_request:
            raise _URLError("invalid URI for request")
        segment = remainder.partition("/")[0]
        if ":" in segment:
            raise _URLError("first path segment in URL cannot contain colon")
    userinfo: str | None = None
    host = ""
    if (scheme or (not via_request and not remainder.startswith("///"))) and remainder.startswith("//"):
        authority, remainder = remainder[2:], ""
        slash = authority.find("/")
        if slash >= 0:
            authority, remainder = authority[:slash], authority[slash:]
        at = authority.rfind("@")
        host = _parse_host(authority[at + 1 :] if at >= 0 else authority)
        if at >= 0:
            userinfo = authority[:at]
            if not _valid_userinfo(userinfo):
                raise _URLError("net/url: invalid userinfo")
            user, _, password = userinfo.partition(":")
            _unescape(user, _ENCODE_USER)
            _unescape(password, _ENCODE_USER)
    path = _unescape(remainder, _ENCODE_PATH)
    raw_path = "" if _escape(path, _ENCODE_PATH) == remainder else remainder
    return URL(scheme, "", userinfo, host, path, raw_path, raw_query, "")


def _parse_error(raw: str, err: _URLError) -> CelEvalError:
    return CelEvalError(f"URL parse error during conversion from string: parse {go_quote(raw)}: {err}")


def is_request_uri(raw: str) -> bool:
    return request_uri_problem(raw) is None


def request_uri_problem(raw: str) -> str | None:
    """url.ParseRequestURI's error text, or None."""
    try:
        _go_parse(raw, True)
    except _URLError as err:
        return f"parse {go_quote(raw)}: {err}"
    return None


def parse_url(raw: str) -> URL:
    """url(): ParseRequestURI decides validity; Parse (which splits off the fragment) gives the parts."""
    try:
        _go_parse(raw, True)
        without_fragment, _, fragment = raw.partition("#")
        parsed = _go_parse(without_fragment, False)
    except _URLError as err:
        raise _parse_error(raw, err) from None
    return URL(parsed.scheme, parsed.opaque, parsed.userinfo, parsed.host, parsed.path, parsed.raw_path,
               parsed.raw_query, fragment)


# -- the format library --------------------------------------------------------------------------


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    """k8s.io/apimachinery/pkg/util/validation RegexError."""
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    text = msg + " (e.g. "
    for i, example in enumerate(examples):
        if i > 0:
            text += " or "
        text += f"'{example}', "
    return text + f"regex used for validation is '{fmt}')"


_DNS1123_LABEL_FMT: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT: Final = _DNS1123_LABEL_FMT + "(\\." + _DNS1123_LABEL_FMT + ")*"
_DNS1035_LABEL_FMT: Final = "[a-z]([-a-z0-9]*[a-z0-9])?"
_QUALIFIED_NAME_FMT: Final = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE_FMT: Final = "(" + _QUALIFIED_NAME_FMT + ")?"
_DNS1123_LABEL_MSG: Final = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    "end with an alphanumeric character"
)
_DNS1123_SUBDOMAIN_MSG: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character"
)
_DNS1035_LABEL_MSG: Final = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
    "character, and end with an alphanumeric character"
)
_QUALIFIED_NAME_MSG: Final = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
    "character"
)
_LABEL_VALUE_MSG: Final = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
    "start and end with an alphanumeric character"
)


def _full(fmt: str) -> Callable[[str], bool]:
    pattern = re.compile(fmt)
    return lambda s: pattern.fullmatch(s) is not None


_is_subdomain: Final = _full(_DNS1123_SUBDOMAIN_FMT)
_is_qualified_part: Final = _full(_QUALIFIED_NAME_FMT)


def _max_len(n: int) -> str:
    return f"must be no more than {n} characters"


def _name_rule(
    limit: int, fmt: str, message: str, *examples: str, dotted: str | None = None
) -> Callable[[str], list[str]]:
    """apimachinery's IsDNS1123Label and kin: at most `limit` characters, matching `fmt`; a name that fails `fmt`
    but is a DNS subdomain gets `dotted` as its error where given."""
    matches = _full(fmt)

    def check(s: str) -> list[str]:
        errs = [_max_len(limit)] if len(s) > limit else []
        if not matches(s):
            near = dotted is not None and _is_subdomain(s)
            errs.append(dotted if near and dotted is not None else _regex_error(message, fmt, *examples))
        return errs

    return check


_dns1123_label: Final = _name_rule(
    63, _DNS1123_LABEL_FMT, _DNS1123_LABEL_MSG, "my-name", "123-abc", dotted="must not contain dots"
)
_dns1123_subdomain: Final = _name_rule(253, _DNS1123_SUBDOMAIN_FMT, _DNS1123_SUBDOMAIN_MSG, "example.com")
_dns1035_label: Final = _name_rule(63, _DNS1035_LABEL_FMT, _DNS1035_LABEL_MSG, "my-name", "abc-123")
_label_value: Final = _name_rule(63, _LABEL_VALUE_FMT, _LABEL_VALUE_MSG, "MyValue", "my_value", "12345")


def _qualified_name(s: str) -> list[str]:
    errs: list[str] = []
    parts = s.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if prefix == "":
            errs.append("prefix part must be non-empty")
        else:
            errs.extend("prefix part " + m for m in _dns1123_subdomain(prefix))
    else:
        return [
            "a qualified name "
            + _regex_error(_QUALIFIED_NAME_MSG, _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if name == "":
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part " + _max_len(63))
    if not _is_qualified_part(name):
        example = _regex_error(_QUALIFIED_NAME_MSG, _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
        errs.append("name part " + example)
    return errs


def _mask_trailing_dash(s: str) -> str:
    """apimachinery's NameIs* with prefix=true: a generateName prefix may end in '-'."""
    return s[:-1] + "a" if len(s) > 1 and s.endswith("-") else s


def _uri(s: str) -> list[str]:
    problem = request_uri_problem(s)
    return [problem] if problem else []


_UUID: Final = re.compile(r"(?i)[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}")
_BASE64: Final = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})")
_TIME_OF_DAY: Final = re.compile(r"([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))")


def _is_date(s: str) -> bool:
    """time.Parse("2006-01-02", s)."""
    m = re.fullmatch(r"([0-9]{4})-([0-9]{2})-([0-9]{2})", s)
    if m is None:
        return False
    year, month, day = (int(g) for g in m.groups())
    if not 1 <= month <= 12:
        return False
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    days = (31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)[month - 1]
    return 1 <= day <= days


def _is_datetime(s: str) -> bool:
    """kube-openapi strfmt IsDateTime."""
    if len(s) < 4:
        return False
    parts = s.lower().split("t")
    if len(parts) < 2 or not _is_date(parts[0]):
        return False
    m = _TIME_OF_DAY.fullmatch(parts[1])
    if m is None:
        return False
    return m.group(1) <= "23" and m.group(2) <= "59" and m.group(3) <= "59"


def _when(ok: Callable[[str], bool], message: str) -> Callable[[str], list[str]]:
    return lambda s: [] if ok(s) else [message]


@dataclass(frozen=True, eq=False)
class NamedFormat:
    name: str  # the Go Format.Name (equality compares it)
    validate: Callable[[str], list[str]]
    cel_type_name: ClassVar[str] = "kubernetes.NamedFormat"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NamedFormat) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)


FORMATS: Final[dict[str, NamedFormat]] = {
    "dns1123Label": NamedFormat("DNS1123Label", _dns1123_label),
    "dns1123Subdomain": NamedFormat("DNS1123Subdomain", _dns1123_subdomain),
    "dns1035Label": NamedFormat("DNS1035Label", _dns1035_label),
    "qualifiedName": NamedFormat("QualifiedName", _qualified_name),
    "dns1123LabelPrefix": NamedFormat("DNS1123LabelPrefix", lambda s: _dns1123_label(_mask_trailing_dash(s))),
    "dns1123SubdomainPrefix": NamedFormat(
        "DNS1123SubdomainPrefix", lambda s: _dns1123_subdomain(_mask_trailing_dash(s))
    ),
    "dns1035LabelPrefix": NamedFormat("DNS1035LabelPrefix", lambda s: _dns1035_label(_mask_trailing_dash(s))),
    "labelValue": NamedFormat("LabelValue", _label_value),
    "uri": NamedFormat("URI", _uri),
    "uuid": NamedFormat("uuid", _when(lambda s: _UUID.fullmatch(s) is not None, "does not match the UUID format")),
    "byte": NamedFormat("byte", _when(lambda s: _BASE64.fullmatch(s) is not None, "invalid base64")),
    "date": NamedFormat("date", _when(_is_date, "invalid date")),
    "datetime": NamedFormat("datetime", _when(_is_datetime, "invalid datetime")),
}
