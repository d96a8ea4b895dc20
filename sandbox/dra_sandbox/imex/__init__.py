"""Stand-ins for NVIDIA's `nvidia-imex` and `nvidia-imex-ctl`, so the IMEX daemon runner (`dra-driver
compute-domain-daemon`) runs in tests, the sandbox and the crash campaign without IMEX or a fabric
(docs/sandbox.md, "IMEX stand-ins"; the behaviour is in `standin.py`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final

IMEX: Final = "nvidia-imex"
IMEX_CTL: Final = "nvidia-imex-ctl"
_ENTRY: Final = {IMEX: "imex_main", IMEX_CTL: "ctl_main"}


def install_standins(bin_dir: Path | str) -> None:
    """Write executable `nvidia-imex` and `nvidia-imex-ctl` into `bin_dir` (created if missing), run by this
    interpreter (`#!<sys.executable> -IS`), so that putting `bin_dir` first on PATH (or passing it as
    --imex-bin-dir) gives the runner the stand-ins. Each script is standin.py itself (standard library only) and
    starts isolated and without site-packages: the runner runs the control tool every few seconds per daemon,
    and a bare interpreter starts in a fraction of the time."""
    directory = Path(bin_dir)
    directory.mkdir(parents=True, exist_ok=True)
    source = (Path(__file__).parent / "standin.py").read_text()
    for name, entry in _ENTRY.items():
        script = directory / name
        script.write_text(f"#!{sys.executable} -IS\n{source}\n\nif __name__ == '__main__':\n"
                          f"    sys.exit({entry}(sys.argv[1:]))\n")
        script.chmod(0o755)
