"""What importing the kubelet plugin loads: it runs on every GPU node, so it stays free of the allocator's CEL
engine (celpy, lark) and of the sandbox's web server (aiohttp), whatever the shared decoding layer needs."""

from __future__ import annotations

import subprocess
import sys


def test_the_plugin_does_not_load_cel_or_aiohttp() -> None:
    code = "import sys, dra_driver.plugin.app; print(*sorted(m for m in ('aiohttp', 'celpy', 'lark') if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == []
