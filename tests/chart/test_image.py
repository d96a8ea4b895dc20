"""Dockerfile and .dockerignore (no Docker engine here: structure checks), and scripts/install-helm.sh."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.chart.helm import HELM3, HELM4, MISSING_HINT, REPO

DOCKERFILE = REPO / "Dockerfile"


def stages() -> list[list[str]]:
    """Dockerfile instructions (continuations joined), split by FROM."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    out: list[list[str]] = []
    for line in lines:
        if line.upper().startswith("FROM "):
            out.append([])
        if out:
            out[-1].append(line)
    return out


def test_two_stages_on_slim_python_3_11_pinned_by_digest() -> None:
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.MULTILINE)
    assert base and re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", base.group(1))
    builder, final = stages()
    assert builder[0] == "FROM ${PYTHON_IMAGE} AS builder"
    assert final[0] == "FROM ${PYTHON_IMAGE}"


def test_the_builder_fetches_only_locked_hashed_files() -> None:
    builder = "\n".join(stages()[0])
    assert "pip download --only-binary=:all: --require-hashes --no-deps -r requirements/image.lock -d /wheels" in builder
    assert "/build/bin/pip install --require-hashes --no-deps -r requirements/build.lock" in builder
    assert "/build/bin/pip wheel --no-build-isolation --no-deps --wheel-dir /wheels ." in builder
    assert not re.search(r"pip (install|wheel|download)(?![^\n]*--(require-hashes|no-build-isolation))", builder)


def test_final_stage_installs_the_locked_wheels_offline_and_drops_the_installer() -> None:
    final = stages()[-1]
    body = "\n".join(final)
    assert "--mount=type=bind,from=builder,source=/wheels" in body, "wheels must not become a layer"
    assert "pip install --no-index --find-links=/wheels --require-hashes --no-deps -r /tmp/image.lock" in body
    assert re.search(r"pip install --no-index --no-deps /wheels/dra_driver-\*\.whl", body)
    # pip and setuptools leave with the install step: the final image cannot install anything.
    assert "pip uninstall -y -q pip setuptools wheel" in body and "dpkg --purge python3-pip python3-setuptools" in body
    assert "! python3 -c 'import pip'" in body and "! python3 -c 'import setuptools'" in body
    assert not re.search(r"\b(apt-get|apk|gcc|build-essential|make)\b", body)
    assert not [line for line in final if line.upper().startswith(("COPY", "ADD"))], "only the mounts bring files"


def test_the_oci_labels_are_set_by_the_dockerfile() -> None:
    final = "\n".join(stages()[-1])
    for key, value in {
        "source": "${SOURCE}",
        "revision": "${REVISION}",
        "version": "${VERSION}",
        "created": "${CREATED}",
        "licenses": "Apache-2.0",
        "base.name": "${PYTHON_IMAGE}",
    }.items():
        assert f'org.opencontainers.image.{key}="{value}"' in final, key
    for arg in ("VERSION", "REVISION", "CREATED", "SOURCE", "PYTHON_IMAGE"):
        assert re.search(rf"^ARG {arg}\b", final, re.MULTILINE), arg
    # make image passes them; the builder stage is labelled so that it can delete it afterwards.
    script = (REPO / "scripts/build-image.sh").read_text()
    for arg in ("VERSION", "REVISION", "CREATED", "SOURCE", "PYTHON_IMAGE"):
        assert f'--build-arg "{arg}=' in script, arg
    assert 'LABEL io.dra-driver.build-stage="builder"' in "\n".join(stages()[0])
    assert 'image prune --force --filter "label=io.dra-driver.build-stage=builder"' in script


def test_the_license_is_apache_2() -> None:
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert 'license = "Apache-2.0"' in (REPO / "pyproject.toml").read_text()


