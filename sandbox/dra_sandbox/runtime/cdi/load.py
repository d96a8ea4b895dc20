"""Reading one CDI spec from text or a file: strict decode, then validate."""

from __future__ import annotations

from pathlib import Path

from dra_driver.cdi.errors import CdiError
from dra_driver.cdi.model import Spec
from dra_driver.cdi.validate import validate_spec
from dra_driver.strictdecode import Problem
from dra_sandbox.runtime.cdi.decode import decode_spec, parse_text

SPEC_EXTENSIONS = (".json", ".yaml")
MAX_SPEC_BYTES = 4 * 1024 * 1024  # far above any real spec; stops a stray huge file from being parsed


def load_spec(text: str | bytes, fmt: str | None = None) -> Spec:
    """JSON/YAML text -> a validated Spec, or CdiError naming the offending field."""
    spec = decode_spec(parse_text(text, fmt))
    validate_spec(spec)
    return spec


def format_for(path: Path) -> str:
    if path.suffix == ".json":
        return "json"
    if path.suffix == ".yaml":
        return "yaml"
    raise CdiError("", f"{path.name}: CDI spec files must end in .json or .yaml")


def load_spec_file(path: Path) -> Spec:
    """Read and validate one spec file; errors are prefixed with the file path."""
    try:
        fmt = format_for(path)
        if path.stat().st_size > MAX_SPEC_BYTES:
            raise CdiError("", f"file is larger than {MAX_SPEC_BYTES} bytes")
        return load_spec(path.read_bytes(), fmt)
    except CdiError as exc:
        named = [Problem(str(path) + (f": {p.path}" if p.path else ""), p.message) for p in exc.problems]
        raise CdiError.of(named) from None
    except OSError as exc:
        raise CdiError(str(path), f"cannot read: {exc.strerror or exc}") from None
