"""The table of the product's requests: every row served by upstream on every supported minor (the field-selector
labels from dra_sandbox's fieldlabels.py, the table the sandbox API server refuses by), granted by the chart's
RBAC, written in docs/reference/api-requests.md; and the checker fails on a shape that breaks any of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_sandbox.apiserver.fieldlabels import SUPPORTED_MINORS
from dra_sandbox.apiserver.shapes import RECORD_ENV, RequestShape, ShapeRecorder, client_of
from tests.apirequests import check
from tests.apirequests.check import Recorded, field_rules, problems, report
from tests.apirequests.origin import TEST, origin
from tests.apirequests.table import (
    CHART_COMPONENTS,
    ROWS,
    SAME_ACCOUNT,
    UPSTREAM_PARAMS,
    UPSTREAM_PATCH_TYPES,
    Row,
    render,
)
from tests.chart.helm import REPO, Helm
from tests.chart.test_rbac import granted

DOC = REPO / "docs" / "reference" / "api-requests.md"


def _shape(**overrides: object) -> RequestShape:
    base: dict[str, object] = {
        "component": "kubelet-plugin", "verb": "list", "group": "resource.k8s.io", "version": "v1",
        "resource": "resourceslices", "scope": "cluster", "named": False, "params": ("fieldSelector",),
        "field_selector": (("spec.driver", "="), ("spec.nodeName", "=")), "label_selector": (), "content_type": "",
    }
    base.update(overrides)
    return RequestShape(**base)  # type: ignore[arg-type]


def _rec(shape: RequestShape) -> Recorded:
    return Recorded(shape, "GET /apis/resource.k8s.io/v1/resourceslices?…", "tests/x.py::t", "dra-driver/0")


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{'+'.join(sorted(r.components))}-{r.verb}-{r.resource}")
def test_every_row_is_served_by_every_supported_minor(row: Row) -> None:
    if not row.scope:
        return
    rules = field_rules(row.group, row.resource, row.scope)
    for minor in SUPPORTED_MINORS:
        assert row.field_labels <= set(rules.supported(minor)), (row, minor)
    assert row.params <= UPSTREAM_PARAMS[row.verb], row
    if row.verb == "patch":
        kind = "builtin" if (row.group, row.resource.split("/")[0]) in check.BUILTIN_KINDS else "custom"
        assert row.content_types <= UPSTREAM_PATCH_TYPES[kind], row
    assert row.source and row.where


def test_rows_of_the_charts_components_are_granted_by_its_roles(helm: Helm) -> None:
    objects = helm.render()
    for component in CHART_COMPONENTS:
        rules = granted(objects, component).union(*(granted(objects, o) for o in SAME_ACCOUNT.get(component, ())))
        for row in (r for r in ROWS if component in r.components and r.scope):
            assert (row.group, row.resource, row.verb) in rules, (component, row)


def test_the_reference_document_holds_the_table() -> None:
    assert render() in DOC.read_text(), (
        f"{DOC} is out of date: paste the output of `python -m tests.apirequests.table` into it")


def test_the_checker_accepts_what_the_publisher_sends() -> None:
    assert problems(_rec(_shape())) == []


def test_the_checker_fails_on_a_pool_name_field_selector() -> None:
    bad = _rec(_shape(field_selector=(("spec.driver", "="), ("spec.pool.name", "="))))
    found = problems(bad)
    assert any("spec.pool.name: Kubernetes 1.34, 1.35, 1.36, 1.37 answer 400" in p for p in found), found
    assert "spec.pool.name" in report([bad])


def test_the_checker_fails_on_an_operator_and_a_parameter_upstream_lacks() -> None:
    found = problems(_rec(_shape(field_selector=(("<unparseable>", "spec.driver in (a)"),), params=("labelz",))))
    assert any("does not parse" in p for p in found) and any("labelz" in p for p in found), found


def test_the_checker_fails_on_a_verb_the_chart_does_not_grant() -> None:
    grants = {"kubelet-plugin": {("resource.k8s.io", "resourceslices", "list")}, "controller": set()}
    assert problems(_rec(_shape()), granted=grants) == []
    deleting = _rec(_shape(verb="deletecollection", params=()))
    found = problems(deleting, granted=grants)
    assert any("does not grant deletecollection on resourceslices" in p for p in found), found
    assert any("no row" in p for p in found), found


def test_the_checker_reads_what_a_server_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: a server started with the variable writes shapes; a request the product's code sends that
    breaks the rules makes the directory's check fail, naming the request."""
    from dra_driver.commands.listing import list_all
    from dra_driver.k8s.client import ApiError
    from dra_sandbox.apiserver import ApiServer

    monkeypatch.setenv(RECORD_ENV, str(tmp_path))
    with ApiServer(kube_version="1.37.0") as srv, pytest.raises(ApiError, match="field label not supported"):
        list_all(srv.rest(), "/apis/resource.k8s.io/v1/resourceslices", {"fieldSelector": "spec.pool.name=p"})
    count, text = check.check_directory(tmp_path)
    assert count >= 1
    assert "explain: list resource.k8s.io/v1 resourceslices" in text and "spec.pool.name" in text, text
    assert "fieldSelector=spec.pool.name%3Dp" in text


def test_who_sent_a_request() -> None:
    assert client_of({"User-Agent": "dra-driver/0.1.0 (kubelet-plugin)"}) == "kubelet-plugin"
    assert client_of({"User-Agent": "kopf/1.37.2"}) == "controller"
    assert client_of({"User-Agent": "kubectl/v1.35.0 (linux/amd64) kubernetes/abc"}) == ""
    assert client_of({"User-Agent": "dra-driver/0.1.0", "X-Dra-Request-Origin": "test"}) == ""
    assert client_of({"User-Agent": "dra-sandbox", "X-Dra-Request-Origin": "product:controller"}) == "controller"
    import sys

    assert origin(sys._getframe()) == TEST  # a test's own request


def test_a_recorder_writes_each_shape_once(tmp_path: Path) -> None:
    rec = ShapeRecorder(tmp_path)
    for _ in range(3):
        rec.record(_shape(), "GET /x", "dra-driver/0 (kubelet-plugin)")
    assert len(check.load(tmp_path)) == 1


def test_every_entry_point_names_its_component_in_the_user_agent() -> None:
    """A bare `dra-driver/<version>` User-Agent reads as not the product (a bench's admin client), so every
    `connect()` of the product must name its component."""
    import ast

    calls = []
    for file in (REPO / "dra_driver").rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "connect":
                calls.append((file.name, {k.arg for k in node.keywords}))
    assert len(calls) >= 5, calls
    assert all("component" in kws for _, kws in calls), calls
    assert client_of({"User-Agent": "dra-driver/0.1.0"}) == ""


def test_device_taint_rule_rows_name_versions_some_release_serves() -> None:
    """DeviceTaintRule moved v1alpha3 -> v1beta2 -> v1 and no release serves all three: the product finds the one
    a server has by discovery (dra_driver/k8s/taintrules.py); every version a row names is one some supported
    release serves (as the kind recipe configures it), and every supported release serves one."""
    from dra_sandbox.apiserver.registry import DEVICE_TAINT_RULE_KEY, builtin_types

    served = {m: next(rt.versions for rt in builtin_types(m) if rt.key == DEVICE_TAINT_RULE_KEY)
              for m in SUPPORTED_MINORS}
    assert all(served.values())
    rows = [r for r in ROWS if r.resource == "devicetaintrules"]
    assert rows
    for row in rows:
        assert row.versions <= {v for vs in served.values() for v in vs}, row
