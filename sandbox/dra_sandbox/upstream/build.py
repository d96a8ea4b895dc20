"""Upstream's own programs (kube-apiserver, kube-controller-manager, kube-scheduler, the kubelet, etcd, ...) built
from their published Go modules into a cache outside the repository (docs/upstream.md).

Each *component* is one Go module of ours under `sandbox/upstream/<component>/<pin>/` (go.mod and go.sum committed,
nothing of upstream's source): it requires the upstream module at the pinned version, and `go build` builds the
upstream commands from inside it. A component's binaries land in

    ${XDG_CACHE_HOME:-~/.cache}/dra-sandbox/upstream/<kubernetes tag>/<component>-<key>/bin/

where `key` hashes everything the build depends on (the module's files, the ldflags, tags, cgo, the Go version), so
a second `make upstream` finds them and an edit of go.sum builds afresh. `<kubernetes tag>/bin/` holds links to the
newest binaries of every component of that release.

Adding a component (e.g. the node's containerd): write its module under sandbox/upstream/<name>/<pin>/, a function
`Release -> Component` that names the module dir, the binaries and their ldflags, and append it to COMPONENTS.
`build_release` then builds (or finds) it with the others, under the same lock and cache rules. The DRA example
driver's kubelet plugin (the peer of `make bench-peer`) belongs to no release: `build_example_driver` builds it by
the same rules into <cache>/dra-example-driver/<its version>/.

`python -m dra_sandbox.upstream.build [--kubernetes 1.37] [build|where|module]`:
  build   build or find every component's binaries and print where they are (`make upstream K8S=1.37`)
  where   print the cached binaries' dir, or exit 3 when they are not built (nothing is built)
  module  (re)write our Go modules for that release from the pin table and run `go mod tidy` (maintainers)
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

# --- what is pinned ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    """One supported Kubernetes minor and the upstream versions built for it."""

    minor: str  # "1.37"
    kubernetes: str  # the k8s.io/kubernetes tag served by the Go module proxy
    # The tag's time as the module proxy reports it (`.info` "Time"): the binaries' buildDate, so two builds of one
    # tag are byte-identical (upstream's hack/lib/version.sh takes SOURCE_DATE_EPOCH the same way).
    released: str
    # etcd as the release's build/dependencies.yaml names it ("etcd"), built from go.etcd.io/etcd/server/v3.
    etcd: str

    @property
    def staging(self) -> str:
        """The version of the published staging modules (k8s.io/api, ...): v1.37.2 -> v0.37.2."""
        _, minor, patch = self.kubernetes.removeprefix("v").split(".")
        return f"v0.{minor}.{patch}"

    @property
    def major_minor(self) -> tuple[str, str]:
        major, minor, _ = self.kubernetes.removeprefix("v").split(".")
        return major, minor


# The newest patch of each minor the module proxy served when the pins were last moved (`go list -m -versions
# k8s.io/kubernetes`), with the etcd of that tag's build/dependencies.yaml. Moving a pin: edit the row, run
# `python -m dra_sandbox.upstream.build module --kubernetes <minor>`, commit the regenerated modules.
RELEASES: Mapping[str, Release] = MappingProxyType({
    "1.34": Release("1.34", "v1.34.4", "2026-02-10T12:53:36Z", "v3.6.5"),
    "1.35": Release("1.35", "v1.35.4", "2026-04-15T18:01:22Z", "v3.6.6"),
    "1.36": Release("1.36", "v1.36.3", "2026-07-22T18:07:38Z", "v3.6.8"),
    "1.37": Release("1.37", "v1.37.2", "2026-10-27T12:01:04Z", "v3.7.0"),
})
DEFAULT_MINOR = "1.37"

# The Kubernetes commands built from k8s.io/kubernetes (kubectl is not: the repository's kubectl comes as a wheel).
KUBERNETES_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")


def release(minor: str) -> Release:
    try:
        return RELEASES[minor]
    except KeyError:
        raise UpstreamError(
            f"Kubernetes {minor!r} is not pinned; pinned: {', '.join(RELEASES)} (sandbox/dra_sandbox/upstream/build.py"
            " RELEASES)"
        ) from None


# --- components ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Binary:
    name: str  # the file name in the cache's bin/
    package: str  # the Go package (a main package) it is built from


@dataclass(frozen=True)
class Component:
    """One Go module of ours and the binaries built from it for one release."""

    name: str  # "kubernetes", "etcd", ...
    module_dir: Path  # absolute: sandbox/upstream/<name>/<pin>
    binaries: tuple[Binary, ...]
    ldflags: tuple[str, ...] = ()  # beyond "-s -w" (upstream's release builds strip too)
    tags: tuple[str, ...] = ()
    # Upstream links the control plane and etcd statically (hack/lib/golang.sh KUBE_STATIC_BINARIES); the kubelet is
    # cgo-linked there but builds without cgo as well, and one setting for the whole module compiles its packages once.
    cgo: bool = False


def upstream_root() -> Path:
    """sandbox/upstream of this checkout (the modules are not part of the installed package)."""
    root = Path(__file__).resolve().parents[2] / "upstream"
    if not (root / "kubernetes").is_dir():
        raise UpstreamError(
            f"{root} holds no Go modules: dra_sandbox must be installed from a checkout (pip install -e ./sandbox)"
        )
    return root


def version_ldflags(rel: Release) -> tuple[str, ...]:
    """What upstream's hack/lib/version.sh sets, for both version packages: `kubectl version` and /version show the
    tag. gitCommit is set empty (its default is the unexpanded `$Format:%H$`): the module proxy does not tell a tag's
    commit."""
    major, minor = rel.major_minor
    values = {
        "gitVersion": rel.kubernetes,
        "gitCommit": "",
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "buildDate": rel.released,
    }
    return tuple(
        f"-X {package}.{key}={value}"
        for package in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version")
        for key, value in values.items()
    )


def kubernetes_component(rel: Release) -> Component:
    return Component(
        name="kubernetes",
        module_dir=upstream_root() / "kubernetes" / f"v{rel.minor}",
        binaries=tuple(Binary(cmd, f"k8s.io/kubernetes/cmd/{cmd}") for cmd in KUBERNETES_COMMANDS),
        ldflags=version_ldflags(rel),
    )


ETCD_MODULE_PATH = "dra.dev/sandbox-upstream/etcd"


def etcd_component(rel: Release) -> Component:
    return Component(
        name="etcd",
        module_dir=upstream_root() / "etcd" / rel.etcd,
        binaries=(Binary("etcd", f"{ETCD_MODULE_PATH}/{rel.etcd}"),),
    )


# containerd for the real node (docs/upstream.md "Real node"): one pin for every release. Its RELEASES.md names
# 2.4.0+ and 2.3.0+ for Kubernetes 1.37 (2.3+ for 1.36); CRI v1 serves the older kubelets as well. no_btrfs: no btrfs
# headers needed (the node's snapshotter is overlayfs).
CONTAINERD_VERSION = "v2.4.2"
CONTAINERD_COMMANDS = ("containerd", "containerd-shim-runc-v2", "ctr")


def containerd_component(rel: Release) -> Component:
    return Component(
        name="containerd",
        module_dir=upstream_root() / "containerd" / CONTAINERD_VERSION,
        binaries=tuple(Binary(cmd, f"github.com/containerd/containerd/v2/cmd/{cmd}") for cmd in CONTAINERD_COMMANDS),
        ldflags=(f"-X github.com/containerd/containerd/v2/version.Version={CONTAINERD_VERSION}",),
        tags=("no_btrfs",),
    )


# Every component `make upstream` builds for a release, in build order (the control plane first: it is what the
# upstream tests need soonest; the node's containerd last).
COMPONENTS: tuple[Callable[[Release], Component], ...] = (kubernetes_component, etcd_component, containerd_component)


# The DRA example driver's kubelet plugin (sigs.k8s.io/dra-example-driver), the peer that `make bench-peer` runs beside
# ours (docs/benchmarks.md "Beside the Go example driver"). Not part of any Kubernetes release: built on its own into
# <cache>/dra-example-driver/<version>/ by build_example_driver. The pin is the newest release the Go module proxy
# served when it was set; its module (sandbox/upstream/dra-example-driver/<pin>/) resolves every dependency to the
# version the driver's own go.mod requires. Upstream's Makefile builds it with "-s -w" (plus a version stamp its
# kubelet plugin does not read).
EXAMPLE_DRIVER_VERSION = "v0.4.0"
EXAMPLE_DRIVER_PLUGIN = "dra-example-kubeletplugin"


def example_driver_component() -> Component:
    return Component(
        name="dra-example-driver",
        module_dir=upstream_root() / "dra-example-driver" / EXAMPLE_DRIVER_VERSION,
        binaries=(Binary(EXAMPLE_DRIVER_PLUGIN, f"sigs.k8s.io/dra-example-driver/cmd/{EXAMPLE_DRIVER_PLUGIN}"),),
    )


# --- errors --------------------------------------------------------------------------------------------------


class UpstreamError(RuntimeError):
    """The binaries could not be built: a compile error, a bad pin (a defect to fix)."""


class UpstreamUnavailable(UpstreamError):
    """This machine cannot build them at all: no Go toolchain, or the module proxy cannot be reached. Tests that
    need the binaries skip with this reason; everything else runs."""


# --- the cache -----------------------------------------------------------------------------------------------


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dra-sandbox" / "upstream"


@dataclass(frozen=True)
class Built:
    """One component's binaries in the cache."""

    component: str
    version: str  # the release's Kubernetes tag
    bin_dir: Path
    binaries: Mapping[str, Path]
    seconds: float  # how long the build that made them took (the fresh build time)
    cached: bool  # found in the cache by this call


