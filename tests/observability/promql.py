"""Just enough PromQL for the chart's tests: the metric names an expression reads (a tokenizer, not a parser), and
an evaluator for the one rule shape the idle-GPU alert uses, `max_over_time(<metric>[<range>]) < <threshold>`
with the rule's `for`, over recorded samples.

A real PromQL parser exists on PyPI (`promql-parser`, Rust bindings); it is not a dependency of this repository,
so the tokenizer below is deliberately conservative: it fails loudly on anything it does not understand."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"})
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NUMBER = re.compile(r"\b\d+(\.\d+)?([eE][+-]?\d+)?\b")


def metric_names(expr: str) -> set[str]:
    """Every metric name the expression selects: identifiers that are not functions, aggregations, keywords or
    label names (label matchers, ranges, strings and `by (...)`-style label lists are cut out first)."""
    text = _STRINGS.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _LABEL_LISTS.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names: set[str] = set()
    for match in _IDENT.finditer(text):
        name = match.group(0)
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or name in KEYWORDS:
            continue  # a function or an aggregation, or an operator keyword
        names.add(name)
    leftovers = re.sub(r"[\s()+\-*/<>=!,^%]", "", _IDENT.sub("", text))
    assert not leftovers, f"the tokenizer does not understand {leftovers!r} in {expr!r}"
    return names


Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Recorded:
    """A series as Prometheus would store it: labels and (unix seconds, value) samples in time order."""

    labels: Labels
    samples: Sequence[tuple[float, float]]


_IDLE_SHAPE = re.compile(
    r"^\s*max_over_time\(\s*(?P<metric>[A-Za-z_:][A-Za-z0-9_:]*)\s*\[(?P<n>\d+)(?P<unit>[smh])\]\s*\)"
    r"\s*<\s*(?P<threshold>[0-9.]+)\s*$"
)
_UNIT = {"s": 1, "m": 60, "h": 3600}


def duration(text: str) -> float:
    match = re.fullmatch(r"(\d+)([smh])", text)
    assert match, text
    return int(match.group(1)) * _UNIT[match.group(2)]


def firing(
    expr: str, for_: str, series: Mapping[str, Sequence[Recorded]], at: Sequence[float]
) -> dict[float, set[Labels]]:
    """Evaluate an alert of the shape above at each time in `at` (ascending), as Prometheus' rule manager does:
    the expression is true for a series when its window (t - range, t] has samples and their max is below the
    threshold; the alert fires once that held at every evaluation for `for`. Returns the firing label sets per
    time. Any other expression shape is refused."""
    match = _IDLE_SHAPE.match(expr)
    assert match, f"not the evaluable shape max_over_time(<metric>[<range>]) < <threshold>: {expr!r}"
    window = int(match.group("n")) * _UNIT[match.group("unit")]
    threshold = float(match.group("threshold"))
    hold = duration(for_)
    active_since: dict[Labels, float] = {}
    out: dict[float, set[Labels]] = {}
    for t in at:
        true_now: set[Labels] = set()
        for s in series.get(match.group("metric"), ()):
            values = [v for ts, v in s.samples if t - window < ts <= t]
            if values and max(values) < threshold:
                true_now.add(s.labels)
        for labels in list(active_since):
            if labels not in true_now:
                del active_since[labels]  # resolved: `for` starts over next time
        for labels in true_now:
            active_since.setdefault(labels, t)
        out[t] = {labels for labels, since in active_since.items() if t - since >= hold}
    return out
