"""pytest plugin: `--dist loadgroup` keeps each `xdist_group` on one worker again under pytest 9.2.

pytest-xdist 3.8.0 tells its controller a test's group by appending `@<group>` to the test's node id on the worker
(remote.py, `item._nodeid = ...`). pytest 9.2 keeps a node's id in a structured `NodeId` (`item._id`; `nodeid` is
`str(item._id)`), so that assignment no longer changes anything: every group mark is silently ignored and
loadgroup schedules like plain `load` (pytest-dev/pytest-xdist#1386, open, with the fix pytest-dev/pytest-xdist#1388
not released). For this suite that meant the upstream tests (`xdist_group("upstream")`: one control plane and real
node at a time) ran on both workers at once: two real kubelets on the machine share the device manager's
`/var/lib/kubelet/device-plugins/kubelet.sock`, which upstream hard-codes whatever the kubelet's --root-dir
(deviceplugin/v1beta1 KubeletSocket), and the second one's start removed the first one's sockets there, so the
first node lost its device plugin (docs/device-plugin.md "Tests").

On a worker with loadgroup, after xdist's own hook, each test with `xdist_group` marks gets the same `@<names>`
suffix xdist means to give it (the names sorted and joined by `_`, as remote.py does), unless it has it already (an
xdist or a pytest where the old assignment works), so the controller's LoadGroupScheduling sees the groups.
"""

from __future__ import annotations

import pytest
from _pytest.nodeid import NodeId


def group_suffix(item: pytest.Item) -> str:
    """`@<names>` for the item's xdist_group marks ('' without any), as pytest-xdist's remote.py builds it."""
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return "@" + "_".join(sorted(names)) if names else ""


@pytest.hookimpl(trylast=True)  # after tests/conftest.py's hook adds the module groups, and after xdist's own
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput") or not config.getvalue("loadgroup"):
        return
    for item in items:
        suffix = group_suffix(item)
        if suffix and not item.nodeid.endswith(suffix) and isinstance(getattr(item, "_id", None), NodeId):
            item._id = NodeId.parse(item.nodeid + suffix)
