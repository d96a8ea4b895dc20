"""`python -m dra_sandbox.differential [--mode full|short]`: run the suite on the sandbox and on upstream (cached
binaries; `make upstream` builds them), write both sides' answers as JSON and the results part of
docs/differential.md, and exit 1 when a difference is not in the allow-list (`make test-differential`)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from dra_sandbox.upstream.build import DEFAULT_MINOR

from .compare import differences, explain, load_allow_list, report, write_report
from .suite import run
from .targets import upstream_binaries

REPO_ROOT = Path(__file__).resolve().parents[3]
ALLOW_LIST = REPO_ROOT / "tests" / "differential" / "allowlist.yaml"
DOC = REPO_ROOT / "docs" / "differential.md"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra_sandbox.differential", description=__doc__)
    parser.add_argument("--mode", choices=("short", "full"), default="full")
    parser.add_argument("--kubernetes", default=DEFAULT_MINOR, help="the upstream minor (built and cached)")
    parser.add_argument("--results", type=Path, help="write both sides' answers here (JSON)")
    parser.add_argument("--from-results", type=Path, help="report on an earlier run's JSON instead of running")
    parser.add_argument("--report", type=Path, default=DOC, help="the document whose results part is rewritten")
    parser.add_argument("--no-report", action="store_true", help="print the report instead of writing it")
    parser.add_argument("--allow-list", type=Path, default=ALLOW_LIST)
    args = parser.parse_args(argv)
    allowed = load_allow_list(args.allow_list)
    if args.from_results:
        results = json.loads(args.from_results.read_text())
    else:
        binaries = upstream_binaries(args.kubernetes)
        if binaries is None:
            print(f"differential: Kubernetes {args.kubernetes} is not built here: run `make upstream "
                  f"K8S={args.kubernetes}`", file=sys.stderr)
            return 3
        with tempfile.TemporaryDirectory(prefix="dra-differential-") as work:
            results = run(args.mode, Path(work), binaries, say=lambda line: print(line, file=sys.stderr))
        if args.results:
            args.results.write_text(json.dumps(results, indent=1, sort_keys=True))
    found = differences(results)
    text = report(results, found, allowed)
    if args.no_report:
        print(text)
    else:
        write_report(args.report, text)
        print(f"differential: {len(found)} differences; report in {args.report}")
    unexplained = [d for d in found if explain(d, allowed) is None]
    for d in unexplained:
        print(f"NOT EXPLAINED {d.id}\n  sandbox:  {d.sandbox}\n  upstream: {d.upstream}", file=sys.stderr)
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
