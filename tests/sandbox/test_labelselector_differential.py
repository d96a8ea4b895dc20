"""Label selectors: the sandbox gives the verdicts of Kubernetes' own tests.

Cases and verdicts come from k8s.io/apimachinery `pkg/labels/selector_test.go` (TestSelectorParse,
TestSelectorMatches, TestSetSelectorParser, TestRequirementConstructor, TestRequirementSelectorMatching,
TestLexerSequence), and the error texts from `pkg/labels/selector.go` (`parse`, `parseRequirement`,
`parseValues`, `parseIdentifiersList`, `NewRequirement`), as the apiserver answers them in its 400 BadRequest.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from dra_sandbox.apiserver import ApiServer
from dra_sandbox.apiserver.labelselector import (
    DOES_NOT_EXIST,
    DOUBLE_EQUALS,
    EQUALS,
    EXISTS,
    GREATER_THAN,
    IN,
    LESS_THAN,
    NOT_EQUALS,
    NOT_IN,
    LabelRequirement,
    SelectorError,
    parse_label_selector,
)

R = LabelRequirement

# TestSelectorParse: testGoodStrings / testBadStrings; TestSetSelectorParser's Valid column.
VALID = ["x=a,y=b,z=c", "", "x!=a,y=b", "x=", "x= ", "x=,z= ", "x= ,z= ", "!x", "x>1", "x>1,z<5",
         "\rx", "this-is-a-dns.domain.com/key-with-dash", "this-is-another-dns.domain.com/key-with-dash in (so,what)",
         "0.1.2.domain/99 notin (10.10.100.1, tick.tack.clock)", "foo  in\t (abc)", "x notin\n (abc)",
         "x  notin\t\t\t(abc,def)", "x in (abc,def)", "x in (abc,)", "x in ()", "x notin (abc,def),bar,z in (),w",
         "x,y in (a)", "x=a", "x>1", "x<7", "x=a,y!=b", "x=a,y!=b,z in (h,i,j)", "x notin ( )", "x notin (, a)",
         "a ", "a in (x,y,notin, z,in)", "notin=in", "1foo in (bar)", "1234 in (bar)", "y>1", "z<6"]
INVALID = ["x=a||y=b", "x==a==b", "!x=a", "x<a", "x,y,", ",x,y", "x nott in (y)", "a in (xyz),",
           "a in (xyz)b notin ()", "a in (xyz abc)", "a notin(", "a (", "(", "foo>bar", "barz<blah",
           f"{'a' * 254}"]


@pytest.mark.parametrize("selector", VALID)
def test_upstream_valid_selectors_parse(selector: str) -> None:
    parse_label_selector(selector)


@pytest.mark.parametrize("selector", INVALID)
def test_upstream_invalid_selectors_are_refused(selector: str) -> None:
    with pytest.raises(SelectorError):
        parse_label_selector(selector)


# TestSetSelectorParser's Out column: what the selector holds (sorted by key, values sorted and unique).
@pytest.mark.parametrize(
    ("selector", "requirements"),
    [
        ("", ()),
        ("\rx", (R("x", EXISTS),)),
        ("foo  in\t (abc)", (R("foo", IN, ("abc",)),)),
        ("x in (abc,)", (R("x", IN, ("", "abc")),)),
        ("x in ()", (R("x", IN, ("",)),)),
        ("x notin ( )", (R("x", NOT_IN, ("",)),)),
        ("x notin (, a)", (R("x", NOT_IN, ("", "a")),)),
        ("x notin (abc,def),bar,z in (),w", (R("bar", EXISTS), R("w", EXISTS), R("x", NOT_IN, ("abc", "def")),
                                              R("z", IN, ("",)))),
        ("x,y in (a)", (R("x", EXISTS), R("y", IN, ("a",)))),
        ("x>1", (R("x", GREATER_THAN, ("1",)),)),
        ("x<7", (R("x", LESS_THAN, ("7",)),)),
        ("x=a,y!=b", (R("x", EQUALS, ("a",)), R("y", NOT_EQUALS, ("b",)))),
        ("x==a", (R("x", DOUBLE_EQUALS, ("a",)),)),
        ("!x", (R("x", DOES_NOT_EXIST),)),
        ("a in (x,y,notin, z,in)", (R("a", IN, ("in", "notin", "x", "y", "z")),)),
        ("x=", (R("x", EQUALS, ("",)),)),
        ("x in (a,,b)", (R("x", IN, ("", "a", "b")),)),
    ],
)
def test_upstream_parse_results(selector: str, requirements: tuple[LabelRequirement, ...]) -> None:
    assert parse_label_selector(selector).requirements == requirements


# TestSelectorMatches and TestRequirementSelectorMatching, plus Gt/Lt against values Go's ParseInt refuses.
@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("", {"x": "y"}, True),
        ("x=y", {"x": "y"}, True),
        ("x=y,z=w", {"x": "y", "z": "w"}, True),
        ("x!=y,z!=w", {"x": "z", "z": "a"}, True),
        ("notin=in", {"notin": "in"}, True),
        ("x", {"x": "z"}, True),
        ("!x", {"y": "z"}, True),
        ("x>1", {"x": "2"}, True),
        ("x<1", {"x": "0"}, True),
        ("x=z", {}, False),
        ("x=y", {"x": "z"}, False),
        ("x=y,z=w", {"x": "w", "z": "w"}, False),
        ("x!=y,z!=w", {"x": "z", "z": "w"}, False),
        ("x", {"y": "z"}, False),
        ("!x", {"x": "z"}, False),
        ("x>1", {"x": "0"}, False),
        ("x<1", {"x": "2"}, False),
        ("foo=bar,baz=blah", {"foo": "bar", "baz": "blah"}, True),
        ("foo=blah", {"foo": "bar", "baz": "blah"}, False),
        ("foo=bar,foobar=bar,baz=blah", {"foo": "bar", "baz": "blah"}, False),
        ("x in (foo),y notin (alpha)", {"x": "foo", "y": "baz"}, True),
        ("x in (foo),y in (alpha)", {"x": "foo", "y": "baz"}, False),
        ("x notin (),y", {"y": ""}, True),
        ("!x,y", {"y": ""}, True),
        ("x notin (),!y", {"y": ""}, False),
        ("x in ()", {"y": "baz"}, False),
        ("x in ()", {"x": ""}, True),
        ("z>1", {"z": "2"}, True),
        ("z>1", {"z": "v2"}, False),
        ("z>5", {"z": "1_0"}, False),  # Python's int() reads 10; ParseInt refuses it
        ("z>5", {"z": "99999999999999999999"}, False),  # beyond int64
        ("z<9", {"z": "007"}, True),
        ("z>1", {}, False),
        ("z notin (a)", {}, True),
    ],
)
def test_upstream_matching(selector: str, labels: dict[str, str], matches: bool) -> None:
    assert parse_label_selector(selector).matches(labels) is matches


_KEY_MSG = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
            "alphanumeric character")
_VALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
              "and must start and end with an alphanumeric character")


# The texts the apiserver answers (selector.go's own wording; key/value details from util/validation).
@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("x=a||y=b", f"unable to parse requirement: values[0][x]: Invalid value: \"a||y\": {_VALUE_MSG}"),
        ("x==a==b", "found '==', expected: ',' or 'end of string'"),
        ("!x=a", "found '=', expected: ',' or 'end of string'"),
        ("x<a", "unable to parse requirement: values[0]: Invalid value: \"a\": for 'Gt', 'Lt' operators, "
                "the value must be an integer"),
        ("x>-1", f"unable to parse requirement: values[0][x]: Invalid value: \"-1\": {_VALUE_MSG}"),
        ("x>99999999999999999999", "unable to parse requirement: values[0]: Invalid value: "
                                   "\"99999999999999999999\": for 'Gt', 'Lt' operators, the value must be an integer"),
        ("x>a-", "unable to parse requirement: [values[0]: Invalid value: \"a-\": for 'Gt', 'Lt' operators, the "
                 f"value must be an integer, values[0][x]: Invalid value: \"a-\": {_VALUE_MSG}]"),
        ("x,y,", "found '', expected: identifier after ','"),
        (",x,y", "found ',', expected: !, identifier, or 'end of string'"),
        ("x nott in (y)", "unable to parse requirement: found 'nott', expected: in, notin, =, ==, !=, gt, lt"),
        ("env IN (a)", "unable to parse requirement: found 'IN', expected: in, notin, =, ==, !=, gt, lt"),
        ("a in (xyz),", "found '', expected: identifier after ','"),
        ("a in (xyz)b notin ()", "found 'b', expected: ',' or 'end of string'"),
        ("a in (xyz abc)", "unable to parse requirement: found 'abc', expected: ',' or ')'"),
        ("a notin(", "unable to parse requirement: found '', expected: ',', ')' or identifier"),
        ("a in x", "unable to parse requirement: found 'x' expected: '('"),
        ("a in (=)", "unable to parse requirement: found '=', expected: ',', ')' or identifier"),
        ("a in (,=)", "unable to parse requirement: found '=', expected: ',', or identifier"),
        ("a (", "unable to parse requirement: found '(', expected: in, notin, =, ==, !=, gt, lt"),
        ("(", "found '(', expected: !, identifier, or 'end of string'"),
        ("=x", "found '=', expected: !, identifier, or 'end of string'"),
        ("!", "unable to parse requirement: found '', expected: identifier"),
        ("!!x", "unable to parse requirement: found '!', expected: identifier"),
        ("x=(", "unable to parse requirement: found '(', expected: identifier"),
        ("a b", "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"),
        ("-app=x", f"unable to parse requirement: <nil>: Invalid value: \"-app\": {_KEY_MSG}"),
        ("app=-v", f"unable to parse requirement: values[0][app]: Invalid value: \"-v\": {_VALUE_MSG}"),
        ("app in (b-, a-)", f"unable to parse requirement: [values[0][app]: Invalid value: \"a-\": {_VALUE_MSG}, "
                            f"values[1][app]: Invalid value: \"b-\": {_VALUE_MSG}]"),
        (f"app={'v' * 64}", "unable to parse requirement: values[0][app]: Invalid value: \"" + "v" * 64
                            + "\": must be no more than 63 characters"),
        ("/app=x", "unable to parse requirement: <nil>: Invalid value: \"/app\": prefix part must be non-empty"),
    ],
)
def test_upstream_error_texts(selector: str, message: str) -> None:
    with pytest.raises(SelectorError) as err:
        parse_label_selector(selector)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("selector", ["x=a\x0bb", "x\x0c", "x=a\u00a0"])
def test_only_space_tab_cr_lf_are_whitespace(selector: str) -> None:
    # isWhitespace in selector.go: ' ', '\t', '\r', '\n'; anything else is part of an identifier.
    with pytest.raises(SelectorError):
        parse_label_selector(selector)


def test_a_nul_ends_the_selector_where_a_token_would_start() -> None:
    # Go's lexer reads a NUL byte as its end-of-input marker.
    with pytest.raises(SelectorError, match="found '', expected: identifier after ','"):
        parse_label_selector("x=a,\x00junk=(")
    assert parse_label_selector("x=a \x00 junk (").requirements == (R("x", EQUALS, ("a",)),)


def test_keys_and_values_at_their_length_limits() -> None:
    key, value = f"{'e' * 253}/{'k' * 63}", "v" * 63
    assert parse_label_selector(f"{key}={value}").matches({key: value})
    with pytest.raises(SelectorError):
        parse_label_selector(f"{'k' * 64}=x")
    with pytest.raises(SelectorError):
        parse_label_selector(f"{'e' * 254}/app=x")


@pytest.mark.apiserver(fresh=True)
def test_the_server_answers_a_bad_selector_with_400_and_the_parser_text(server: ApiServer) -> None:
    for verb_query in ("", "&watch=true"):
        url = f"{server.url}/api/v1/namespaces/default/pods?labelSelector=x%3Da%7C%7Cy%3Db{verb_query}"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url, timeout=10)
        body = json.loads(err.value.read())
        assert err.value.code == 400
        assert body["reason"] == "BadRequest"
        assert body["message"].startswith('unable to parse requirement: values[0][x]: Invalid value: "a||y"')
        assert "details" not in body