def test_non_root_user_and_entrypoint() -> None:
    final = stages()[-1]
    [user] = [line for line in final if line.startswith("USER ")]
    uid = user.split()[1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric, so runAsNonRoot can verify it
    [entrypoint] = [line for line in final if line.startswith("ENTRYPOINT ")]
    assert json.loads(entrypoint.removeprefix("ENTRYPOINT ")) == ["dra-driver"]
    # The chart's controller runs as this uid; keep them equal.
    controller = (REPO / "charts/dra-driver/templates/controller.yaml").read_text()
    assert f"runAsUser: {uid}" in controller


def dockerignore_excludes(path: str) -> bool:
    """Docker's rule: patterns in order, the last one matching the path (or a parent directory) wins."""
    excluded = False
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.removeprefix("!").strip("/")
        regex = re.escape(pattern).replace(r"\*\*", ".*").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(re.fullmatch(regex, p) for p in prefixes):
            excluded = not negate
    return excluded


def test_dockerignore_keeps_what_the_build_copies() -> None:
    builder = stages()[0]
    sources = [line.split()[1:-1] for line in builder if line.startswith("COPY ") and "--from" not in line]
    copied = [s for group in sources for s in group]
    assert {"dra_driver", "pyproject.toml", "LICENSE", "requirements/image.lock", "requirements/build.lock"} <= set(copied)
    files = []
    for source in copied:
        path = REPO / source
        if path.is_dir():
            files += [str(p.relative_to(REPO)) for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        else:
            assert path.exists(), source
            files.append(source)
    kept_out = [f for f in files if dockerignore_excludes(f)]
    assert not kept_out, f".dockerignore drops files the Dockerfile copies: {kept_out[:5]}"


@pytest.mark.parametrize(
    "path",
    [".venv/bin/python", ".git/HEAD", ".tools/bin/helm", "tests/chart/test_image.py", "dra_driver/__pycache__/x.pyc"],
)
def test_dockerignore_leaves_out_local_state(path: str) -> None:
    assert dockerignore_excludes(path)


def test_install_helm_is_idempotent(tmp_path: Path) -> None:
    """With working binaries in place the script downloads nothing and says so."""
    if not (HELM4.exists() and HELM3.exists()):
        pytest.skip(f"helm binaries absent: {MISSING_HINT}")
    tools = tmp_path / "tools"
    (tools / "bin").mkdir(parents=True)
    (tools / "bin/helm").symlink_to(HELM4)
    (tools / "bin/helm3").symlink_to(HELM3)
    proc = subprocess.run(
        ["bash", str(REPO / "scripts/install-helm.sh"), str(tools)],
        # An unusable interpreter proves no download is attempted.
        env={**os.environ, "PYTHON": "/nonexistent/python"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"bin/helm already works \(v4\.", proc.stdout)
    assert re.search(r"bin/helm3 already works \(v3\.", proc.stdout)


def test_makefile_helm_target_runs_the_script() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^helm:\n\tbash scripts/install-helm\.sh$", makefile, re.MULTILINE)


def build_context(dest: Path) -> Path:
    """The files the Dockerfile's builder stage copies, laid out as in its WORKDIR (Docker's COPY rules:
    a directory's contents go into the target; a target ending in / receives files by their name)."""
    for line in stages()[0]:
        if not line.startswith("COPY ") or "--from" in line:
            continue
        *sources, target = line.split()[1:]
        for source in sources:
            src = REPO / source
            if src.is_dir():
                shutil.copytree(src, dest / target, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
            elif target.endswith("/"):
                (dest / target).mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / target / src.name)
            else:
                (dest / target).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / target)
    return dest


def test_the_image_wheel_holds_the_product_only(tmp_path: Path) -> None:
    """Build the wheel exactly from what the Dockerfile copies: product code and data only, no test bench,
    and runtime dependencies without any test-only or bench-only package."""
    context = build_context(tmp_path / "src")
    assert not (context / "sandbox").exists() and not (context / "tests").exists()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "w"),
            str(context),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    [wheel] = list((tmp_path / "w").glob("dra_driver-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = zf.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"dra_driver"}, tops
    assert "dra_driver/nvml/fake/presets/dgx-h100.json" in names
    assert not [n for n in names if "deviceclasses" in n]  # the chart installs the classes; the bench reads them
    assert not [n for n in names if "sandbox" in n or n.startswith(("tests/", "bench/"))]
    requires = {
        re.split(r"[<>=!~; \[]", line.removeprefix("Requires-Dist: "))[0].lower()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist: ") and "extra ==" not in line
    }
    assert requires == {
        "grpcio",
        "protobuf",
        "kubernetes",
        "urllib3",
        "nvidia-ml-py",
        "structlog",
        "prometheus-client",
        "pyyaml",
        "pydantic",
        "google-re2",
        "kopf",
        "aiohttp",  # the controller's webhook server imports it directly (kopf brings the same one)
        "msgspec",
    }, requires
    assert entry_points.split("[console_scripts]")[1].split() == ["dra-driver", "=", "dra_driver.cli:main"]
