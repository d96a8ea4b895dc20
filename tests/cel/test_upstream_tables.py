# ruff: noqa: RUF001  (upstream cases test non-ASCII strings on purpose)
"""Differential tables: expressions and verdicts taken from upstream's own CEL tests (facts, not code), run
through the product's DRA CEL environment. Each table names the upstream file it comes from.

A verdict is True / False (the selector's result), "COMPILE:<fragment>" (a compile error containing the
fragment), "RUNTIME:<fragment>" (an evaluation error containing it) or "<fragment>" (an error of either
kind: cel-go's extension tests do not say which). Cases of the cel-go extension tests that do
not apply to Kubernetes are left out, as listed at each table: Kubernetes' base environment turns on
HomogeneousAggregateLiterals (`[1, "a"]` is a compile error) and a DRA selector must be a bool.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from dra_driver.cel import CelCompileError, CelRuntimeError, DeviceInput, DraCelEnvironment
from dra_driver.cel.environment import AttributeValue
from dra_driver.k8s.quantity import Quantity, parse_quantity
from dra_driver.k8s.semver import parse_semver

Verdict = bool | str
NEWEST = DraCelEnvironment(kubernetes_minor=37)
OLDEST = DraCelEnvironment(kubernetes_minor=34)
NOTHING = DeviceInput(driver="dra.example.com")


def verdict(env: DraCelEnvironment, expression: str, device: DeviceInput = NOTHING) -> Verdict:
    try:
        selector = env.compile(expression)
    except CelCompileError as err:
        return "COMPILE:" + err.reason
    try:
        return selector.matches(device)
    except CelRuntimeError as err:
        return err.reason


def check(got: Verdict, expected: Verdict) -> None:
    if isinstance(expected, bool):
        assert got is expected
        return
    assert isinstance(got, str), got
    if expected.startswith("COMPILE:"):
        assert got.startswith("COMPILE:") and expected.removeprefix("COMPILE:") in got, got
    elif expected.startswith("RUNTIME:"):
        assert not got.startswith("COMPILE:") and expected.removeprefix("RUNTIME:") in got, got
    else:
        assert expected in got, got


# cel-go v0.26.0 ext/strings_test.go `stringTests` (the cel-go release Kubernetes 1.34-1.36 build with).
# Kubernetes declares ext.Strings version 2, so `<string>.reverse()` (version 3) is a compile error here.
STRINGS: list[tuple[str, Verdict]] = [
    ("'tacocat'.charAt(3) == 'o'", True),
    ("'tacocat'.charAt(7) == ''", True),
    ("'©αT'.charAt(0) == '©' && '©αT'.charAt(1) == 'α' && '©αT'.charAt(2) == 'T'", True),
    ("'tacocat'.indexOf('') == 0", True),
    ("'tacocat'.indexOf('ac') == 1", True),
    ("'tacocat'.indexOf('none') == -1", True),
    ("'tacocat'.indexOf('', 3) == 3", True),
    ("'tacocat'.indexOf('a', 3) == 5", True),
    ("'tacocat'.indexOf('at', 3) == 5", True),
    ("'ta©o©αT'.indexOf('©') == 2", True),
    ("'ta©o©αT'.indexOf('©', 3) == 4", True),
    ("'ta©o©αT'.indexOf('©αT', 3) == 4", True),
    ("'ta©o©αT'.indexOf('©α', 5) == -1", True),
    ("'ijk'.indexOf('k') == 2", True),
    ("'hello wello'.indexOf('hello wello') == 0", True),
    ("'hello wello'.indexOf('ello', 6) == 7", True),
    ("'hello wello'.indexOf('elbo room!!') == -1", True),
    ("'hello wello'.indexOf('elbo room!!!') == -1", True),
    ("''.lastIndexOf('@@') == -1", True),
    ("'tacocat'.lastIndexOf('') == 7", True),
    ("'tacocat'.lastIndexOf('at') == 5", True),
    ("'tacocat'.lastIndexOf('none') == -1", True),
    ("'tacocat'.lastIndexOf('', 3) == 3", True),
    ("'tacocat'.lastIndexOf('a', 3) == 1", True),
    ("'ta©o©αT'.lastIndexOf('©') == 4", True),
    ("'ta©o©αT'.lastIndexOf('©', 3) == 2", True),
    ("'ta©o©αT'.lastIndexOf('©α', 4) == 4", True),
    ("'hello wello'.lastIndexOf('ello', 6) == 1", True),
    ("'hello wello'.lastIndexOf('low') == -1", True),
    ("'hello wello'.lastIndexOf('elbo room!!') == -1", True),
    ("'hello wello'.lastIndexOf('elbo room!!!') == -1", True),
    ("'hello wello'.lastIndexOf('hello wello') == 0", True),
    ("'bananananana'.lastIndexOf('nana', 7) == 6", True),
    ("'TacoCat'.lowerAscii() == 'tacocat'", True),
    ("'TacoCÆt'.lowerAscii() == 'tacocÆt'", True),
    ("'TacoCÆt Xii'.lowerAscii() == 'tacocÆt xii'", True),
    ('"12 days 12 hours".replace("{0}", "2") == "12 days 12 hours"', True),
    ('"{0} days {0} hours".replace("{0}", "2") == "2 days 2 hours"', True),
    ('"{0} days {0} hours".replace("{0}", "2", 1).replace("{0}", "23") == "2 days 23 hours"', True),
    ('"1 ©αT taco".replace("αT", "o©α") == "1 ©o©α taco"', True),
    ('"hello hello".replace("", "_") == "_h_e_l_l_o_ _h_e_l_l_o_"', True),
    ('"hello hello".replace("h", "") == "ello ello"', True),
    ('"hello world".split(" ") == ["hello", "world"]', True),
    ('"hello world events!".split(" ", 0) == []', True),
    ('"hello world events!".split(" ", 1) == ["hello world events!"]', True),
    ('"o©o©o©o".split("©", -1) == ["o", "o", "o", "o"]', True),
    ('"tacocat".substring(4) == "cat"', True),
    ('"tacocat".substring(7) == ""', True),
    ('"tacocat".substring(0, 4) == "taco"', True),
    ('"tacocat".substring(4, 4) == ""', True),
    ('\'ta©o©αT\'.substring(2, 6) == "©o©α"', True),
    ('\'ta©o©αT\'.substring(7, 7) == ""', True),
    ('" \\f\\n\\r\\t\\vtext  ".trim() == "text"', True),
    ('"\\u0085\\u00a0\\u1680text".trim() == "text"', True),
    ('"text\\u2000\\u2001\\u2002\\u2003\\u2004\\u2004\\u2006\\u2007\\u2008\\u2009".trim() == "text"', True),
    ('"\\u200atext\\u2028\\u2029\\u202F\\u205F\\u3000".trim() == "text"', True),
    ('"\\u180etext\\u200b\\u200c\\u200d\\u2060\\ufeff".trim()\n\t\t\t\t== "\\u180etext\\u200b\\u200c\\u200d\\u2060\\ufeff"', True),
    ("'tacoCat'.upperAscii() == 'TACOCAT'", True),
    ("'tacoCαt'.upperAscii() == 'TACOCαT'", True),
    ("'gums'.reverse() == 'smug'", "COMPILE:found no matching overload for 'reverse'"),
    ("'palindromes'.reverse() == 'semordnilap'", "COMPILE:found no matching overload for 'reverse'"),
    ("'John Smith'.reverse() == 'htimS nhoJ'", "COMPILE:found no matching overload for 'reverse'"),
    ("'u180etext'.reverse() == 'txete081u'", "COMPILE:found no matching overload for 'reverse'"),
    ("'2600+U'.reverse() == 'U+0062'", "COMPILE:found no matching overload for 'reverse'"),
    ("'\\u180e\\u200b\\u200c\\u200d\\u2060\\ufeff'.reverse() == '\\ufeff\\u2060\\u200d\\u200c\\u200b\\u180e'", "COMPILE:found no matching overload for 'reverse'"),
    ("['x', 'y'].join() == 'xy'", True),
    ("['x', 'y'].join('-') == 'x-y'", True),
    ("[].join() == ''", True),
    ("[].join('-') == ''", True),
    ('strings.quote("first\\nsecond") == "\\"first\\\\nsecond\\""', True),
    ('strings.quote("bell\\a") == "\\"bell\\\\a\\""', True),
    ('strings.quote("\\bbackspace") == "\\"\\\\bbackspace\\""', True),
    ('strings.quote("\\fform feed") == "\\"\\\\fform feed\\""', True),
    ('strings.quote("carriage \\r return") == "\\"carriage \\\\r return\\""', True),
    ('strings.quote("horizontal tab\\t") == "\\"horizontal tab\\\\t\\""', True),
    ('strings.quote("vertical \\v tab") == "\\"vertical \\\\v tab\\""', True),
    ('strings.quote("double \\\\\\\\ slash") == "\\"double \\\\\\\\\\\\\\\\ slash\\""', True),
    ('strings.quote("two escape sequences \\a\\n") == "\\"two escape sequences \\\\a\\\\n\\""', True),
    ('strings.quote("verbatim") == "\\"verbatim\\""', True),
    ('strings.quote("ends with \\\\") == "\\"ends with \\\\\\\\\\""', True),
    ('strings.quote("\\\\ starts with") == "\\"\\\\\\\\ starts with\\""', True),
    ('strings.quote("printable unicode😀") == "\\"printable unicode😀\\""', True),
    ('strings.quote("mid string \\" quote") == "\\"mid string \\\\\\" quote\\""', True),
    ('strings.quote(\'single-quote with "double quote"\') == "\\"single-quote with \\\\\\"double quote\\\\\\"\\""', True),
    ('strings.quote("size(\'ÿ\')") == "\\"size(\'ÿ\')\\""', True),
    ('strings.quote("size(\'πέντε\')") == "\\"size(\'πέντε\')\\""', True),
    ('strings.quote("завтра") == "\\"завтра\\""', True),
    ('strings.quote("\\U0001F431\\U0001F600\\U0001F61B") == "\\"\\U0001F431\\U0001F600\\U0001F61B\\""', True),
    ('strings.quote("ta©o©αT") == "\\"ta©o©αT\\""', True),
    ('strings.quote("") == "\\"\\""', True),
    ('strings.quote(\'%s %s\').format([\'hello\', \'world\']) == "\\"hello world\\""', True),
    ("'tacocat'.charAt(30) == ''", 'index out of range: 30'),
    ("'tacocat'.indexOf('a', 30) == -1", True),
    ("'tacocat'.lastIndexOf('a', -1) == -1", 'index out of range: -1'),
    ("'tacocat'.lastIndexOf('a', 30) == -1", True),
    ('"tacocat".substring(40) == "cat"', 'index out of range: 40'),
    ('"tacocat".substring(-1) == "cat"', 'index out of range: -1'),
    ('"tacocat".substring(1, 50) == "cat"', 'index out of range: 50'),
    ('"tacocat".substring(49, 50) == "cat"', 'index out of range: 49'),
    ('"tacocat".substring(4, 3) == ""', 'invalid substring range. start: 4, end: 3'),
]

# cel-go v0.26.0 ext/lists_test.go (ext.Lists, version 3 from Kubernetes 1.34) and ext/comprehensions_test.go
# (two-variable comprehensions, 1.32). Left out: 26 cases whose result is not a bool, that mix element types
# in one literal, that use the test's ExampleType message, or `<string>.reverse()`.
LISTS_AND_COMPREHENSIONS: list[tuple[str, Verdict]] = [
    ('lists.range(4) == [0,1,2,3]', True),
    ('lists.range(0) == []', True),
    ('[5,1,2,3].reverse() == [3,2,1,5]', True),
    ('[].reverse() == []', True),
    ('[1].reverse() == [1]', True),
    ("['are', 'you', 'as', 'bored', 'as', 'I', 'am'].reverse() == ['am', 'I', 'as', 'bored', 'as', 'you', 'are']", True),
    ('[false, true, true].reverse().reverse() == [false, true, true]', True),
    ('[1,2,3,4].slice(0, 4) == [1,2,3,4]', True),
    ('[1,2,3,4].slice(0, 0) == []', True),
    ('[1,2,3,4].slice(1, 1) == []', True),
    ('[1,2,3,4].slice(4, 4) == []', True),
    ('[1,2,3,4].slice(1, 3) == [2, 3]', True),
    ('dyn([]).flatten() == []', True),
    ('dyn([1,2,3,4]).flatten() == [1,2,3,4]', True),
    ('[].sort() == []', True),
    ('[1].sort() == [1]', True),
    ('[4, 3, 2, 1].sort() == [1, 2, 3, 4]', True),
    ('["d", "a", "b", "c"].sort() == ["a", "b", "c", "d"]', True),
    ('[].sortBy(e, e) == []', True),
    ('["a"].sortBy(e, e) == ["a"]', True),
    ('[-3, 1, -5, -2, 4].sortBy(e, -(e * e)) == [-5, 4, -3, -2, 1]', True),
    ('[-3, 1, -5, -2, 4].map(e, e * 2).sortBy(e, -(e * e)) == [-10, 8, -6, -4, 2]', True),
    ('lists.range(3).sortBy(e, -e) == [2, 1, 0]', True),
    ('["a", "c", "b", "first"].sortBy(e, e == "first" ? "" : e) == ["first", "a", "b", "c"]', True),
    ('[].distinct() == []', True),
    ('[1].distinct() == [1]', True),
    ('[-2, 5, -2, 1, 1, 5, -2, 1].distinct() == [-2, 5, 1]', True),
    ("['c', 'a', 'a', 'b', 'a', 'b', 'c', 'c'].distinct() == ['c', 'a', 'b']", True),
    ('[[1], [1], [2]].distinct() == [[1], [2]]', True),
    ('[1, 2, 3, 4].all(i, v, i < 5 && v > 0)', True),
    ('[1, 2, 3, 4].all(i, v, i < v)', True),
    ('[1, 2, 3, 4].all(i, v, i > v) == false', True),
    ('\n\t\tcel.bind(listA, [1, 2, 3, 4],\n\t\tcel.bind(listB, [1, 2, 3, 4, 5],\n\t\t   listA.all(i, v, listB[?i].hasValue() && listB[i] == v)\n\t\t))\n\t\t', True),
    ('\n\t\tcel.bind(listA, [1, 2, 3, 4, 5, 6],\n\t\tcel.bind(listB, [1, 2, 3, 4, 5],\n\t\t   listA.all(i, v, listB[?i].hasValue() && listB[i] == v)\n\t\t)) == false\n\t\t', True),
    ("\n\t\tcel.bind(l, ['hello', 'world', 'hello!', 'worlds'],\n\t\t  l.exists(i, v,\n\t\t    v.startsWith('hello') && l[?(i+1)].optMap(next, next.endsWith('world')).orValue(false)\n\t\t  )\n\t\t)\n\t\t", True),
    ("\n\t\tcel.bind(l, ['hello', 'world', 'hello!', 'worlds'],\n\t\t  l.existsOne(i, v,\n\t\t    v.startsWith('hello') && l[?(i+1)].optMap(next, next.endsWith('world')).orValue(false)\n\t\t  )\n\t\t)\n\t\t", True),
    ('\n\t\tcel.bind(l, [\'hello\', \'goodbye\', \'hello!\', \'goodbye\'],\n\t\t  l.exists_one(i, v,\n\t\t    v.startsWith(\'hello\') && l[?(i+1)].optMap(next, next == "goodbye").orValue(false)\n\t\t  )\n\t\t) == false\n\t\t', True),
    ('\n\t\t[1, 2, 3].transformList(indexVar, valueVar, (indexVar * valueVar) + valueVar) == [1, 4, 9]\n\t\t', True),
    ('\n\t\t[1, 2, 3].transformList(indexVar, valueVar, indexVar % 2 == 0, (indexVar * valueVar) + valueVar) == [1, 9]\n\t\t', True),
    ("\n\t\t['Hello', 'world'].transformMap(i, v, [v.lowerAscii()]) == {0: ['hello'], 1: ['world']}\n\t\t", True),
    ("\n\t\t// round-tripping example\n\t\t['world', 'Hello'].transformMap(i, v, [v.lowerAscii()])\n\t\t  .transformList(k, v, v) // extract the list back form the map\n\t\t  .flatten()\n\t\t  .sort() == ['hello', 'world']\n\t\t", True),
    ('\n\t\t[1, 2, 3].transformMap(indexVar, valueVar,\n\t      (indexVar * valueVar) + valueVar) == {0: 1, 1: 4, 2: 9}\n        ', True),
    ('\n\t\t[1, 2, 3].transformMap(indexVar, valueVar, indexVar % 2 == 0,\n\t  \t  (indexVar * valueVar) + valueVar) == {0: 1, 2: 9}\n\t\t', True),
    ('\n\t\t"key1:value1 key2:value2 key3:value3".split(" ")\n\t\t.transformMapEntry(i, v,\n\t\t  cel.bind(entry, v.split(":"),\n\t\t    entry.size() == 2 ? {entry[0]: entry[1]} : {}\n\t\t  )\n\t\t) == {\'key1\': \'value1\', \'key2\': \'value2\', \'key3\': \'value3\'}\n\t\t', True),
    ('\n\t\t"key1:value1:extra key2:value2 key3".split(" ")\n\t\t.transformMapEntry(i, v,\n\t\t  cel.bind(entry, v.split(":"), {?entry[0]: entry[?1]})\n\t\t) == {\'key1\': \'value1\', \'key2\': \'value2\'}\n\t\t', True),
    ("\n\t\t{'hello': 'world', 'hello!': 'world'}.all(k, v, k.startsWith('hello') && v == 'world')\n\t\t", True),
    ("\n\t\t{'hello': 'world', 'hello!': 'worlds'}.all(k, v, k.startsWith('hello') && v.endsWith('world')) == false\n\t\t", True),
    ("\n\t\t{'hello': 'world', 'hello!': 'worlds'}.exists(k, v, k.startsWith('hello') && v.endsWith('world'))\n\t\t", True),
    ("\n\t\t{'hello': 'world', 'hello!': 'worlds'}.existsOne(k, v, k.startsWith('hello') && v.endsWith('world'))\n\t\t", True),
    ("\n\t\t{'hello': 'world', 'hello!': 'worlds'}.exists_one(k, v, k.startsWith('hello') && v.endsWith('world'))\n\t\t", True),
    ("\n\t\t{'hello': 'world', 'hello!': 'wow, world'}.exists_one(k, v, k.startsWith('hello') && v.endsWith('world')) == false\n\t\t", True),
    ('\n\t\t{\'Hello\': \'world\'}.transformList(k, v, "%s=%s".format([k.lowerAscii(), v])) == ["hello=world"]\n\t\t', True),
    ('\n\t\tdyn({\'Hello\': \'world\'}).transformList(k, v, "%s=%s".format([k.lowerAscii(), v])) == ["hello=world"]\n\t\t', True),
    ('\n\t\t{\'hello\': \'world\'}.transformList(k, v, k.startsWith(\'greeting\'), "%s=%s".format([k, v])) == []\n\t\t', True),
    ("\n\t\t{'greeting': 'hello', 'farewell': 'goodbye'}\n\t\t  .transformList(k, _, k).sort() == ['farewell', 'greeting']\n\t\t", True),
    ("\n\t\t{'greeting': 'hello', 'farewell': 'goodbye'}\n\t\t  .transformList(_, v, v).sort() == ['goodbye', 'hello']\n\t\t", True),
    ('\n\t\t{\'hello\': \'world\', \'goodbye\': \'cruel world\'}.transformMap(k, v, "%s, %s!".format([k, v]))\n\t\t   == {\'hello\': \'hello, world!\', \'goodbye\': \'goodbye, cruel world!\'}\n\t\t', True),
    ('\n\t\tdyn({\'hello\': \'world\', \'goodbye\': \'cruel world\'}).transformMap(k, v, "%s, %s!".format([k, v]))\n\t\t   == {\'hello\': \'hello, world!\', \'goodbye\': \'goodbye, cruel world!\'}\n\t\t', True),
    ('\n\t\t{\'hello\': \'world\', \'goodbye\': \'cruel world\'}.transformMap(k, v, v.startsWith(\'world\'), "%s, %s!".format([k, v]))\n\t\t   == {\'hello\': \'hello, world!\'}\n\t\t', True),
    ("\n\t\t{'hello': 'world', 'greetings': 'tacocat'}.transformMapEntry(k, v, {}) == {}\n\t\t", True),
    ('[].all(i, i, i < i)', 'duplicate variable name: i'),
    ('[].all(__result__, i, __result__ < i)', 'iteration variable overwrites accumulator variable'),
    ('[].all(j, __result__, __result__ < j)', 'iteration variable overwrites accumulator variable'),
    ('[].all(i.j, k, i.j < k)', 'argument must be a simple name'),
    ('[].all(j, i.k, j < i.k)', 'argument must be a simple name'),
    ('1.all(j, k, j < k)', 'cannot be range'),
    ('[].exists(i.j, k, i.j < k)', 'argument must be a simple name'),
    ('[].exists(j, i.k, j < i.k)', 'argument must be a simple name'),
    ("''.exists(j, k, j < k)", 'cannot be range'),
    ('[].exists_one(i.j, k, i.j < k)', 'argument must be a simple name'),
    ('[].existsOne(j, i.k, j < i.k)', 'argument must be a simple name'),
    ('[].exists_one(i.j, k, i.j < k)', 'argument must be a simple name'),
    ("''.existsOne(j, k, j < k)", 'cannot be range'),
    ('[].transformList(i.j, k, i.j + k)', 'argument must be a simple name'),
    ('[].transformList(j, i.k, j + i.k)', 'argument must be a simple name'),
    ('{}.transformMap(i.j, k, i.j + k)', 'argument must be a simple name'),
    ('{}.transformMap(j, i.k, j + i.k)', 'argument must be a simple name'),
    ('{}.transformMapEntry(j, i.k, {j: i.k})', 'argument must be a simple name'),
    ('{}.transformMapEntry(i.j, k, {k: i.j})', 'argument must be a simple name'),
    ('[1, 2].transformList(i, v, v % 2 == 0 ? [v] : v)', 'no matching overload'),
]


@pytest.mark.parametrize(("expression", "expected"), STRINGS)
def test_strings_extension(expression: str, expected: Verdict) -> None:
    check(verdict(NEWEST, expression), expected)


@pytest.mark.parametrize(("expression", "expected"), LISTS_AND_COMPREHENSIONS)
def test_lists_extension_and_two_variable_comprehensions(expression: str, expected: Verdict) -> None:
    check(verdict(NEWEST, expression), expected)


# k8s.io/dynamic-resource-allocation/cel/compile_test.go `testcases` (release-1.34 .. master): expression,
# driver, attributes, capacity, verdict, worst-case cost (expectCost; 0 where the case has none). The
# list-typed attribute cases (1.36+, DRAListTypeAttributes) are not here: the product hides list attributes.
D = "dra.example.com"
DRA_CASES: list[tuple[str, str, str, Mapping[str, AttributeValue], Mapping[str, Quantity], Verdict, int]] = [
    ("true", "true", "", {}, {}, True, 0),
    ("false", "false", "", {}, {}, False, 0),
    ("syntax-error", "?!", "", {}, {}, "COMPILE:Syntax error", 0),
    ("type-error", "1", "", {}, {}, "COMPILE:must evaluate to bool or the unknown type, not int", 0),
    ("runtime-error-lookup-identifier",
     'device.attributes["no-such-domain"].noSuchAttr.isGreaterThan(quantity("0"))', "", {}, {},
     "RUNTIME:no such key: noSuchAttr", 6),
    ("runtime-error-lookup-map",
     'device.attributes["no-such-domain"]["noSuchAttr"].isGreaterThan(quantity("0"))', "", {}, {},
     "RUNTIME:no such key: noSuchAttr", 6),
    ("domain-check-negative", '"no-such-domain" in device.attributes', "", {}, {}, False, 3),
    ("domain-check-positive", f'"{D}" in device.attributes', "", {f"{D}/something": True}, {}, True, 3),
    ("empty-driver-name", 'device.driver == ""', "", {}, {}, True, 2),
    ("real-driver-name", f'device.driver == "{D}"', D, {}, {}, True, 4),
    ("driver-name-qualifier", f'device.attributes["{D}"].name', D, {"name": True}, {}, True, 4),
    ("driver-name-qualifier-map-lookup", f'device.attributes["{D}"]["name"]', D, {"name": True}, {}, True, 4),
    ("bind", f'cel.bind(dra, device.attributes["{D}"], dra.name)', D, {"name": True}, {}, True, 15),
    ("qualified-attribute-name", 'device.attributes["other.example.com"].name', D,
     {"other.example.com/name": True}, {}, True, 4),
    ("bool", f'device.attributes["{D}"].name', D, {"name": True}, {}, True, 4),
    ("int", f'device.attributes["{D}"].name > 0', D, {"name": 1}, {}, True, 5),
    ("string", f'device.attributes["{D}"].name == "fish"', D, {"name": "fish"}, {}, True, 5),
    ("macro-exists-on-int", f'device.attributes["{D}"].name.exists(x, x > 0)', D, {"name": 1}, {},
     "RUNTIME:got 'types.Int', expected iterable type", 0),
    ("macro-exists-on-bool", f'device.attributes["{D}"].name.exists(x, x == true)', D, {"name": True}, {},
     "RUNTIME:got 'types.Bool', expected iterable type", 0),
    ("macro-exists-on-string", f'device.attributes["{D}"].name.exists(x, x == "fish")', D, {"name": "fish"}, {},
     "RUNTIME:got 'types.String', expected iterable type", 0),
    ("version", f'device.attributes["{D}"].name.isGreaterThan(semver("0.0.1"))', D,
     {"name": parse_semver("1.0.0")}, {}, True, 6),
    ("version_v", f'device.attributes["{D}"].name.isGreaterThan(semver("v0.0.1", true)) && isSemver("v1.0.0", true)',
     D, {"name": parse_semver("1.0.0")}, {}, True, 7),
    ("macro-exists-on-version", f'device.attributes["{D}"].name.exists(x, x.isGreaterThan(semver("0.0.1")))', D,
     {"name": parse_semver("1.0.0")}, {}, "RUNTIME:got 'cel.Semver', expected iterable type", 0),
    ("quantity", f'device.capacity["{D}"].name.isGreaterThan(quantity("1Ki"))', D, {},
     {"name": parse_quantity("1Mi")}, True, 6),
    ("check-positive",
     f'"name" in device.capacity["{D}"] && device.capacity["{D}"].name.isGreaterThan(quantity("1Ki"))', D, {},
     {"name": parse_quantity("1Mi")}, True, 10),
    ("check-negative",
     f'!("name" in device.capacity["{D}"]) || device.capacity["{D}"].name.isGreaterThan(quantity("1Ki"))', "",
     {}, {}, True, 11),
    ("all", f"""
