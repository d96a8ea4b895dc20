"""Plain-text tables for terminals: aligned columns, cells of one or several lines. Pure."""

from __future__ import annotations

from collections.abc import Sequence

Cell = str | Sequence[str]


def _lines(cell: Cell) -> list[str]:
    if isinstance(cell, str):
        return cell.splitlines() or [""]
    return [str(line) for line in cell] or [""]


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Cell]], indent: str = "", gap: str = "  ") -> str:
    """Headers, then each row; a cell given as a list takes one line per item. No trailing spaces."""
    for i, row in enumerate(rows):
        if len(row) != len(headers):
            raise ValueError(f"row {i} has {len(row)} cells, the table has {len(headers)} columns")
    split = [[_lines(cell) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in split:
        for col, lines in enumerate(row):
            widths[col] = max(widths[col], *(len(line) for line in lines))

    def line(cells: Sequence[str]) -> str:
        return (indent + gap.join(c.ljust(w) for c, w in zip(cells, widths, strict=True))).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    for row in split:
        height = max(len(lines) for lines in row)
        for n in range(height):
            out.append(line([lines[n] if n < len(lines) else "" for lines in row]))
    return "\n".join(out)


def shorten_id(text: str, keep: int = 8) -> str:
    """`GPU-f5410d5c-b860-...` -> `GPU-f5410d5c…`; CDI ids keep their device suffix:
    `k8s.gpu.dra.dev/claim=3250a72f-8345-...-gpu-0` -> `k8s.gpu.dra.dev/claim=3250a72f…-gpu-0`."""
    prefix, sep, rest = text.partition("=")
    if sep:  # a CDI id: <kind>=<claim uid>-<device>; the uid is 36 characters
        uid, device = rest[:36], rest[36:]
        if len(uid) == 36 and uid.count("-") == 4:
            return f"{prefix}={uid[:keep]}…{device}"
        return text
    kind, dash, uuid = text.partition("-")
    if dash and kind in ("GPU", "MIG") and len(uuid) > keep:
        return f"{kind}-{uuid[:keep]}…"
    return text
