"""The chart's `partitionTypes` (KEP-5677) and `nodeAllocatableOverhead` (KEP-5517) reach the kubelet plugin as its
flags (docs/reference/dra-in-flight.md): `auto` and `none` by default, the values given passed on, bad ones refused by
the schema."""

from __future__ import annotations

import argparse

import pytest

from dra_driver.commands.flags import apply_env_defaults
from dra_driver.k8s.serverfeatures import FeatureMode
from dra_driver.slices.nodeallocatable import parse_overhead
from tests.chart.helm import Helm, one, plugin_container
from tests.chart.test_render import plugin_parser, resolved_env


def _args(helm: Helm, sets: tuple[str, ...]) -> argparse.Namespace:
    env = resolved_env(plugin_container(one(helm.render(sets), "DaemonSet")), node_name="n1")
    parser = plugin_parser()
    apply_env_defaults(parser, env)
    return parser.parse_args([])


@pytest.mark.parametrize(("sets", "mode"), [
    ((), FeatureMode.AUTO), (("partitionTypes=on",), FeatureMode.ON), (("partitionTypes=off",), FeatureMode.OFF),
])
def test_partition_types_become_the_plugins_mode(helm: Helm, sets: tuple[str, ...], mode: FeatureMode) -> None:
    assert FeatureMode(_args(helm, sets).partition_types) is mode


@pytest.mark.parametrize(("sets", "overhead"), [
    ((), {}), (("nodeAllocatableOverhead=memory=2Gi",), {"memory": "2Gi"}),
    (("nodeAllocatableOverhead=memory=2048Mi\\,cpu=0.5",), {"memory": "2Gi", "cpu": "500m"}),
])
def test_the_overhead_becomes_the_plugins_flag(helm: Helm, sets: tuple[str, ...], overhead: dict[str, str]) -> None:
    assert dict(parse_overhead(_args(helm, sets).node_allocatable_overhead)) == overhead


@pytest.mark.parametrize("value", ["partitionTypes=sometimes", "nodeAllocatableOverhead=lots of memory"])
def test_other_values_are_refused_by_the_schema(any_helm: Helm, value: str) -> None:
    message = any_helm.fail((value,))
    assert "schema" in message and value.split("=")[0] in message, message
