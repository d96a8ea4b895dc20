"""The probe: a tiny static program that is the whole container rootfs and prints what it sees.

It is built once with ``gcc -static`` into a cache directory keyed by the source hash, so any machine
with gcc and a static libc can run real containers without an image registry. Output is one record
per line (``ENV``, ``MNT``, ``DEV``, ``GID``, ``FILE``, ``NOFILE``, ``END``; a ``FILE`` carries the file's first
8 KiB without one trailing newline, so a JSON document arrives whole); inside a field ``\\``,
spaces and control characters are escaped (``\\xHH``), so a single space always separates fields.
The pure `parse_probe_output` reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dra_sandbox.runtime.staticbuild import static_binary
from dra_sandbox.runtime.types import ObservedDevice, ObservedMount

PROBE_SOURCE = r"""
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

extern char **environ;

static void put_escaped(const char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\\') fputs("\\\\", stdout);
        else if (c <= 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
}

static void walk_dev(const char *dir, int depth) {
    DIR *d = opendir(dir);
    struct dirent *e;
    if (!d) return;
    while ((e = readdir(d)) != NULL) {
        char path[4096];
        struct stat st;
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (lstat(path, &st) != 0) continue;
        if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
            fputs("DEV ", stdout);
            put_escaped(path);
            printf(" %c %u %u\n", S_ISCHR(st.st_mode) ? 'c' : 'b', major(st.st_rdev), minor(st.st_rdev));
        } else if (S_ISDIR(st.st_mode) && depth < 3) {
            walk_dev(path, depth + 1);
        }
    }
    closedir(d);
}

int main(int argc, char **argv) {
    char line[8192];
    gid_t groups[256];
    FILE *f;
    int i, n;
    for (char **e = environ; *e; e++) { fputs("ENV ", stdout); put_escaped(*e); putchar('\n'); }
    f = fopen("/proc/self/mounts", "r");
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        fputs("MNT ", stdout); put_escaped(line); putchar('\n');
    }
    if (f) fclose(f);
    walk_dev("/dev", 0);
    n = getgroups(256, groups);
    for (i = 0; i < n; i++) printf("GID %u\n", (unsigned)groups[i]);
    for (i = 1; i < argc; i++) {
        f = fopen(argv[i], "r");
        if (!f) { printf("NOFILE "); put_escaped(argv[i]); printf(" %d\n", errno); continue; }
        n = (int)fread(line, 1, sizeof line - 1, f);
        line[n] = 0;
        if (n > 0 && line[n - 1] == '\n') line[n - 1] = 0;
        fclose(f);
        fputs("FILE ", stdout); put_escaped(argv[i]); putchar(' '); put_escaped(line); putchar('\n');
    }
    puts("END");
    return 0;
}
"""

PROBE_NAME = "probe"


def probe_binary(cache_dir: Path, gcc: str = "gcc") -> Path:
    """The cached static probe binary, compiled on first use; StaticBuildError where it cannot be."""
    return static_binary(cache_dir, PROBE_NAME, PROBE_SOURCE, flags=("-O2",), gcc=gcc)


def _unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            if text[i + 1] == "\\":
                out.append("\\")
                i += 2
                continue
            if text[i + 1] == "x" and i + 3 < len(text):
                out.append(chr(int(text[i + 2 : i + 4], 16)))
                i += 4
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def _mount_field(value: str) -> str:
    # /proc/self/mounts escapes space, tab, newline and backslash as octal (\040 ...).
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        value = value.replace(code, char)
    return value


@dataclass(frozen=True)
class ProbeReport:
    env: dict[str, str] = field(default_factory=dict)
    mounts: tuple[ObservedMount, ...] = ()
    devices: tuple[ObservedDevice, ...] = ()
    gids: tuple[int, ...] = ()
    files: dict[str, str | None] = field(default_factory=dict)
    complete: bool = False


def parse_probe_output(text: str) -> ProbeReport:
    """Probe stdout -> ProbeReport. `complete` is False when the END marker is missing (probe died)."""
    env: dict[str, str] = {}
    mounts: list[ObservedMount] = []
    devices: list[ObservedDevice] = []
    gids: list[int] = []
    files: dict[str, str | None] = {}
    complete = False
    for raw in text.splitlines():
        tag, _, rest = raw.partition(" ")
        if tag == "ENV":
            key, _, value = _unescape(rest).partition("=")
            env[key] = value
        elif tag == "MNT":
            parts = _unescape(rest).split(" ")
            if len(parts) >= 4:
                source, target, fstype, options = (_mount_field(p) for p in parts[:4])
                mounts.append(ObservedMount(target, source, fstype, tuple(options.split(","))))
        elif tag == "DEV":
            path, kind, major, minor = rest.split(" ")
            devices.append(ObservedDevice(_unescape(path), kind, int(major), int(minor)))
        elif tag == "GID":
            gids.append(int(rest))
        elif tag == "FILE":
            path, _, content = rest.partition(" ")
            files[_unescape(path)] = _unescape(content)
        elif tag == "NOFILE":
            files[_unescape(rest.partition(" ")[0])] = None
        elif tag == "END":
            complete = True
    return ProbeReport(env, tuple(mounts), tuple(devices), tuple(gids), files, complete)
