"""``python -m rlvr.diagnostics diagnose RUN_DIR_OR_RECORD [--json]`` / ``report RUN_DIR``.

The same two commands as ``rlvr diagnose`` and ``rlvr report``, usable without the CLI (and before
it is installed): the exit code of ``diagnose`` is 0 quiet, 1 a monitor fired, 2 unreadable, 3 the
run cannot learn.
"""

from __future__ import annotations

import argparse
import sys

from rlvr.diagnostics.diagnose import diagnose
from rlvr.diagnostics.report import write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlvr.diagnostics")
    commands = parser.add_subparsers(dest="command", required=True)
    d = commands.add_parser("diagnose", help="group-outcome table and monitor warnings of a run")
    d.add_argument("path", help="run folder or rollouts.jsonl.gz")
    d.add_argument("--json", action="store_true", help="print JSON instead of a table")
    r = commands.add_parser("report", help="write RUN_DIR/report.html")
    r.add_argument("run_dir")
    args = parser.parse_args(argv)
    if args.command == "diagnose":
        return diagnose(args.path, as_json=args.json)
    try:
        print(write_report(args.run_dir))
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
