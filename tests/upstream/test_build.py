"""dra_sandbox.upstream.build: the pinned modules as committed, the cache and its key, and a real `go build` of a
tiny component through the same path the upstream binaries take (docs/upstream.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dra_sandbox.upstream import build
from dra_sandbox.upstream.build import (
    RELEASES,
    Binary,
    Component,
    UpstreamUnavailable,
    build_component,
    cache_key,
    etcd_component,
    kubernetes_component,
    staging_modules,
    version_ldflags,
)


@pytest.mark.parametrize("minor", sorted(RELEASES))
def test_the_committed_modules_pin_the_release(minor: str) -> None:
    rel = RELEASES[minor]
    k8s = kubernetes_component(rel).module_dir
    go_mod = (k8s / "go.mod").read_text()
    assert re.search(rf"^require k8s.io/kubernetes {re.escape(rel.kubernetes)}$", go_mod, re.M)
    replaces = dict(re.findall(r"^\t(k8s\.io/\S+) => \1 (v\S+)$", go_mod, re.M))
    assert len(replaces) >= 31 and set(replaces.values()) == {rel.staging}, replaces
    assert {"k8s.io/api", "k8s.io/apiserver", "k8s.io/client-go", "k8s.io/kubelet"} <= set(replaces)
    assert "=> ./" not in go_mod  # nothing of upstream's tree is referenced
    assert f"{rel.kubernetes}/go.mod h1:" in (k8s / "go.sum").read_text()
    tools = (k8s / "tools.go").read_text()
    assert all(f'"k8s.io/kubernetes/cmd/{cmd}"' in tools for cmd in build.KUBERNETES_COMMANDS)
    etcd = etcd_component(rel).module_dir
    assert f"require go.etcd.io/etcd/server/v3 {rel.etcd}" in (etcd / "go.mod").read_text()
    assert f"go.etcd.io/etcd/server/v3 {rel.etcd} h1:" in (etcd / "go.sum").read_text()


def test_the_staging_list_is_read_from_kubernetes_go_mod() -> None:
    text = ("replace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n\tk8s.io/streaming => ./staging/src/k8s.io/streaming"
            "\n\tgithub.com/x/y => github.com/x/y v1.0.0\n)\n")
    assert staging_modules(text) == ["k8s.io/api", "k8s.io/streaming"]


def test_version_stamps_name_the_tag_in_both_version_packages() -> None:
    flags = version_ldflags(RELEASES["1.37"])
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X {package}.gitVersion=v1.37.2" in flags
        assert f"-X {package}.gitMinor=37" in flags
        assert f"-X {package}.buildDate=2026-10-27T12:01:04Z" in flags


def _hello(tmp_path: Path) -> Component:
    module = tmp_path / "hello"
    module.mkdir()
    (module / "go.mod").write_text("module dra.dev/sandbox-upstream/hello\n\ngo 1.24\n")
    (module / "go.sum").write_text("")
    (module / "main.go").write_text('package main\n\nimport "fmt"\n\nvar greeting = "unset"\n\n'
                                    "func main() { fmt.Println(greeting) }\n")
    return Component("hello", module, (Binary("hello", "dra.dev/sandbox-upstream/hello"),),
                     ldflags=("-X main.greeting=stamped",))


def test_the_key_changes_with_go_sum_and_ldflags(tmp_path: Path) -> None:
    component = _hello(tmp_path)
    env = {"GOVERSION": "go1.26.8", "GOOS": "linux", "GOARCH": "amd64"}
    key = cache_key(component, env)
    assert cache_key(component, env) == key
    (component.module_dir / "go.sum").write_text("example.com/x v1.0.0 h1:abc=\n")
    assert cache_key(component, env) != key
    assert cache_key(component, {**env, "GOVERSION": "go1.27.0"}) != cache_key(component, env)
    other = Component(component.name, component.module_dir, component.binaries, ldflags=("-X main.greeting=other",))
    assert cache_key(other, env) != cache_key(component, env)


@pytest.mark.skipif(shutil.which("go") is None, reason="no Go toolchain")
def test_a_component_is_built_once_then_found_in_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Go's own build cache stays where it is (it follows XDG_CACHE_HOME otherwise: an empty one compiles the
    # standard library afresh, minutes on 2 cores).
    gocache = subprocess.run(["go", "env", "GOCACHE"], capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.setenv("GOCACHE", gocache)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    component = _hello(tmp_path)
    said: list[str] = []
    first = build_component(component, RELEASES["1.37"], said.append)
    assert not first.cached and any("building hello" in line for line in said)
    binary = first.binaries["hello"]
    assert binary.is_relative_to(tmp_path / "cache" / "dra-sandbox" / "upstream" / "v1.37.2")
    assert subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout == "stamped\n"
    again = build_component(component, RELEASES["1.37"], said.append)
    # The cache's record keeps the fresh build's time in tenths of a second (a relative tolerance failed a build of
    # 0.225 s, recorded as 0.2).
    assert again.cached and again.binaries == first.binaries and again.seconds == round(first.seconds, 1)
    # An edited module builds afresh, beside the first.
    (component.module_dir / "main.go").write_text(
        (component.module_dir / "main.go").read_text().replace("Println(greeting)", 'Println(greeting + "!")'))
    third = build_component(component, RELEASES["1.37"], said.append)
    assert not third.cached and third.bin_dir != first.bin_dir
    assert subprocess.run([str(third.binaries["hello"])], capture_output=True, text=True).stdout == "stamped!\n"


def test_without_go_the_build_is_unavailable_naming_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UpstreamUnavailable, match="no Go toolchain: `go` is not on PATH"):
        build_component(_hello(tmp_path), RELEASES["1.37"], lambda _: None)
    assert build.find_release("1.37") is None


def test_an_unpinned_release_is_refused_naming_the_pinned_ones() -> None:
    with pytest.raises(build.UpstreamError, match=r"Kubernetes '1.33' is not pinned; pinned: 1.34, 1.35, 1.36, 1.37"):
        build.release("1.33")
