"""The chart's `listAttributes` (KEP-5491, docs/reference/dra-in-flight.md): `auto` by default, so the plugin sends
list-type numaNode where the API server keeps it; the older booleans still mean on and off; other values refused."""

from __future__ import annotations

import pytest

from dra_driver.commands.flags import apply_env_defaults
from dra_driver.k8s.serverfeatures import FeatureMode
from tests.chart.helm import Helm, one, plugin_container
from tests.chart.test_render import plugin_parser, resolved_env


@pytest.mark.parametrize(("sets", "mode"), [
    ((), FeatureMode.AUTO),
    (("listAttributes=auto",), FeatureMode.AUTO),
    (("listAttributes=on",), FeatureMode.ON),
    (("listAttributes=off",), FeatureMode.OFF),
    (("listAttributes=true",), FeatureMode.ON),
    (("listAttributes=false",), FeatureMode.OFF),
])
def test_the_value_becomes_the_plugins_mode(helm: Helm, sets: tuple[str, ...], mode: FeatureMode) -> None:
    env = resolved_env(plugin_container(one(helm.render(sets), "DaemonSet")), node_name="n1")
    parser = plugin_parser()
    apply_env_defaults(parser, env)
    args = parser.parse_args([])
    assert FeatureMode(args.list_attributes) is mode


def test_other_values_are_refused_by_the_schema(any_helm: Helm) -> None:
    message = any_helm.fail(("listAttributes=sometimes",))
    assert "schema" in message and "listAttributes" in message, message