@dataclass(frozen=True)
class ReleaseBinaries:
    """Every component's binaries for one release."""

    release: Release
    components: tuple[Built, ...]
    link_dir: Path  # <cache>/<tag>/bin: a link per binary

    def path(self, name: str) -> Path:
        for built in self.components:
            if name in built.binaries:
                return built.binaries[name]
        raise KeyError(f"no binary {name!r} in {', '.join(b for c in self.components for b in c.binaries)}")


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise UpstreamUnavailable("no Go toolchain: `go` is not on PATH (https://go.dev/dl; docs/upstream.md)")
    return go


def _go_env(go: str) -> Mapping[str, str]:
    out = subprocess.run([go, "env", "-json", "GOVERSION", "GOOS", "GOARCH"], capture_output=True, text=True,
                         check=False, timeout=60)
    if out.returncode != 0:
        raise UpstreamUnavailable(f"`go env` failed: {out.stderr.strip()[-500:]}")
    parsed = json.loads(out.stdout)
    return {str(k): str(v) for k, v in parsed.items()}


def _build_env(component: Component) -> dict[str, str]:
    env = dict(os.environ)
    # Module and build caches stay where Go keeps them by default (~/go/pkg/mod, ~/.cache/go-build), shared with
    # every other Go build on the machine; -trimpath keeps this checkout's path out of the binaries.
    env["GOFLAGS"] = "-trimpath -buildvcs=false -mod=readonly"
    env["CGO_ENABLED"] = "1" if component.cgo else "0"
    return env


