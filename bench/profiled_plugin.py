"""`dra-driver kubelet-plugin` under cProfile, every thread on its CPU clock: what the real plugin process spends
its CPU on (bench-only; the product has no profiling hook). The merged stats go to `$BENCH_PROFILE_OUT` when the
plugin exits (SIGTERM). Used by `bench.prepare_profile --process`.

    BENCH_PROFILE_OUT=/tmp/plugin.prof python -m bench.profiled_plugin     (flags as DRA_DRIVER_* env)
"""

from __future__ import annotations

import cProfile
import io
import os
import time
from pathlib import Path

from bench.prepare_profile import ThreadProfiles
from dra_driver import cli


def main() -> int:
    profiles = ThreadProfiles()
    profiles.every_new_thread()
    # SIGUSR1 from bench.prepare_profile: count only from here (start-up and warm-up claims left out).
    profiles.mark_on_signal(Path(os.environ["BENCH_PROFILE_OUT"] + ".marked"))
    main_thread = cProfile.Profile(time.thread_time)
    profiles.profiles.append(main_thread)
    main_thread.enable()
    try:
        return cli.main(["kubelet-plugin"])
    finally:
        main_thread.disable()
        profiles.merged(io.StringIO()).dump_stats(os.environ["BENCH_PROFILE_OUT"])


if __name__ == "__main__":
    raise SystemExit(main())
