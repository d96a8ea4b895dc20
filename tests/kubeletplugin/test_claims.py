"""Reading ResourceClaims: the URL can only ever name the claim asked for, and a LIST walks every page."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.kubeletplugin.claims import KubeClaimSource
from dra_driver.kubeletplugin.names import InvalidNameError


class _Rest:
    def __init__(self, pages: list[dict[str, Any]] | None = None) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self._pages = pages or []

    def get(self, path: str, *, timeout: float | None = None) -> dict[str, Any] | None:
        self.calls.append(("GET", path, {}))
        return {}

    def request(self, method: str, path: str, *, query: dict[str, Any] | None = None, **_: Any) -> dict[str, Any]:
        self.calls.append((method, path, dict(query or {})))
        return self._pages.pop(0)


def test_get_claim_names_exactly_that_claim() -> None:
    rest = _Rest()
    KubeClaimSource(rest).get_claim("team-a", "train.run-1")  # type: ignore[arg-type]
    assert rest.calls == [("GET", "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/train.run-1", {})]


@pytest.mark.parametrize(
    ("namespace", "name", "field"),
    [
        ("default", "c1?watch=true&x=1", "name"),
        ("default", "c1#frag", "name"),
        ("default", "..", "name"),
        ("default", "a/b", "name"),
        ("default", "c1%3Fwatch", "name"),
        ("a/b", "c1", "namespace"),
        ("", "c1", "namespace"),
    ],
)
def test_get_claim_refuses_names_that_would_change_the_url(namespace: str, name: str, field: str) -> None:
    """Issue 12 finding 4 (defence in depth below the gRPC check): nothing reaches the wire."""
    rest = _Rest()
    with pytest.raises(InvalidNameError, match=f"ResourceClaim {field}: "):
        KubeClaimSource(rest).get_claim(namespace, name)  # type: ignore[arg-type]
    assert rest.calls == []


def test_list_claims_follows_continue_tokens() -> None:
    rest = _Rest(
        [
            {"items": [{"metadata": {"name": "a"}}], "metadata": {"continue": "t1"}},
            {"items": [{"metadata": {"name": "b"}}, "junk"], "metadata": {}},
        ]
    )
    items = KubeClaimSource(rest).list_claims()  # type: ignore[arg-type]
    assert [i["metadata"]["name"] for i in items] == ["a", "b"]
    assert [c[2] for c in rest.calls] == [{"limit": 500}, {"limit": 500, "continue": "t1"}]
    assert {c[1] for c in rest.calls} == {"/apis/resource.k8s.io/v1/resourceclaims"}
