"""The real node's container images, made here without a registry (docs/upstream.md "Real node"): the pod sandbox
image and a small workload image, written as OCI image layout archives and imported into the node's containerd
with `ctr images import`.

- `PAUSE_IMAGE`: one static binary of ours (`PAUSE_SOURCE`, `gcc -static`) that sleeps until SIGTERM or SIGINT and
  reaps the zombies a pod's shared PID namespace hands it. containerd's CRI runs it as every pod's sandbox
  container (its `pinned_images.sandbox`, dra_sandbox/upstream/containerd.py).
- `BUSYBOX_IMAGE`: Debian's busybox-static as `/bin/busybox` with a link per applet a spec written for a cluster
  needs (`sh`, `env`, `cat`, `sleep`, ...), so such a spec needs only the image name.

An archive is byte-for-byte the same for the same inputs (every tar header and the gzip header carry time 0), so an
image's digest changes only when its content does and re-importing it is a no-op for containerd.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_sandbox.runtime.staticbuild import static_binary

PAUSE_IMAGE = "localhost/dra-sandbox/pause:3.10"
BUSYBOX_IMAGE = "localhost/dra-sandbox/busybox:latest"
BUSYBOX_PATHS = (Path("/bin/busybox"), Path("/usr/bin/busybox"))  # where Debian's busybox-static puts it
# The applets linked into the workload image's /bin: what specs written for a cluster run (`sh -c`, `env`, `cat`,
# `sleep`) and what a person debugging a pod with `kubectl exec` reaches for first.
BUSYBOX_APPLETS = ("sh", "env", "printenv", "cat", "sleep", "ls", "echo", "grep", "head", "tail", "wc", "id", "ps",
                   "mount", "test", "true", "false", "hostname", "ip", "wget", "vi", "find", "stat", "df")

PAUSE_SOURCE = r"""
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, 0, WNOHANG) > 0) {}
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = stop;
    sigaction(SIGINT, &sa, 0);
    sigaction(SIGTERM, &sa, 0);
    sa.sa_handler = reap;
    sa.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, 0);
    for (;;) pause();
}
"""

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
# containerd's importer names an image after this annotation of its index entry (core/images/annotations.go).
CONTAINERD_NAME_ANNOTATION = "io.containerd.image.name"
OCI_REF_NAME_ANNOTATION = "org.opencontainers.image.ref.name"


class ImageError(RuntimeError):
    """An image could not be made or imported (the reason names the missing tool or what containerd said)."""


@dataclass(frozen=True)
class Entry:
    """One entry of an image layer: a directory, a regular file (its bytes) or a symlink."""

    path: str  # relative, no leading slash: "bin/sh"
    kind: str  # "dir" | "file" | "symlink"
    mode: int = 0o755
    data: bytes = b""
    target: str = ""  # a symlink's target


def _header(entry: Entry) -> tarfile.TarInfo:
    info = tarfile.TarInfo(entry.path)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = entry.mode
    if entry.kind == "dir":
        info.type = tarfile.DIRTYPE
    elif entry.kind == "symlink":
        info.type = tarfile.SYMTYPE
        info.linkname = entry.target
    elif entry.kind == "file":
        info.size = len(entry.data)
    else:
        raise ImageError(f"layer entry {entry.path}: kind {entry.kind!r} is not dir, file or symlink")
    return info


def layer_tar(entries: Sequence[Entry]) -> bytes:
    """An uncompressed layer (POSIX tar) of `entries`, in the order given (parents first)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            tar.addfile(_header(entry), io.BytesIO(entry.data) if entry.kind == "file" else None)
    return out.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(doc: object) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def oci_archive(name: str, entries: Sequence[Entry], entrypoint: Sequence[str], cmd: Sequence[str] = ()) -> bytes:
    """An OCI image layout as one tar (`oci-layout`, `index.json`, `blobs/sha256/...`) holding the linux/amd64 image
    `name` of one layer; `ctr images import` reads it and names the image from the index entry's annotation."""
    repository, _, tag = name.rpartition(":")
    if not repository or "/" in tag:
        raise ImageError(f"image name {name!r} has no tag (write e.g. localhost/dra-sandbox/busybox:latest)")
    layer = layer_tar(entries)
    layer_gz = gzip.compress(layer, compresslevel=6, mtime=0)
    config = _json({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                   "Entrypoint": list(entrypoint) or None, "Cmd": list(cmd) or None, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
        "history": [{"created_by": "dra_sandbox.upstream.images", "created": "1970-01-01T00:00:00Z"}],
        "created": "1970-01-01T00:00:00Z",
    })
    manifest = _json({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": _digest(config), "size": len(config)},
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": _digest(layer_gz), "size": len(layer_gz)}],
    })
    index = _json({
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [{
            "mediaType": MANIFEST_MEDIA_TYPE, "digest": _digest(manifest), "size": len(manifest),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {CONTAINERD_NAME_ANNOTATION: name, OCI_REF_NAME_ANNOTATION: tag},
        }],
    })
    blobs = [Entry("blobs", "dir"), Entry("blobs/sha256", "dir")]
    blobs += [Entry(f"blobs/sha256/{_digest(blob).removeprefix('sha256:')}", "file", 0o644, blob)
              for blob in (layer_gz, config, manifest)]
    return layer_tar([Entry("oci-layout", "file", 0o644, b'{"imageLayoutVersion":"1.0.0"}'),
                      Entry("index.json", "file", 0o644, index), *blobs])


