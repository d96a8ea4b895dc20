"""`dra-driver explain` on a claim with KEP-6080 derived attributes: evaluated as kube-scheduler 1.37 evaluates them
with DRADerivedAttributes on (the API server kept them, so its gate is on), refused with `--feature-gates
DRADerivedAttributes=false` as a scheduler without the gate refuses them."""

from __future__ import annotations

import argparse

import pytest

from dra_driver.commands.explain import claim_gates, explain_claim, parse_feature_gates
from tests.sandbox.test_derived_attributes import CLASS, NODE, SLICE, SOCKET_ATTRIBUTE, _claim


def test_explain_evaluates_derived_attributes_of_a_claim_that_has_them() -> None:
    claim = _claim("c", SOCKET_ATTRIBUTE)
    fits, text = explain_claim(claim, nodes=[NODE], classes=[CLASS], slices=[SLICE], claims=[], namespace_labels={},
                               feature_gates=claim_gates(claim, None))
    assert fits == ["n1"], text


def test_explain_with_the_gate_off_says_what_such_a_scheduler_says() -> None:
    claim = _claim("c", SOCKET_ATTRIBUTE)
    gates = claim_gates(claim, parse_feature_gates("DRADerivedAttributes=false"))
    fits, text = explain_claim(claim, nodes=[NODE], classes=[CLASS], slices=[SLICE], claims=[], namespace_labels={},
                               feature_gates=gates)
    assert fits == []
    assert "request gpu has derived attributes, but the DRADerivedAttributes feature is disabled" in text


def test_a_claim_without_derived_attributes_leaves_the_gate_off() -> None:
    assert claim_gates(_claim("c"), None) == {"DRADerivedAttributes": False, "DRADeviceCompatibilityGroups": False}


@pytest.mark.parametrize("text", ["DRADerivedAttributes", "DRADerivedAttributes=yes", "=true"])
def test_a_malformed_feature_gates_value_says_how_to_write_it(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="write NAME=true or NAME=false"):
        parse_feature_gates(text)
