#!/usr/bin/env bash
# `make locks`: regenerate the hash-pinned dependency locks from pyproject.toml (requirements/README.md).
#   requirements/image.lock  the product's runtime dependencies: the image installs exactly these (Dockerfile)
#   requirements/build.lock  the build backend of the project's wheel (the image's builder stage)
#   requirements/dev.lock    those plus the `dev` extra and requirements/dev.in: `make venv` (and so CI) installs these
# pip-tools runs in a throw-away venv under .image/; the resolution is for the Python running this (3.11).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
work=${LOCKS_WORK_DIR:-.image/locks-venv}
rm -rf "$work"
"$PYTHON" -m venv "$work"
"$work/bin/pip" install -q pip-tools
common=(--generate-hashes --strip-extras --no-emit-index-url --no-emit-find-links --quiet)
"$work/bin/pip-compile" "${common[@]}" -o requirements/image.lock pyproject.toml
"$work/bin/pip-compile" "${common[@]}" --allow-unsafe -o requirements/build.lock requirements/build.in
"$work/bin/pip-compile" "${common[@]}" --allow-unsafe --extra dev -o requirements/dev.lock pyproject.toml requirements/dev.in
rm -rf "$work"
echo "locks: requirements/image.lock and requirements/dev.lock regenerated; run make venv and the tests"
