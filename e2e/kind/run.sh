#!/usr/bin/env bash
# The e2e scenarios on a real Kubernetes cluster made with kind (e2e/README.md, "A real cluster with kind"):
# the driver's image, a kind cluster for one Kubernetes version (e2e/kind/cluster-<version>.yaml: the DRA
# feature gates and beta APIs that version needs, CDI in containerd), the Helm chart with fake GPUs (dgx-h100
# on the worker labelled h100, dgx-a100 on the one labelled a100), then `dra-sandbox e2e --kubeconfig ...`.
# Needs kind, kubectl, helm, docker or podman, and the repository's .venv (`make venv`).
#
#   K8S_VERSION=1.35 e2e/kind/run.sh     # 1.34 | 1.35 | 1.36 (default) | 1.37; deletes the cluster at the end
#   KEEP_CLUSTER=1 e2e/kind/run.sh       # keep it (a second run reuses it)
#   e2e/kind/run.sh --only shared-claim  # extra arguments go to `dra-sandbox e2e`
#   DRY_RUN=1 e2e/kind/run.sh            # print each command instead of running it (needs none of the tools)
#
# Environment: K8S_VERSION (1.36), KIND_NODE_IMAGE (overrides the config's node image), CLUSTER_NAME (dra-e2e),
# IMAGE_REPO (localhost/dra-driver), IMAGE_TAG (e2e), CONTAINER_TOOL (docker if installed, else podman),
# KEEP_CLUSTER (0), DRA_SANDBOX (the dra-sandbox that runs the scenarios; default .venv/bin/dra-sandbox), DRY_RUN (0).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
version="${K8S_VERSION:-1.36}"
config="$here/cluster-${version}.yaml"
cluster="${CLUSTER_NAME:-dra-e2e}"
image_repo="${IMAGE_REPO:-localhost/dra-driver}"
image_tag="${IMAGE_TAG:-e2e}"
image="${image_repo}:${image_tag}"
keep="${KEEP_CLUSTER:-0}"
dry="${DRY_RUN:-0}"
namespace="dra-driver"
work="${TMPDIR:-/tmp}/${cluster}"
kubeconfig="$work/kubeconfig"
archive="$work/image.tar"
sandbox="${DRA_SANDBOX:-$repo/.venv/bin/dra-sandbox}"

die() { echo "run.sh: $*" >&2; exit 1; }
# Every command that changes something goes through `run`: DRY_RUN=1 prints it (shell-quoted) instead.
run() {
  if [[ "$dry" == 1 ]]; then printf '%q ' "$@"; echo; else "$@"; fi
}

[[ -f "$config" ]] || die "K8S_VERSION=$version is not supported: no $config (have: $(cd "$here" && ls cluster-*.yaml | sed 's/cluster-\(.*\)\.yaml/\1/' | tr '\n' ' '))"
if [[ -z "${CONTAINER_TOOL:-}" ]]; then
  if command -v docker >/dev/null 2>&1; then CONTAINER_TOOL=docker; else CONTAINER_TOOL=podman; fi
fi
tool="$CONTAINER_TOOL"
[[ "$tool" == docker || "$tool" == podman ]] || die "CONTAINER_TOOL must be docker or podman, not '$tool'"
if [[ "$tool" == podman ]]; then export KIND_EXPERIMENTAL_PROVIDER="${KIND_EXPERIMENTAL_PROVIDER:-podman}"; fi
if [[ "$dry" != 1 ]]; then
  for need in "$tool" kind kubectl helm; do
    command -v "$need" >/dev/null 2>&1 || die "'$need' is required but not on PATH (e2e/README.md says what to install)"
  done
  [[ -x "$sandbox" ]] || die "$sandbox is missing: run \`make venv\` (or set DRA_SANDBOX)"
fi
node_image_args=()
if [[ -n "${KIND_NODE_IMAGE:-}" ]]; then node_image_args=(--image "$KIND_NODE_IMAGE"); fi
run mkdir -p "$work"

echo "== building image $image with $tool"
if [[ "$tool" == docker ]]; then
  run docker build --tag "$image" "$repo"
else
  # The one podman build (docs/image.md): debootstrap base or PYTHON_IMAGE, runc where crun cannot run.
  run env IMAGE="$image" bash "$repo/scripts/build-image.sh"
fi
run "$tool" save --output "$archive" "$image"

created=0
if [[ "$dry" != 1 ]] && kind get clusters 2>/dev/null | grep -qx "$cluster"; then
  echo "== reusing kind cluster $cluster"
  kind get kubeconfig --name "$cluster" >"$kubeconfig"
else
  echo "== creating kind cluster $cluster (Kubernetes $version, $config)"
  run kind create cluster --name "$cluster" --config "$config" "${node_image_args[@]}" \
    --kubeconfig "$kubeconfig" --wait 180s
  created=1
fi
cleanup() {
  if [[ "$dry" != 1 && "$created" == 1 && "$keep" != 1 ]]; then
    echo "== deleting kind cluster $cluster (KEEP_CLUSTER=1 keeps it)"
    kind delete cluster --name "$cluster" || true
  fi
}
trap cleanup EXIT

echo "== loading the image into the nodes"
run kind load image-archive "$archive" --name "$cluster"

# One release per GPU preset, each pinned to its node by the alias label. Only the first one installs the
# DeviceClasses (cluster-wide objects, shared by both) and runs the controller (two replicas, leader election)
# with its webhook (scenario webhook-refuses-bad-config): one controller per cluster. affinity=null: kind nodes
# carry no GPU labels.
install() {
  local release="$1" alias="$2" preset="$3" classes="$4" controller="$5"
  echo "== helm install $release (fake:$preset on the node labelled e2e.dra.dev/node=$alias)"
  run helm upgrade --install "$release" "$repo/charts/dra-driver" \
    --kubeconfig "$kubeconfig" --namespace "$namespace" --create-namespace \
    --set image.repository="$image_repo" --set image.tag="$image_tag" --set image.pullPolicy=Never \
    --set nvml="fake:$preset" --set migMode=dynamic --set affinity=null \
    --set-string "nodeSelector.e2e\.dra\.dev/node=$alias" \
    --set deviceClasses.enabled="$classes" \
    --set controller.enabled="$controller" --set webhook.enabled="$controller" \
    --wait --timeout 5m
}
install dra-h100 h100 dgx-h100 true true
install dra-a100 a100 dgx-a100 false false

echo "== waiting for both nodes' ResourceSlices"
slice_nodes=(kubectl --kubeconfig "$kubeconfig" get resourceslices -o 'jsonpath={range .items[*]}{.spec.nodeName}{"\n"}{end}')
if [[ "$dry" == 1 ]]; then
  run "${slice_nodes[@]}"
else
  deadline=$((SECONDS + 180))
  until [[ "$("${slice_nodes[@]}" | sort -u | grep -c .)" -ge 2 ]]; do
    if ((SECONDS > deadline)); then
      echo "run.sh: no ResourceSlices from both GPU nodes after 180s; plugin logs:" >&2
      kubectl --kubeconfig "$kubeconfig" -n "$namespace" logs -l app.kubernetes.io/component=kubelet-plugin --tail 50 >&2 || true
      exit 1
    fi
    sleep 3
  done
fi

echo "== running the scenarios"
run "$sandbox" e2e --kubeconfig "$kubeconfig" "$@"
