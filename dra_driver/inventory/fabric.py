"""The node's NVLink clique, from its GPUs' fabric info (docs/reference/compute-domains.md "The node's clique").

A GB200/GB300 NVL72 rack is one multi-node NVLink domain: every GPU of its trays registers with the fabric (NVIDIA
Fabric Manager on the NVLink switches) and reports the same cluster UUID and clique id. The node's clique id is
`<clusterUUID>.<cliqueID>`, the value of GPU Feature Discovery's node label `nvidia.com/gpu.clique`, of the
compute-domain plugin's `cliqueID` attribute and of the ComputeDomainClique object names.

The rules are NVIDIA's (their compute-domain plugin's strict clique detection), except that a broken fabric is a
problem to show, never a crash: the plugin keeps serving, and says what is wrong and what to check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from dra_driver.k8s.names import is_label_value
from dra_driver.nvml.types import FabricHealth, FabricInfo, FabricState, GpuInfo

# The node label GPU Feature Discovery sets (and NVIDIA's compute-domain plugin behind a flag); the same name as
# dra_driver.computedomain.names.GPU_CLIQUE_LABEL, which sits a layer above and cannot be imported here.
CLIQUE_LABEL = "nvidia.com/gpu.clique"

_WHAT_TO_CHECK = (
    "check that NVIDIA Fabric Manager (nvidia-fabricmanager) runs and reports no errors, that the rack's NVLink "
    "switch trays are up, and what `nvidia-smi -q` shows under Fabric for these GPUs"
)


@dataclass(frozen=True)
class NodeClique:
    """The node's NVLink clique.

    - `id` set, `problem` None: the node is in clique `id`.
    - both None: the node has no multi-node NVLink fabric (PCIe GPUs, an HGX board, NOT_SUPPORTED).
    - `id` None, `problem` set: the GPUs have a fabric that is not usable now (registration not finished or failed,
      GPUs disagreeing); the node is in no clique until that is fixed.
    - both set: the node is in clique `id`, but a GPU reports a degraded fabric (health UNHEALTHY or
      LIMITED_CAPACITY); multi-node jobs may fail or run slowly.
    """

    id: str | None
    problem: str | None

    @property
    def degraded(self) -> bool:
        return self.id is not None and self.problem is not None


NO_CLIQUE = NodeClique(id=None, problem=None)


class FabricGpu(Protocol):
    """What node_clique reads of a GPU (GpuInventory has both)."""

    @property
    def info(self) -> GpuInfo: ...

    @property
    def fabric(self) -> FabricInfo | None: ...


def node_clique(gpus: Sequence[FabricGpu]) -> NodeClique:
    """The node's clique from every GPU's fabric info.

    Per GPU, in NVIDIA's order: no fabric or state NOT_SUPPORTED -> not in a clique (skipped); state not COMPLETED
    -> a problem (registration pending); COMPLETED with a status other than SUCCESS -> a problem (registration
    failed); a zero cluster UUID -> not in a clique (an NVLink system that is not multi-node). The GPUs left must
    all name one `<clusterUUID>.<cliqueID>`; if they do not, that is a problem too. Every GPU at fault is named."""
    not_ready: list[str] = []
    cliques: dict[str, list[str]] = {}
    unhealthy: list[str] = []
    for gpu in gpus:
        fabric = gpu.fabric
        if fabric is None or fabric.state is FabricState.NOT_SUPPORTED:
            continue
        name = _gpu_name(gpu.info)
        if fabric.state is not FabricState.COMPLETED:
            not_ready.append(f"{name}: registration {fabric.state.name}")
            continue
        if not fabric.registered:
            not_ready.append(f"{name}: registration failed with NVML_ERROR_{fabric.status.name}")
            continue
        if fabric.clique is None:
            continue
        cliques.setdefault(fabric.clique, []).append(name)
        if fabric.health_summary in (FabricHealth.UNHEALTHY, FabricHealth.LIMITED_CAPACITY):
            unhealthy.append(f"{name}: fabric health {fabric.health_summary.name}")
    if not_ready:
        return NodeClique(
            id=None,
            problem=f"NVLink fabric not ready on {len(not_ready)} GPU(s) ({'; '.join(not_ready)}); the node is in "
            f"no clique until every GPU completes registration: {_WHAT_TO_CHECK}",
        )
    if len(cliques) > 1:
        seen = "; ".join(f"{clique} on {', '.join(names)}" for clique, names in sorted(cliques.items()))
        return NodeClique(
            id=None,
            problem=f"the GPUs of this node report different NVLink cliques ({seen}); a node belongs to one clique, "
            f"so it is in none: {_WHAT_TO_CHECK} (a tray wired into two racks, or a stale registration)",
        )
    if not cliques:
        return NO_CLIQUE
    (clique,) = cliques
    if unhealthy:
        return NodeClique(
            id=clique,
            problem=f"NVLink fabric degraded ({'; '.join(unhealthy)}); the node stays in clique {clique} but "
            f"multi-node jobs may fail or run slowly: {_WHAT_TO_CHECK}",
        )
    return NodeClique(id=clique, problem=None)


def _gpu_name(info: GpuInfo) -> str:
    return f"GPU {info.index} ({info.uuid})"


# --- the `nvidia.com/gpu.clique` node label (set by the compute-domain plugin behind its flag) --------------------


def clique_label_value(clique: NodeClique) -> str | None:
    """The label value for this clique, None when the node should not carry the label (no clique, or an unusable
    fabric). A degraded clique keeps its label: the node still is in it."""
    if clique.id is None:
        return None
    if not is_label_value(clique.id):
        # Cannot happen for NVML's values (a 36-character UUID, a dot and at most 10 digits), but a label the API
        # server refuses must never be sent.
        raise ValueError(f"clique id {clique.id!r} is not a valid label value")
    return clique.id


def clique_label_patch(clique: NodeClique, labels: Mapping[str, str] | None) -> dict[str, object] | None:
    """A JSON merge patch (`application/merge-patch+json`) of the Node that makes `nvidia.com/gpu.clique` match the
    clique: set it, change it, or remove it (null) where the node has no usable clique. None when the Node's
    current `labels` already match, so the caller sends nothing."""
    want = clique_label_value(clique)
    have = (labels or {}).get(CLIQUE_LABEL)
    if want == have:
        return None
    return {"metadata": {"labels": {CLIQUE_LABEL: want}}}


def clique_label_removal(labels: Mapping[str, str] | None) -> dict[str, object] | None:
    """The merge patch that removes the label (the plugin's shutdown, as NVIDIA's removes it); None when absent."""
    if CLIQUE_LABEL not in (labels or {}):
        return None
    return {"metadata": {"labels": {CLIQUE_LABEL: None}}}
