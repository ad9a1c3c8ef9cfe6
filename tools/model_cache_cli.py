"""What tools/zoo.py and tools/corpus.py share: the `list | fetch [NAME ...] | path NAME` command line over a cache
of models outside the repository, and the plain-text table `list` prints."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from trtopt.errors import TrtoptError


def aligned(rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, a rule under the header row."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_command_line(
    argv: Sequence[str] | None,
    *,
    description: str,
    tool: str,
    list_table: Callable[[], str],
    fetch: Callable[[Sequence[str] | None], object],
    cached_path: Callable[[str], Path | None],
    errors: tuple[type[Exception], ...] = (),
) -> int:
    """`list`, `fetch [NAME ...]` (all when no name is given) or `path NAME` (exit 1 when not cached); an error of
    `errors` or a `TrtoptError` becomes one line on stderr and its exit code."""
    parser = argparse.ArgumentParser(description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the catalog and what is cached")
    f = sub.add_parser("fetch", help="fetch (or make) and cache models, all when no name is given")
    f.add_argument("names", nargs="*", metavar="NAME")
    p = sub.add_parser("path", help="print the cached model's path (exit 1 when not cached)")
    p.add_argument("name")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            print(list_table())
        elif args.command == "fetch":
            fetch(args.names or None)
        else:
            path = cached_path(args.name)
            if path is None:
                print(f"{args.name} is not cached: run python {tool} fetch {args.name}", file=sys.stderr)
                return 1
            print(path)
    except (TrtoptError, *errors) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 1)
    return 0
