"""A kubelet plugin whose socket would not fit the kernel's 107-byte unix socket path exits with ONE line naming the
flag (`--plugin-dir` or `--registry-dir`) and the limit, never a traceback (as for a taken port)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.kubeletplugin.server import SocketPaths
from dra_driver.kubeletplugin.sockets import SocketPathError, claim_socket_path
from tests.plugin.test_taken_ports import _plugin, kubeconfig  # noqa: F401  # the fixture is used by name

DRIVER = "gpu.dra.dev"


def _long_dir(base: Path, total: int) -> Path:
    """A directory path of `total` bytes under `base` (not created)."""
    return base / ("d" * (total - len(str(base)) - 1))


@pytest.mark.parametrize("flag", ["--plugin-dir", "--registry-dir"])
def test_the_plugin_refuses_a_socket_path_over_the_limit_in_one_line(tmp_path: Path, kubeconfig: Path,  # noqa: F811
                                                                     flag: str) -> None:
    directory = _long_dir(tmp_path, 100)
    done = _plugin(tmp_path, kubeconfig, flag, str(directory), "--healthz-port", "-1", "--metrics-port", "-1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if "unix socket limit" in line]
    assert lines == [line for line in done.stderr.splitlines() if "cannot start" in line]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"dra-driver kubelet-plugin: cannot start: {flag} {directory}: socket ")
    assert lines[0].endswith("-byte path, over the unix socket limit of 107 bytes; choose a shorter directory")
    assert not list(tmp_path.rglob("*.sock"))  # nothing was served


def test_socket_paths_at_the_limit_fit_and_one_byte_more_does_not(tmp_path: Path) -> None:
    name = f"{DRIVER}-reg.sock"
    fits = _long_dir(Path("/r"), 107 - len(name) - 1)
    paths = SocketPaths.for_instance(fits, Path("/p"), DRIVER, None)
    assert len(str(paths.registration).encode()) == 107
    with pytest.raises(SocketPathError, match=r"^--registry-dir /r/d+: socket gpu.dra.dev-reg.sock would make a "
                                              r"108-byte path, over the unix socket limit of 107 bytes"):
        SocketPaths.for_instance(Path(str(fits) + "d"), Path("/p"), DRIVER, None)
    with pytest.raises(SocketPathError, match=r"^--plugin-dir /p/d+: socket dra-u1.sock would make"):
        SocketPaths.for_instance(Path("/r"), _long_dir(Path("/p"), 100), DRIVER, "u1")
    # Neither a real pod UID's name nor its hashed one (`dra-<6 characters>.sock`) fits: the error names the shorter.
    with pytest.raises(SocketPathError, match=r"^--plugin-dir /p/d+: socket dra-[A-Za-z0-9_-]{6}\.sock would make a "
                                              r"116-byte path"):
        SocketPaths.for_instance(Path("/r"), _long_dir(Path("/p"), 100), DRIVER, "0b6f2a56-3c4e-4b8a-9a51-4f6f0c1d2e3f")
    with pytest.raises(SocketPathError, match="over the unix socket limit of 107 bytes"):
        claim_socket_path(_long_dir(tmp_path, 110) / "x.sock")
