"""Applying CDI container edits to a container's configuration, the way the CDI library does.

`ContainerConfig` is the small slice of an OCI runtime spec that CDI touches. The rules:
environment entries replace an existing variable of the same name; a device node replaces one at the
same container path; a mount replaces one at the same container path and mounts are then ordered by
path depth (parents before children); hooks append; additional GIDs are added once and 0 is ignored;
intelRdt is replaced; network devices replace one with the same container name.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dra_driver.cdi.model import ContainerEdits, DeviceNode, Hook, IntelRdt, Mount, NetDevice


@dataclass(frozen=True)
class ContainerConfig:
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()
    additional_gids: tuple[int, ...] = ()
    intel_rdt: IntelRdt | None = None
    net_devices: tuple[NetDevice, ...] = ()

    def env_map(self) -> dict[str, str]:
        return dict(entry.split("=", 1) for entry in self.env if "=" in entry)


def _mount_depth(mount: Mount) -> int:
    parts = [p for p in mount.container_path.split("/") if p and p != "."]
    return len(parts)


def _with_node_defaults(node: DeviceNode) -> DeviceNode:
    # hostPath defaults to path; permissions default to rwm ("none" means no access).
    return replace(
        node,
        host_path=node.host_path or node.path,
        permissions="rwm" if node.permissions is None else ("" if node.permissions == "none" else node.permissions),
    )


def apply_edits(config: ContainerConfig, edits: ContainerEdits) -> ContainerConfig:
    env = list(config.env)
    for entry in edits.env:
        key = entry.split("=", 1)[0]
        env = [e for e in env if e.split("=", 1)[0] != key]
        env.append(entry)

    nodes = list(config.device_nodes)
    for node in edits.device_nodes:
        nodes = [n for n in nodes if n.path != node.path]
        nodes.append(_with_node_defaults(node))

    mounts = list(config.mounts)
    for mount in edits.mounts:
        mounts = [m for m in mounts if m.container_path.rstrip("/") != mount.container_path.rstrip("/")]
        mounts.append(mount)
    mounts.sort(key=_mount_depth)  # stable: equal depths keep their order

    gids = list(config.additional_gids)
    for gid in edits.additional_gids:
        if gid != 0 and gid not in gids:
            gids.append(gid)

    nets = list(config.net_devices)
    for dev in edits.net_devices:
        nets = [d for d in nets if d.name != dev.name]
        nets.append(dev)

    return ContainerConfig(
        env=tuple(env),
        device_nodes=tuple(nodes),
        mounts=tuple(mounts),
        hooks=config.hooks + edits.hooks,
        additional_gids=tuple(gids),
        intel_rdt=edits.intel_rdt if edits.intel_rdt is not None else config.intel_rdt,
        net_devices=tuple(nets),
    )
