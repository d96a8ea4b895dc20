"""Planning a claim: what its allocation asks of this node, before anything is touched.

The ResourceClaim comes from the API server, so every level of it is type-checked; the devices are looked up in
the catalog, their opaque configs resolved, one record built per device, and each effect kind fills in its part
of the records (plugin/effects/). `refuse` is the last line of defence against what other claims hold.
"""

from __future__ import annotations

from collections.abc import Mapping

from dra_driver.claimconfig.resolve import configs_for
from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.k8s.client import JsonObject
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import Checkpoint, PreparedDevice
from dra_driver.plugin.effects.base import ClaimPlan
from dra_driver.plugin.effects.registry import ClaimEffects
from dra_driver.plugin.engineparts import EngineSettings
from dra_driver.resourceapi import DeviceResult, DriverAllocation, InvalidObjectError, parse_resource_claim


def plan_claim(
    settings: EngineSettings,
    effects: ClaimEffects,
    ref: ClaimRef,
    claim: JsonObject | None,
    catalog: Mapping[str, AllocatableDevice],
) -> ClaimPlan:
    """The claim's plan (no devices: nothing of this claim is ours). Raises PrepareError naming the field."""
    ours = our_results(settings, ref, claim)
    devices = tuple(_lookup(settings, catalog, r) for r in ours.results)
    configs = tuple(configs_for(ours.configs, ours.results, lambda r: catalog_type(catalog, r.device)))
    records = tuple(
        PreparedDevice(
            # A firstAvailable result names "<request>/<subrequest>"; containers reference the request.
            request_names=(r.request.split("/", 1)[0],),
            pool=settings.pool_name,
            device=r.device,
            share_id=r.share_id,
            gpu_uuid=d.gpu.uuid,
            request_ref=r.request if "/" in r.request else None,
        )
        for r, d in zip(ours.results, devices, strict=True)
    )
    admin = frozenset(r.device for r in ours.results if r.admin_access)
    plan = ClaimPlan(
        ref, devices, configs, tuple(r.raw for r in ours.results), admin, records, pod_claim_name=ours.pod_claim_name
    )
    return effects.plan(plan)


def refuse(
    plan: ClaimPlan, effects: ClaimEffects, checkpoint: Checkpoint, catalog: Mapping[str, AllocatableDevice]
) -> None:
    _refuse_overlap(plan, checkpoint, catalog)
    effects.refuse(plan, checkpoint, catalog)


def our_results(settings: EngineSettings, ref: ClaimRef, claim: JsonObject | None) -> DriverAllocation:
    """This driver's results of the claim in our pool, with the allocation's configs for the driver, read by the
    one strict ResourceClaim parser (dra_driver/resourceapi): a malformed object fails the claim naming the field
    instead of an internal error."""
    if claim is None:
        raise PrepareError("the ResourceClaim does not exist (deleted?)")
    try:
        parsed = parse_resource_claim(claim)
    except InvalidObjectError as err:
        raise PrepareError(str(err)) from err
    if parsed.uid != ref.uid:
        raise PrepareError(f"the ResourceClaim has UID {parsed.uid}, not {ref.uid}: it was deleted and re-created")
    if parsed.allocation is None:
        raise PrepareError("the ResourceClaim is not allocated")
    return parsed.for_driver(settings.driver_name, settings.pool_name)


def catalog_type(catalog: Mapping[str, AllocatableDevice], name: str) -> str:
    """Which config kind applies to a device (its kind says: `DeviceKind.config_type`); `gpu` for a device the
    catalog does not offer (the lookup refuses it by name)."""
    device = catalog.get(name)
    return device.kind.config_type if device is not None else "gpu"


def _lookup(
    settings: EngineSettings, catalog: Mapping[str, AllocatableDevice], result: DeviceResult
) -> AllocatableDevice:
    name = result.device
    device = catalog.get(name)
    if device is None:
        raise PrepareError(
            f"device {name!r} (request {result.request!r}) is not offered by pool "
            f"{settings.pool_name!r}; the allocation is stale or the GPU disappeared"
        )
    return device


def _refuse_overlap(plan: ClaimPlan, checkpoint: Checkpoint, catalog: Mapping[str, AllocatableDevice]) -> None:
    """A device (or an overlapping MIG partition of the same GPU) already prepared for another claim is refused,
    naming both claims."""
    ref = plan.ref
    # Only a held device of the same name or on one of the same GPUs can collide (`_collides`): one dict lookup per
    # held device sorts the others out before the pairwise check. Not an index kept per checkpoint: every write
    # makes a new checkpoint, so one would be rebuilt for nearly every prepare (O(devices held) either way).
    names = {device.name for device in plan.devices}
    gpus = {device.gpu.uuid for device in plan.devices}
    for other in checkpoint.claims.values():
        if other.uid == ref.uid:
            continue
        for held in (*other.devices, *other.allocated):
            if held.device not in names:
                on = catalog.get(held.device)
                if on is None or on.gpu.uuid not in gpus:
                    continue
            for device in plan.devices:
                if device.name in plan.admin or (held.share_id is not None and device.name == held.device):
                    continue  # another share of the same shared GPU
                if _collides(device, held, catalog):
                    raise PrepareError(
                        f"device {device.name} is already prepared for claim {other.namespace}/{other.name} "
                        f"(uid {other.uid}); refusing to prepare it for {ref.namespace}/{ref.name} (uid {ref.uid})"
                    )


def _collides(device: AllocatableDevice, held: PreparedDevice, catalog: Mapping[str, AllocatableDevice]) -> bool:
    if device.name == held.device:
        return True
    other = catalog.get(held.device)
    if other is None or other.gpu.uuid != device.gpu.uuid:
        return False
    if device.kind.shared or other.kind.shared:
        return True  # shares of a GPU exclude the whole GPU and its partitions
    if device.kind.slot and other.kind is device.kind:
        return False  # two slots of one GPU (vGPUs): the kind's effect judges what they may share (`refuse`)
    if device.placement is None or other.placement is None:
        # A whole GPU collides with any partition of it (only possible with dynamic MIG).
        return device.partitioned and other.partitioned
    return device.placement.overlaps(other.placement)