device.capacity["{D}"].quantity.isGreaterThan(quantity("1Ki")) &&
device.attributes["{D}"].bool &&
device.attributes["{D}"].int > 0 &&
device.attributes["{D}"].string == "fish" &&
device.attributes["{D}"].version.isGreaterThan(semver("0.0.1")) &&
device.capacity["{D}"]["quantity"].isGreaterThan(quantity("1Ki")) &&
device.attributes["{D}"]["bool"] &&
device.attributes["{D}"]["int"] > 0 &&
device.attributes["{D}"]["string"] == "fish" &&
device.attributes["{D}"]["version"].isGreaterThan(semver("0.0.1"))
""", D, {"bool": True, "int": 1, "string": "fish", "version": parse_semver("1.0.0")},
     {"quantity": parse_quantity("1Mi")}, True, 52),
    ("many", f'device.attributes["{D}"].a && device.attributes["{D}"].b && device.attributes["{D}"].c', D,
     {"a": True, "b": True, "c": True}, {}, True, 12),
    ("check_attribute_domains", f'device.attributes.exists_one(x, x == "{D}")', D,
     {"services": "some_example_value"}, {}, True, 164),
    ("check_attribute_ids", f'device.attributes["{D}"].exists_one(x, x == "services")', D,
     {"services": "some_example_value"}, {}, True, 133),
    ("split_attribute", f'device.attributes["{D}"].services.split("example").size() >= 2', D,
     {"services": "some_example_value"}, {}, True, 19),
    ("regexp_attribute", f'device.attributes["{D}"].services.matches("[^a]?sym")', D,
     {"services": "asymetric"}, {}, True, 18),
    ("check_capacity_domains", f'device.capacity.exists_one(x, x == "{D}")', D, {},
     {"memory": parse_quantity("1Mi")}, True, 164),
    ("check_capacity_ids", f'device.capacity["{D}"].exists_one(x, x == "memory")', D, {},
     {"memory": parse_quantity("1Mi")}, True, 133),
    ("expensive", "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(x, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(y, "
     "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z2, "
     "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z3, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z4, "
     "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z5, int('1'.find('[0-9]*')) < 100)))))))", D, {}, {},
     "RUNTIME:actual cost limit exceeded", 85555551),
    ("allow_multiple_allocations_default", "device.allowMultipleAllocations == false", D, {}, {}, True, 3),
]


@pytest.mark.parametrize(("name", "expression", "driver", "attributes", "capacity", "expected", "cost"), DRA_CASES,
                         ids=[c[0] for c in DRA_CASES])
def test_dra_compile_test_cases(
    name: str, expression: str, driver: str, attributes: Mapping[str, AttributeValue],
    capacity: Mapping[str, Quantity], expected: Verdict, cost: int,
) -> None:
    device = DeviceInput(driver=driver, attributes=attributes, capacity=capacity)
    for env in (OLDEST,) if name == "expensive" else (OLDEST, NEWEST):  # "expensive" runs ~1 s
        check(verdict(env, expression, device), expected)
        if cost:
            assert env.compile(expression).max_cost == cost


def test_expensive_selector_is_refused_by_the_api_server() -> None:
    expression = next(c[1] for c in DRA_CASES if c[0] == "expensive")
    problem = DraCelEnvironment(kubernetes_minor=35, new_expressions=True).check_new_expression(expression)
    assert problem is not None and "exceeds cost limit" in problem


# Which release declares what (k8s.io/apiserver/pkg/cel/environment/base.go, dynamic-resource-allocation
# compile.go): the scheduler uses StoredExpressions, the API server checks a new selector with
# NewExpressions (the previous release's libraries, plus options whose feature gate is on).
RELEASES: list[tuple[str, int, bool, bool, Verdict]] = [
    # ext.Lists version 3 arrived in the 1.34 base environment
    ("[3, 1, 2].sort() == [1, 2, 3]", 34, False, False, True),
    ("[3, 1, 2].sort() == [1, 2, 3]", 34, True, False, "COMPILE:undeclared reference to 'sort'"),
    ("[3, 1, 2].sort() == [1, 2, 3]", 35, True, False, True),
    ("[{'a': 2}, {'a': 1}].sortBy(e, e.a)[0].a == 1", 34, True, False, "COMPILE:undeclared reference to 'sortBy'"),
    ("lists.range(3) == [0, 1, 2]", 35, False, False, True),
    # includes: DRA 1.36 (DRAListTypeAttributes for new selectors), Kubernetes lists version 1 in 1.37
    ("'fish'.includes('fish')", 35, False, False, "COMPILE:undeclared reference to 'includes'"),
    ("'fish'.includes('fish')", 36, False, False, True),
    ("'fish'.includes('fish')", 36, True, False, "COMPILE:undeclared reference to 'includes'"),
    ("'fish'.includes('fish')", 36, True, True, True),
    ("'fish'.includes('fish')", 37, True, False, True),
    ("[1, 2].includes(2) && !['a'].includes('b')", 37, False, False, True),
]


@pytest.mark.parametrize(("expression", "minor", "new", "gate", "expected"), RELEASES)
def test_libraries_per_release(expression: str, minor: int, new: bool, gate: bool, expected: Verdict) -> None:
    env = DraCelEnvironment(kubernetes_minor=minor, new_expressions=new, list_type_attributes=gate)
    check(verdict(env, expression), expected)


# k8s.io/apiserver/pkg/cel/library quantity_test.go, semver_test.go (release-1.34); lists.go and regex.go
# documented examples; cel-go ext/sets_test.go, ext/bindings_test.go, cel/library.go optional examples.
LIBRARIES: list[tuple[str, Verdict]] = [
    # quantity
    ('quantity("10Mo") == quantity("1")', "RUNTIME:quantities must match the regular expression"),
    ('quantity("10Mm") == quantity("1")', "RUNTIME:unable to parse quantity's suffix"),
    ('isQuantity("20") && isQuantity("20M") && isQuantity("20Mi")', True),
    ('isQuantity("20Mo") || isQuantity("10Mm")', False),
    ("isQuantity([1, 2, 3])", "COMPILE:found no matching overload for 'isQuantity' applied to"),
    ('quantity("200M") == quantity("200M")', True),
    ('quantity("200M") == quantity("0.2G") && quantity("0.2G") == quantity("200M")', True),
    ('quantity("2M") == quantity("0.002G") && quantity("2000k") == quantity("2M") && '
     'quantity("0.002G") == quantity("2000k")', True),
    ('quantity("200M") == quantity("0.3G")', False),
    ('quantity("50M").isLessThan(quantity("50Mi"))', True),
    ('quantity("50M").isLessThan(quantity("100M"))', True),
    ('quantity("100M").isLessThan(quantity("50M"))', False),
    ('quantity("50Mi").isGreaterThan(quantity("50M"))', True),
    ('quantity("150Mi").isGreaterThan(quantity("100Mi"))', True),
    ('quantity("50M").isGreaterThan(quantity("100M"))', False),
    ('quantity("200M").compareTo(quantity("0.2G")) == 0', True),
    ('quantity("50M").compareTo(quantity("50Mi")) == -1', True),
    ('quantity("50Mi").compareTo(quantity("50M")) == 1', True),
    ('quantity("50k").add(quantity("20")) == quantity("50.02k")', True),
    ('quantity("50k").add(20).isLessThan(quantity("50020"))', False),
    ('quantity("50k").sub(quantity("20")) == quantity("49.98k")', True),
    ('quantity("50k").sub(20) == quantity("49980")', True),
    ('quantity("50k").add(20).sub(quantity("100k")).asInteger() == -49980', True),
    ('quantity("50k").add(20).sub(quantity("100k")).sub(-50000).asInteger() == 20', True),
    ('quantity("50k").asInteger() == 50000', True),
    ('quantity("9999999999999999999999999999999999999G").asInteger() == 1',
     "RUNTIME:cannot convert value to integer"),
    ('quantity("9999999999999999999999999999999999999G").isInteger()', False),
    ('quantity("50").isInteger()', True),
    ('quantity("50.703k").asApproximateFloat() == 50703.0', True),
    # semver
    ('semver("v1.0") == semver("1.0.0")', "RUNTIME:"),
    ('isSemver("1.2.3-beta.1+build.1")', True),
    ('isSemver("") || isSemver("v1.0.0") || isSemver(" 1.0.0") || isSemver("1. 0.0") || isSemver("1.0.0 ")', False),
    ('isSemver("01.01.01") || isSemver("1") || isSemver("1.1")', False),
    ('isSemver("", true) || isSemver(" 1.0.0", true) || isSemver("1. 0.0", true) || isSemver("1.0.0 ", true)',
     False),
    ('isSemver("v1.0.0", true) && isSemver("01.01.01", true) && isSemver("1", true) && isSemver("1.1", true)',
     True),
    ("isSemver([1, 2, 3])", "COMPILE:found no matching overload for 'isSemver' applied to"),
    ('semver("v01.01", true) == semver("1.1.0")', True),
    ('semver("1.2.3") == semver("1.2.3")', True),
    ('semver("1.2.3") == semver("1.0.0")', False),
    ('semver("1.0.0").isLessThan(semver("1.2.3"))', True),
    ('semver("1.0.0").isLessThan(semver("1.0.0"))', False),
    ('semver("1.2.3").isGreaterThan(semver("1.0.0"))', True),
    ('semver("1.2.3").compareTo(semver("2.0.0")) == -1', True),
    ('semver("1.2.3").major() == 1 && semver("1.2.3").minor() == 2 && semver("1.2.3").patch() == 3', True),
    ('semver("1.0.0") >= semver("0.1.0")', "COMPILE:found no matching overload for '_>=_'"),
    # Kubernetes lists
    ("[1, 2, 3].isSorted() && ['a', 'b', 'b', 'c'].isSorted() && !['c', 'a'].isSorted()", True),
    ("[1, 2, 3].sum() == 6 && [1.0, 2.0].sum() == 3.0 && [].sum() == 0", True),
    ("[1, 2, 3].min() == 1 && [1, 2, 3].max() == 3 && ['d', 'a'].min() == 'a'", True),
    ("[].min() == 1", "RUNTIME:min(list) argument must not be empty"),
    ("[1, 2, 2, 3].indexOf(2) == 1 && ['a', 'b', 'b', 'c'].lastIndexOf('b') == 2", True),
    ("[1.0].indexOf(1.1) == -1 && [].indexOf('string') == -1", True),
    # regex
    ("'abc 123'.find('[0-9]+') == '123' && 'abc'.find('[0-9]+') == ''", True),
    ("'123 abc 456'.findAll('[0-9]+') == ['123', '456'] && '123 abc 456'.findAll('[0-9]+', 1) == ['123']", True),
    ("'abc'.matches('(')", "COMPILE:invalid matches argument"),
    ("'abc'.matches('^a.c$') && 'xabcx'.matches('abc')", True),
    # sets
    ("sets.contains([], []) && sets.contains([1], []) && sets.contains([1], [1]) && sets.contains([1], [1, 1])",
     True),
    ("sets.contains([1, 1], [1]) && sets.contains([2, 1], [1]) && !sets.contains([1], [2])", True),
    ("sets.contains([1, 2, 3, 4], [2, 3]) && !sets.contains([1, 2, 3], [2, 3, 4])", True),
    ("sets.equivalent([], []) && sets.equivalent([1], [1, 1]) && sets.equivalent([1, 2, 3], [dyn(3u), dyn(2.0), dyn(1)])", True),
    ("sets.equivalent([1, 2], [2, 2, 2])", False),
    ("sets.intersects([1], [1]) && sets.intersects([1], [dyn(1.0), dyn(2)]) && !sets.intersects([], [])", True),
    ("sets.intersects([1], [])", False),
    # bindings
    ("cel.bind(a, 'hell' + 'o' + '!', [a, a, a].join(', ') == 'hello!, hello!, hello!')", True),
    ("cel.bind(a, 'hello!', cel.bind(b, 'goodbye', a + ' and, ' + b)) == 'hello! and, goodbye'", True),
    ("cel.bind(a.b, 1, true)", "COMPILE:cel.bind() variable names must be simple identifiers"),
    # optional types
    ("optional.of(1).hasValue() && !optional.none().hasValue() && optional.of(1).value() == 1", True),
    ("optional.ofNonZeroValue(0).hasValue() || optional.ofNonZeroValue('').hasValue() || "
     "optional.ofNonZeroValue([]).hasValue()", False),
    ("optional.none().value() == 1", "RUNTIME:optional.none() dereference"),
    ("optional.none().orValue(2) == 2 && optional.of(1).orValue(2) == 1", True),
    ("optional.none().or(optional.of(3)).value() == 3", True),
    ("{'a': 1}.?a.orValue(0) == 1 && {'a': 1}.?b.orValue(0) == 0 && {'a': 1}[?'b'].hasValue() == false", True),
    ("[1, 2][?5].orValue(0) == 0 && [?optional.none(), ?optional.of(1)] == [1]", True),
    ("optional.of(2).optMap(x, x * 2).value() == 4 && optional.of(2).optFlatMap(x, optional.none()) == "
     "optional.none()", True),
    ("[1, 2].first().value() == 1 && [1, 2].last().value() == 2 && ![].first().hasValue()", True),
    # standard CEL semantics Kubernetes relies on
    ("1 == 1.0 && 1u == 1 && 2 > 1.5 && 1u < 2", True),  # CrossTypeNumericComparisons
    ("[1, 'a'] == [1, 'a']", "COMPILE:expected type 'int' but found 'string'"),  # HomogeneousAggregateLiterals
    ("[1, dyn('a')].size() == 2", True),
    ("9223372036854775807 + 1 == 0", "RUNTIME:overflow"),
    ("1 / 0 == 0", "RUNTIME:division by zero"),
    ("false && (1 / 0 == 0)", False),
    ("(1 / 0 == 0) || true", True),
    ("x == 1", "COMPILE:undeclared reference to 'x'"),
]


@pytest.mark.parametrize(("expression", "expected"), LIBRARIES)
def test_kubernetes_libraries(expression: str, expected: Verdict) -> None:
    check(verdict(NEWEST, expression), expected)