def cache_key(component: Component, go_env: Mapping[str, str]) -> str:
    """A digest of everything the component's binaries depend on."""
    digest = hashlib.sha256()

    def add(label: str, value: str | bytes) -> None:
        data = value.encode() if isinstance(value, str) else value
        digest.update(f"{label}\0{len(data)}\0".encode())
        digest.update(data)

    add("component", component.name)
    for binary in component.binaries:
        add("binary", f"{binary.name}={binary.package}")
    add("ldflags", " ".join(component.ldflags))
    add("tags", ",".join(component.tags))
    add("cgo", str(component.cgo))
    for key in sorted(go_env):
        add(key, go_env[key])
    for path in sorted(component.module_dir.iterdir()):
        if path.is_file() and (path.suffix == ".go" or path.name in ("go.mod", "go.sum")):
            add(path.name, path.read_bytes())
    return digest.hexdigest()[:16]


@contextmanager
def _locked(path: Path, say: Callable[[str], None]) -> Iterator[None]:
    """One build per component and key at a time, across processes (pytest workers, make upstream, up)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"upstream: waiting for another process building into {path.with_suffix('')} ...")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _cached(component: Component, bin_dir: Path) -> float | None:
    """The recorded build time when every binary is in bin_dir, else None."""
    try:
        record = json.loads((bin_dir.parent / "build.json").read_text())
    except (OSError, ValueError):
        return None
    if not all((bin_dir / b.name).is_file() for b in component.binaries):
        return None
    seconds = record.get("seconds") if isinstance(record, dict) else None
    return float(seconds) if isinstance(seconds, int | float) else 0.0


def _check_modules(go: str, component: Component, env: Mapping[str, str]) -> None:
    """Resolve (and download) every module the binaries need; an unreachable proxy makes them unavailable."""
    if not (component.module_dir / "go.mod").is_file():
        raise UpstreamError(f"{component.module_dir}/go.mod is missing (python -m dra_sandbox.upstream.build module)")
    out = subprocess.run([go, "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}",
                          *(b.package for b in component.binaries)],
                         cwd=component.module_dir, env=env, capture_output=True, text=True, check=False, timeout=1800)
    if out.returncode == 0:
        return
    tail = out.stderr.strip()[-1500:]
    offline = ("dial tcp", "no such host", "proxyconnect", "GOPROXY=off", "lookup disabled", "i/o timeout",
               "connection refused", "network is unreachable", "TLS handshake")
    if any(marker in tail for marker in offline):
        raise UpstreamUnavailable(f"the Go module proxy cannot be reached for {component.name}: {tail[-600:]}")
    raise UpstreamError(f"`go list` failed for {component.name} in {component.module_dir}:\n{tail}")


def build_component(component: Component, rel: Release, say: Callable[[str], None] = print) -> Built:
    return _build_into(component, cache_root() / rel.kubernetes, rel.kubernetes, f"Kubernetes {rel.kubernetes}", say)


def _build_into(component: Component, cache_dir: Path, version: str, purpose: str, say: Callable[[str], None]) -> Built:
    """Build (or find) the component's binaries under cache_dir/<name>-<key>/bin; `version` labels them."""
    go = _go()
    go_env = _go_env(go)
    key = cache_key(component, go_env)
    home = cache_dir / f"{component.name}-{key}"
    bin_dir = home / "bin"
    with _locked(home.with_suffix(".lock"), say):
        seconds = _cached(component, bin_dir)
        if seconds is not None:
            return Built(component.name, version, bin_dir,
                         {b.name: bin_dir / b.name for b in component.binaries}, seconds, cached=True)
        env = _build_env(component)
        started = time.monotonic()
        say(f"upstream: building {component.name} for {purpose} "
            f"({', '.join(b.name for b in component.binaries)}); a fresh build takes many minutes on 2 cores")
        _check_modules(go, component, env)
        home.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="bin.", dir=home))
        try:
            for binary in component.binaries:
                argv = ["nice", "-n", "10", go, "build", "-ldflags", " ".join(("-s", "-w", *component.ldflags)),
                        "-o", str(staging / binary.name)]
                if component.tags:
                    argv += ["-tags", ",".join(component.tags)]
                out = subprocess.run([*argv, binary.package], cwd=component.module_dir, env=env, capture_output=True,
                                     text=True, check=False, timeout=7200)
                if out.returncode != 0:
                    raise UpstreamError(f"`go build {binary.package}` failed:\n{out.stderr.strip()[-3000:]}")
                say(f"upstream:   {binary.name} built ({time.monotonic() - started:.0f} s so far)")
            shutil.rmtree(bin_dir, ignore_errors=True)
            staging.rename(bin_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        seconds = time.monotonic() - started
        record = {"component": component.name, "version": version, "key": key, "seconds": round(seconds, 1),
                  "go": go_env.get("GOVERSION", ""), "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (home / "build.json").write_text(json.dumps(record, indent=1) + "\n")
        return Built(component.name, version, bin_dir, {b.name: bin_dir / b.name for b in component.binaries},
                     seconds, cached=False)


def _link(binaries: Sequence[Built], link_dir: Path) -> None:
    """<cache>/<tag>/bin/<name> -> the component's binary, each replaced atomically."""
    link_dir.mkdir(parents=True, exist_ok=True)
    for built in binaries:
        for name, target in built.binaries.items():
            tmp = link_dir / f".{name}.{os.getpid()}"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(target)
            tmp.replace(link_dir / name)


def build_release(minor: str = DEFAULT_MINOR, say: Callable[[str], None] = print,
                  components: Sequence[Callable[[Release], Component]] = COMPONENTS) -> ReleaseBinaries:
    """Build (or find in the cache) every component's binaries for Kubernetes `minor`."""
    rel = release(minor)
    built = tuple(build_component(make(rel), rel, say) for make in components)
    link_dir = cache_root() / rel.kubernetes / "bin"
    _link(built, link_dir)
    return ReleaseBinaries(rel, built, link_dir)


def build_example_driver(say: Callable[[str], None] = print) -> Built:
    """Build (or find in the cache) the example driver's kubelet plugin at EXAMPLE_DRIVER_VERSION."""
    component = example_driver_component()
    return _build_into(component, cache_root() / component.name / EXAMPLE_DRIVER_VERSION, EXAMPLE_DRIVER_VERSION,
                       f"bench-peer, {component.name} {EXAMPLE_DRIVER_VERSION}", say)


def find_release(minor: str = DEFAULT_MINOR,
                 components: Sequence[Callable[[Release], Component]] = COMPONENTS) -> ReleaseBinaries | None:
    """The release's binaries when every component is cached (builds nothing); None otherwise."""
    rel = release(minor)
    try:
        go_env = _go_env(_go())
    except UpstreamUnavailable:
        return None
    found = []
    for make in components:
        component = make(rel)
        bin_dir = cache_root() / rel.kubernetes / f"{component.name}-{cache_key(component, go_env)}" / "bin"
        seconds = _cached(component, bin_dir)
        if seconds is None:
            return None
        found.append(Built(component.name, rel.kubernetes, bin_dir,
                           {b.name: bin_dir / b.name for b in component.binaries}, seconds, cached=True))
    return ReleaseBinaries(rel, tuple(found), cache_root() / rel.kubernetes / "bin")


# --- writing our Go modules (maintainers, when a pin moves) --------------------------------------------------

_STAGING_REPLACE = re.compile(r"^\s+(k8s\.io/[A-Za-z0-9._-]+)\s+=>\s+\./staging/", re.MULTILINE)
_GENERATED = "// Generated by `python -m dra_sandbox.upstream.build module --kubernetes {minor}`; do not edit."


def _module_cache_dir(go: str, module: str, version: str) -> Path:
    out = subprocess.run([go, "mod", "download", "-json", f"{module}@{version}"], capture_output=True, text=True,
                         check=False, timeout=1800)
    if out.returncode != 0:
        raise UpstreamUnavailable(f"`go mod download {module}@{version}` failed: {out.stderr[-600:]}")
    return Path(json.loads(out.stdout)["Dir"])


def staging_modules(kubernetes_go_mod: str) -> list[str]:
    """The staging modules a k8s.io/kubernetes go.mod replaces with ./staging/...: each needs a replace of ours."""
    return sorted(set(_STAGING_REPLACE.findall(kubernetes_go_mod)))


def kubernetes_go_mod(rel: Release, staging: Sequence[str], go_directive: str) -> str:
    lines = [_GENERATED.format(minor=rel.minor), f"module dra.dev/sandbox-upstream/kubernetes/v{rel.minor}", "",
             f"go {go_directive}", "", f"godebug default=go{'.'.join(go_directive.split('.')[:2])}", "",
             f"require k8s.io/kubernetes {rel.kubernetes}", "", "replace ("]
    lines += [f"\t{name} => {name} {rel.staging}" for name in staging]
    return "\n".join([*lines, ")", ""])


KUBERNETES_TOOLS_GO = """//go:build tools

// Package tools names the upstream commands this module builds, so that `go mod tidy` keeps their dependencies.
package tools

import (
{imports}
)
"""

ETCD_MAIN_GO = """// Command etcd: the pinned go.etcd.io/etcd/server/v3's server, for the sandbox's control plane.
package main

import (
\t"os"

\t"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
"""


def write_modules(minor: str, say: Callable[[str], None] = print) -> None:
    """Write our kubernetes and etcd modules for `minor` from the pin table and tidy them (go.sum)."""
    go = _go()
    rel = release(minor)
    source = _module_cache_dir(go, "k8s.io/kubernetes", rel.kubernetes)
    upstream_mod = (source / "go.mod").read_text()
    go_line = re.search(r"^go (\S+)$", upstream_mod, re.MULTILINE)
    if go_line is None:
        raise UpstreamError(f"{source}/go.mod has no go directive")
    deps = (source / "build" / "dependencies.yaml").read_text()
    etcd = re.search(r'- name: "etcd"\s*\n\s*version: (\S+)', deps)
    if etcd is None or f"v{etcd.group(1)}" != rel.etcd:
        raise UpstreamError(f"{rel.kubernetes} names etcd {etcd.group(1) if etcd else '?'} in build/dependencies.yaml;"
                            f" the pin table says {rel.etcd}: update RELEASES")
    k8s = upstream_root() / "kubernetes" / f"v{rel.minor}"
    k8s.mkdir(parents=True, exist_ok=True)
    (k8s / "go.mod").write_text(kubernetes_go_mod(rel, staging_modules(upstream_mod), go_line.group(1)))
    imports = "\n".join(f'\t_ "k8s.io/kubernetes/cmd/{cmd}"' for cmd in KUBERNETES_COMMANDS)
    (k8s / "tools.go").write_text(KUBERNETES_TOOLS_GO.format(imports=imports))
    etcd_dir = upstream_root() / "etcd" / rel.etcd
    etcd_dir.mkdir(parents=True, exist_ok=True)
    (etcd_dir / "go.mod").write_text("\n".join([
        _GENERATED.format(minor=rel.minor),
        f"module {ETCD_MODULE_PATH}/{rel.etcd}", "", f"go {go_line.group(1)}", "",
        f"require go.etcd.io/etcd/server/v3 {rel.etcd}", ""]))
    (etcd_dir / "main.go").write_text(ETCD_MAIN_GO)
    for directory in (k8s, etcd_dir):
        say(f"upstream: go mod tidy in {directory}")
        out = subprocess.run([go, "mod", "tidy"], cwd=directory, capture_output=True, text=True, check=False,
                             timeout=1800, env={**os.environ, "GOFLAGS": "-mod=mod"})
        if out.returncode != 0:
            raise UpstreamError(f"`go mod tidy` failed in {directory}:\n{out.stderr[-2000:]}")


# --- the command ---------------------------------------------------------------------------------------------


def _describe(binaries: ReleaseBinaries) -> str:
    lines = [f"upstream: Kubernetes {binaries.release.kubernetes} binaries in {binaries.link_dir}"]
    for built in binaries.components:
        how = "cached" if built.cached else "built"
        lines.append(f"  {built.component:<11} {how}; fresh build took {built.seconds:.0f} s; {built.bin_dir}")
        lines += [f"    {name}" for name in built.binaries]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra_sandbox.upstream.build", description=__doc__.split("\n")[0])
    parser.add_argument("--kubernetes", default=DEFAULT_MINOR, help=f"minor version: {', '.join(RELEASES)}")
    parser.add_argument("action", nargs="?", default="build", choices=("build", "where", "module"))
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        if args.action == "module":
            write_modules(args.kubernetes, say)
            return 0
        if args.action == "where":
            found = find_release(args.kubernetes)
            if found is None:
                print(f"upstream: Kubernetes {args.kubernetes} is not built (make upstream K8S={args.kubernetes})",
                      file=sys.stderr)
                return 3
            print(found.link_dir)
            return 0
        started = time.monotonic()
        built = build_release(args.kubernetes, say)
        say(_describe(built))
        say(f"upstream: done in {time.monotonic() - started:.1f} s")
        return 0
    except UpstreamUnavailable as exc:
        print(f"upstream: NOT AVAILABLE on this machine: {exc}", file=sys.stderr)
        return 4
    except UpstreamError as exc:
        print(f"upstream: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