# --- the two images ------------------------------------------------------------------------------------------

_BASE_DIRS = (("dev", 0o755), ("etc", 0o755), ("proc", 0o555), ("sys", 0o555), ("tmp", 0o1777), ("root", 0o700),
              ("var", 0o755), ("bin", 0o755))
_ETC = (Entry("etc/passwd", "file", 0o644, b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n"),
        Entry("etc/group", "file", 0o644, b"root:x:0:\nnogroup:x:65534:\n"))


def base_entries() -> list[Entry]:
    return [Entry(path, "dir", mode) for path, mode in _BASE_DIRS] + list(_ETC)


def busybox_binary() -> Path:
    for path in BUSYBOX_PATHS:
        if path.is_file() and os.access(path, os.X_OK) and _is_static(path):
            return path
    raise ImageError("no static busybox (Debian's busybox-static: /bin/busybox); `make system-deps` installs it")


def _is_static(path: Path) -> bool:
    """An ELF without a program interpreter (PT_INTERP): runs in an image that has no dynamic loader."""
    with open(path, "rb") as elf:
        head = elf.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit only: the images are linux/amd64
            return False
        phoff = int.from_bytes(head[32:40], "little")
        phentsize = int.from_bytes(head[54:56], "little")
        phnum = int.from_bytes(head[56:58], "little")
        elf.seek(phoff)
        table = elf.read(phentsize * phnum)
    return all(int.from_bytes(table[i * phentsize:i * phentsize + 4], "little") != 3 for i in range(phnum))


def busybox_archive(busybox: Path | None = None) -> bytes:
    binary = (busybox or busybox_binary()).read_bytes()
    entries = [*base_entries(), Entry("bin/busybox", "file", 0o755, binary)]
    entries += [Entry(f"bin/{applet}", "symlink", 0o777, target="busybox") for applet in BUSYBOX_APPLETS]
    return oci_archive(BUSYBOX_IMAGE, entries, entrypoint=(), cmd=("sh",))


def pause_binary(cache_dir: Path, gcc: str = "gcc") -> Path:
    """The static pause binary, compiled once per source into `cache_dir`; StaticBuildError where it cannot be."""
    return static_binary(cache_dir, "pause", PAUSE_SOURCE, flags=("-Os", "-s"), gcc=gcc)


def pause_archive(binary: Path) -> bytes:
    entries = [Entry(path, "dir", mode) for path, mode in _BASE_DIRS if path != "bin"]
    entries.append(Entry("pause", "file", 0o755, binary.read_bytes()))
    return oci_archive(PAUSE_IMAGE, entries, entrypoint=("/pause",))


# --- importing -----------------------------------------------------------------------------------------------


def import_archive(ctr: Path, address: Path, archive: bytes, name: str, namespace: str = "k8s.io") -> None:
    """`ctr images import` of one archive into containerd at `address` (unpacked for overlayfs, which the CRI uses)."""
    with tempfile.NamedTemporaryFile(prefix="dra-sandbox-image-", suffix=".tar") as tmp:
        tmp.write(archive)
        tmp.flush()
        out = subprocess.run([str(ctr), "--address", str(address), "--namespace", namespace, "images", "import",
                              "--snapshotter", "overlayfs", tmp.name], capture_output=True, text=True, timeout=300,
                             check=False)
    if out.returncode != 0:
        raise ImageError(f"`ctr images import` of {name} failed: {(out.stderr or out.stdout).strip()[-800:]}")


def image_names(ctr: Path, address: Path, namespace: str = "k8s.io") -> list[str]:
    out = subprocess.run([str(ctr), "--address", str(address), "--namespace", namespace, "images", "list", "-q"],
                         capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0:
        raise ImageError(f"`ctr images list` failed: {(out.stderr or out.stdout).strip()[-800:]}")
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def import_node_images(ctr: Path, address: Path, cache_dir: Path) -> tuple[str, ...]:
    """Both images into the node's containerd; returns their names."""
    import_archive(ctr, address, pause_archive(pause_binary(cache_dir)), PAUSE_IMAGE)
    import_archive(ctr, address, busybox_archive(), BUSYBOX_IMAGE)
    names = image_names(ctr, address)
    missing = [n for n in (PAUSE_IMAGE, BUSYBOX_IMAGE) if n not in names]
    if missing:
        raise ImageError(f"containerd lists no {', '.join(missing)} after the import (it lists {', '.join(names)})")
    return PAUSE_IMAGE, BUSYBOX_IMAGE
