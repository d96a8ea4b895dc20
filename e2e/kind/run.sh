#!/usr/bin/env bash
# The e2e scenarios on a real Kubernetes cluster: kind (DRA + CDI), the driver's image and Helm chart with
# fake GPUs (dgx-h100 on the worker labelled h100, dgx-a100 on the one labelled a100), then
# `dra-sandbox e2e --kubeconfig ...`. Needs docker, kind, kubectl and helm on PATH.
#
#   e2e/kind/run.sh                      # everything; deletes the cluster at the end
#   KEEP_CLUSTER=1 e2e/kind/run.sh       # keep it (a second run reuses it)
#   e2e/kind/run.sh --only shared-claim  # extra arguments go to `dra-sandbox e2e`
#
# Environment: CLUSTER_NAME (dra-e2e), KIND_NODE_IMAGE (kindest/node:v1.35.0), IMAGE_REPO (dra-driver),
# IMAGE_TAG (e2e), KEEP_CLUSTER (0), DRA_DRIVER (the dra-driver command that runs the scenarios).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cluster="${CLUSTER_NAME:-dra-e2e}"
node_image="${KIND_NODE_IMAGE:-kindest/node:v1.35.0}"
image_repo="${IMAGE_REPO:-dra-driver}"
image_tag="${IMAGE_TAG:-e2e}"
keep="${KEEP_CLUSTER:-0}"
namespace="dra-driver"
kubeconfig="${TMPDIR:-/tmp}/${cluster}.kubeconfig"
if [[ -z "${DRA_DRIVER:-}" ]]; then
  if [[ -x "$repo/.venv/bin/dra-driver" ]]; then DRA_DRIVER="$repo/.venv/bin/dra-driver"; else DRA_DRIVER="dra-driver"; fi
fi

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null 2>&1 || { echo "run.sh: '$tool' is required but not on PATH" >&2; exit 1; }
done
[[ -f "$repo/Dockerfile" ]] || { echo "run.sh: $repo/Dockerfile is missing" >&2; exit 1; }

echo "== building image ${image_repo}:${image_tag}"
docker build --tag "${image_repo}:${image_tag}" "$repo"

created=0
if kind get clusters 2>/dev/null | grep -qx "$cluster"; then
  echo "== reusing kind cluster $cluster"
  kind get kubeconfig --name "$cluster" >"$kubeconfig"
else
  echo "== creating kind cluster $cluster ($node_image)"
  kind create cluster --name "$cluster" --image "$node_image" --config "$here/cluster.yaml" \
    --kubeconfig "$kubeconfig" --wait 180s
  created=1
fi
cleanup() {
  if [[ "$created" == 1 && "$keep" != 1 ]]; then
    echo "== deleting kind cluster $cluster (KEEP_CLUSTER=1 keeps it)"
    kind delete cluster --name "$cluster" || true
  fi
}
trap cleanup EXIT

echo "== loading the image into the nodes"
kind load docker-image "${image_repo}:${image_tag}" --name "$cluster"

# One release per GPU preset, each pinned to its node by the alias label. Only the first one installs the
# DeviceClasses (cluster-wide objects, shared by both) and runs the controller (two replicas, leader election)
# with its webhook (scenario webhook-refuses-bad-config): one controller per cluster. affinity=null: kind nodes
# carry no GPU labels.
install() {
  local release="$1" alias="$2" preset="$3" classes="$4" controller="$5"
  echo "== helm install $release (fake:$preset on the node labelled e2e.dra.dev/node=$alias)"
  helm upgrade --install "$release" "$repo/charts/dra-driver" \
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
deadline=$((SECONDS + 180))
until [[ "$(kubectl --kubeconfig "$kubeconfig" get resourceslices \
  -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | sort -u | grep -c .)" -ge 2 ]]; do
  if ((SECONDS > deadline)); then
    echo "run.sh: no ResourceSlices from both GPU nodes after 180s; plugin logs:" >&2
    kubectl --kubeconfig "$kubeconfig" -n "$namespace" logs -l app.kubernetes.io/component=kubelet-plugin --tail 50 >&2 || true
    exit 1
  fi
  sleep 3
done

echo "== running the scenarios"
"$DRA_DRIVER" e2e --kubeconfig "$kubeconfig" "$@"
