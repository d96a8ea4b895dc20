"""apply_edits: the CDI library's merge rules on a container config."""

from __future__ import annotations

from dra_driver.cdi import ContainerEdits, DeviceNode, Hook, IntelRdt, Mount, NetDevice
from dra_sandbox.runtime.cdi import ContainerConfig, apply_edits


def test_env_replaces_same_name_and_appends_new() -> None:
    config = ContainerConfig(env=("PATH=/bin", "A=old"))
    out = apply_edits(config, ContainerEdits(env=("A=new", "B=1")))
    assert out.env == ("PATH=/bin", "A=new", "B=1")
    assert out.env_map() == {"PATH": "/bin", "A": "new", "B": "1"}


def test_mounts_replace_by_container_path_and_sort_by_depth() -> None:
    config = ContainerConfig(mounts=(Mount("/old", "/data/x"), Mount("/etc", "/etc")))
    out = apply_edits(config, ContainerEdits(mounts=(Mount("/new", "/data/x/"), Mount("/d", "/data"))))
    assert [(m.host_path, m.container_path) for m in out.mounts] == [
        ("/etc", "/etc"),
        ("/d", "/data"),
        ("/new", "/data/x/"),
    ]


def test_device_nodes_defaults_and_replacement() -> None:
    config = ContainerConfig(device_nodes=(DeviceNode("/dev/gpu0", host_path="/dev/old"),))
    out = apply_edits(
        config,
        ContainerEdits(device_nodes=(DeviceNode("/dev/gpu0"), DeviceNode("/dev/ctl", permissions="none"))),
    )
    assert out.device_nodes == (
        DeviceNode("/dev/gpu0", host_path="/dev/gpu0", permissions="rwm"),
        DeviceNode("/dev/ctl", host_path="/dev/ctl", permissions=""),
    )


def test_gids_hooks_rdt_netdevices() -> None:
    config = ContainerConfig(additional_gids=(5,), hooks=(Hook("prestart", "/a"),), intel_rdt=IntelRdt(clos_id="x"))
    out = apply_edits(
        config,
        ContainerEdits(
            additional_gids=(0, 5, 7),
            hooks=(Hook("poststop", "/b"),),
            intel_rdt=IntelRdt(clos_id="y"),
            net_devices=(NetDevice("eth1", "net0"),),
        ),
    )
    assert out.additional_gids == (5, 7)
    assert [h.path for h in out.hooks] == ["/a", "/b"]
    assert out.intel_rdt == IntelRdt(clos_id="y")
    assert out.net_devices == (NetDevice("eth1", "net0"),)
    # Applying nothing changes nothing.
    assert apply_edits(out, ContainerEdits()) == out
